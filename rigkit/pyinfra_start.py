"""pyinfra's command line with a shorter start: `python -m rigkit.pyinfra_start ARGS` = `pyinfra ARGS`.

`rigkit deploy`, `verify`, `status` and `rollout` run pyinfra through this module. A converged
deploy is mostly pyinfra starting up, and two parts of that start repeat work whose answer
cannot change while one command runs (docs/performance.md, measured there):

- **Entry-point scans.** `pyinfra_cli` calls gevent's `monkey.patch_all()` first thing, which
  announces each patched module to plugins: a dozen `importlib.metadata.entry_points(group=...)`
  calls, each one reading the entry points of every installed distribution. pyinfra (its
  connectors) and pydantic (its plugins) scan again later. Nothing is installed into the
  controller's environment while a deploy runs, so each group's answer is read once here.
- **invoke.** paramiko imports invoke (~0.1 s) for one thing only: running the command of a
  `Match exec` block in an OpenSSH config file. Here `import invoke` gives a stand-in that
  loads the real module the first time anything reads from it, so `Match exec` still works.

Everything else is pyinfra's own CLI, unchanged: the same arguments, output and exit codes.
Run `pyinfra` directly and the deploy is the same, only slower to start.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import sys
import types
from typing import Any


def read_entry_points_once() -> None:
    """Answer repeated `importlib.metadata.entry_points(...)` calls from memory (idempotent)."""
    original = importlib.metadata.entry_points
    if getattr(original, "rigkit_read_once", False):
        return
    answers: dict[tuple, Any] = {}

    def entry_points(**params: Any) -> Any:
        key = tuple(sorted(params.items()))
        if key not in answers:
            answers[key] = original(**params)  # EntryPoints is an immutable tuple: safe to share
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


def main(argv: list[str] | None = None) -> None:
    read_entry_points_once()
    import_on_first_use("invoke")
    from pyinfra_cli.main import main as pyinfra_main  # gevent's patch_all() runs here, as in `pyinfra`

    sys.argv = ["pyinfra", *(sys.argv[1:] if argv is None else argv)]
    pyinfra_main()


if __name__ == "__main__":
    main()
