"""pyinfra's command line with a shorter start: `python -m rigkit.plumbing.pyinfra_start ARGS` = `pyinfra ARGS`.

`rigkit deploy`, `verify`, `status` and `rollout` run pyinfra through this module. A converged
deploy is mostly pyinfra starting up, and two parts of that start repeat work whose answer
cannot change while one command runs (docs/performance.md, measured there):

- **Entry-point scans.** `pyinfra_cli` calls gevent's `monkey.patch_all()` first thing, which
  announces each patched module to plugins: a dozen `importlib.metadata.entry_points(group=...)`
  calls over five groups, each one reading the entry points of every installed distribution.
  typeguard, pyinfra (its connectors) and pydantic (its plugins) scan for their own groups
  later. Nothing is installed into the controller's environment while a deploy runs, so the
  installed distributions are scanned once, for all groups, and each call is answered from it.
- **invoke.** paramiko imports invoke (~0.1 s) for one thing only: running the command of a
  `Match exec` block in an OpenSSH config file. Here `import invoke` gives a stand-in that
  loads the real module the first time anything reads from it, so `Match exec` still works.

Everything else is pyinfra's own CLI, unchanged: the same arguments and output, and its exit
codes but one: a run interrupted by Ctrl-C exits 130 (pyinfra's own handler exits 0, or 1
with a traceback when its disconnect after the interrupt fails). Run
`pyinfra` directly and the deploy is the same, only slower to start.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import signal
import sys
import types
from typing import Any


def read_entry_points_once() -> None:
    """Answer repeated `importlib.metadata.entry_points(...)` calls from memory (idempotent)."""
    original = importlib.metadata.entry_points
    if getattr(original, "rigkit_read_once", False):
        return
    answers: dict[tuple, Any] = {}
    every: list[Any] = []  # all groups' entry points, from one scan

    def entry_points(**params: Any) -> Any:
        key = tuple(sorted(params.items()))
        if key not in answers:
            # One scan of the installed distributions for every group asked (eight here, ~7 ms
            # each): entry_points(**params) is entry_points().select(**params) by definition.
            if not every:
                every.append(original())
            answers[key] = every[0].select(**params) if params else every[0]  # immutable: safe to share
        return answers[key]

    entry_points.rigkit_read_once = True  # type: ignore[attr-defined]
    importlib.metadata.entry_points = entry_points


class _LoadedOnFirstUse(types.ModuleType):
    """Stands in sys.modules for a module until something reads from it. (LazyLoader cannot be
    used: on Python 3.11 `import x` itself reads `x.__spec__`, which loads a lazy module.)"""

    def __getattr__(self, attribute: str) -> Any:  # only called for names the stand-in lacks
        if sys.modules.get(self.__name__) is self:
            del sys.modules[self.__name__]
        module = importlib.import_module(self.__name__)
        return getattr(module, attribute)


def import_on_first_use(name: str) -> None:
    """Make `import name` free; the module loads when its first attribute is read. No-op if it
    is already imported or not installed."""
    if name in sys.modules or importlib.util.find_spec(name) is None:
        return
    sys.modules[name] = _LoadedOnFirstUse(name)


INTERRUPTED_EXIT = 130  # as a shell reports a command ended by Ctrl-C


def main(argv: list[str] | None = None) -> None:
    read_entry_points_once()
    import_on_first_use("invoke")
    from pyinfra_cli.main import main as pyinfra_main  # gevent's patch_all() runs here, as in `pyinfra`

    # paramiko (imported above) keeps its stand-in; anything else importing invoke gets the real one.
    if isinstance(sys.modules.get("invoke"), _LoadedOnFirstUse):
        del sys.modules["invoke"]
    _name_connect_waits()
    _name_lost_connections()
    sys.argv = ["pyinfra", *(sys.argv[1:] if argv is None else argv)]
    interrupted = _noting_interrupts()
    try:
        pyinfra_main()
    except SystemExit as done:
        # pyinfra's Ctrl-C handler exits 0: `rigkit deploy && next-step` would go on after an
        # interrupted deploy. An interrupted run exits 130.
        if interrupted and not done.code:
            raise SystemExit(INTERRUPTED_EXIT) from None
        raise
    except BaseException:
        # After Ctrl-C, pyinfra's `finally` disconnects through its greenlet pool, which can find
        # nothing left to run: gevent's LoopExit ("This operation would block forever"), a
        # traceback and exit 1, seen once in a full test run. The user asked to stop; what
        # failed was the stopping. Exit 130 without the traceback.
        if interrupted:
            raise SystemExit(INTERRUPTED_EXIT) from None
        raise
    finally:
        signal.signal = _original_signal


_original_signal = signal.signal


def _name_connect_waits() -> None:
    """A port that accepts TCP but never sends an SSH banner: pyinfra says "SSH error (No existing
    session)" after CONNECT_TIMEOUT, and paramiko's thread logs a traceback. Say which wait ran out
    instead, in pyinfra's one line, and keep paramiko's traceback off stderr."""
    import pyinfra.connectors.ssh as ssh_connector

    from rigkit.plumbing.ssh import named_connect_error, quiet_paramiko

    quiet_paramiko()
    original = ssh_connector.raise_connect_error
    if getattr(original, "rigkit", False):
        return

    def raise_connect_error(host, message, data):
        from rigkit.config.inventory import ssh_address

        timeout_s = getattr(getattr(host.state, "config", None), "CONNECT_TIMEOUT", 10)
        named = named_connect_error(ssh_address(host), timeout_s, data)
        if named:
            from pyinfra.api.exceptions import ConnectError

            raise ConnectError(named)
        return original(host, message, data)

    raise_connect_error.rigkit = True
    ssh_connector.raise_connect_error = raise_connect_error


def _name_lost_connections() -> None:
    """A rig that reboots (or a network that drops) while a command runs: pyinfra reports the
    operation as "executed 0 commands" with no output, then "No hosts remaining!". Where the command
    failed because the SSH connection is gone, say so on the host's line."""
    import pyinfra.connectors.ssh as ssh_connector
    from pyinfra import logger

    from rigkit.plumbing.ssh import LOST_CONNECTION_ERRORS, lost_connection_text

    original = ssh_connector.SSHConnector.run_shell_command
    if getattr(original, "rigkit", False):
        return

    def run_shell_command(self, *args, **kwargs):
        try:
            result = original(self, *args, **kwargs)
        except LOST_CONNECTION_ERRORS as exc:
            logger.error(f"{self.host.print_prefix}{lost_connection_text(exc)}")
            raise
        transport = self.client.get_transport() if getattr(self, "client", None) else None
        if not result[0] and (transport is None or not transport.is_active()):
            logger.error(f"{self.host.print_prefix}{lost_connection_text(None)}")
        return result

    run_shell_command.rigkit = True
    ssh_connector.SSHConnector.run_shell_command = run_shell_command


def _noting_interrupts() -> list[bool]:
    """Wrap the SIGINT handler pyinfra installs so that its running is noted in the list returned."""
    noted: list[bool] = []

    def install(signum, handler):
        if signum == signal.SIGINT and callable(handler):
            pyinfra_handler = handler

            def handler(received, frame):
                noted.append(True)
                return pyinfra_handler(received, frame)
        return _original_signal(signum, handler)

    signal.signal = install
    return noted


if __name__ == "__main__":
    main()
