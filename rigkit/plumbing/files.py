"""Put rigkit's files on a Linux rig in few round trips: one fact reads the state of every
file a role manages, in one command; `put` compares against it.

pyinfra's `files.put` reads three facts per file (the folder, the file, its SHA-1), each a
command and a round trip: 30 round trips for the demo rig's 10 files, before anything is
known to differ. `put` takes the role's whole list of paths (`batch`): one `FileStates`
question per role, and read ahead, every role's questions are one command (rigkit.plumbing.facts_once).
Under `--diff` it shows what changes, as files.put does; secrets go through
rigkit.plumbing.private_file instead, which never shows them.
"""

from __future__ import annotations

import hashlib
import shlex
from io import BytesIO
from pathlib import PurePosixPath

from pyinfra import host, logger
from pyinfra.api import FactBase, FileUploadCommand, operation
from pyinfra.facts.files import FileContents
from pyinfra.operations.util.files import generate_color_diff

from rigkit.plumbing.facts_once import read_once


class FileStates(FactBase):
    """{path: {"mode": "644", "owner": "root:root", "sha256": hex}} for every path that is a regular file on the rig,
    in one command of three processes whatever the number of files (a `stat` and a
    `sha256sum` per file cost the rig two process starts each)."""

    merged_over = "paths"  # read ahead, the roles' path lists are read as one (rigkit.plumbing.facts_once)

    @staticmethod
    def default() -> dict:
        return {}  # pyinfra answers an empty output with default(): nothing found

    def command(self, paths: tuple[str, ...]) -> str:
        quoted = " ".join(shlex.quote(p) for p in paths)
        return (f"for p in {quoted}; do [ -f \"$p\" ] && set -- \"$@\" \"$p\"; done; "
                '[ $# -eq 0 ] || { stat -c "mode %a %U:%G %n" -- "$@"; sha256sum -- "$@"; }; exit 0')

    def process(self, output) -> dict:
        modes, owners, digests = {}, {}, {}
        for line in output:
            if line.startswith("mode "):
                _, mode, owner, path = line.split(" ", 3)
                modes[path], owners[path] = mode, owner
            elif "  " in line:
                digest, path = line.split("  ", 1)
                digests[path] = digest
        # A path absent from the answer is absent from the rig: callers ask with .get(path).
        return {path: {"mode": mode, "owner": owners[path], "sha256": digests[path]}
                for path, mode in modes.items() if path in digests}


@operation()
def put(dest: str, data: str | bytes, mode: str = "644", batch: tuple[str, ...] = ()):
    """Put `data` at `dest` with `mode` unless it is there already. `batch`: every path the role
    puts (the same tuple for each call), read in one command; `dest` must be among them."""
    data = data.encode() if isinstance(data, str) else data
    state = read_once(FileStates, paths=tuple(batch) or (dest,)).get(dest)
    # This body can run twice: while planning, when rigkit.plumbing.systemd_units asks whether the put will
    # change, and when pyinfra executes it. What it tells the user, it tells once.
    first_time = _first_time(dest)
    commands = list(_put_commands(dest, data, mode, state, first_time))
    if not commands and first_time:
        host.noop(f"{dest} is up to date")
    yield from commands


@operation()
def put_all(files: dict[str, bytes], mode: str = "644"):
    """Put each of `files` ({dest: data}) with `mode` unless it is there already: one operation for
    files shipped as one thing (a package), so a converged deploy pays pyinfra's per-operation cost
    once, not per file. Their states are read in one command, as put's batch."""
    states = read_once(FileStates, paths=tuple(files))
    first_time = _first_time("put_all:" + ",".join(files))
    commands = [c for dest, data in files.items() for c in _put_commands(dest, data, mode, states.get(dest), first_time)]
    if not commands and first_time:
        host.noop(f"{len(files)} files up to date")
    yield from commands


def _put_commands(dest: str, data: bytes, mode: str, state: dict | None, first_time: bool):
    """The commands that make `dest` hold `data` with `mode`, given its state on the rig (none when it is so)."""
    same_content = state is not None and state["sha256"] == hashlib.sha256(data).hexdigest()
    if same_content and state["mode"] == mode.lstrip("0"):
        return
    if not same_content:
        if host.state.config.DIFF and first_time:
            _show_diff(dest, state, data)
        yield f"mkdir -p {shlex.quote(str(PurePosixPath(dest).parent))}"
        yield FileUploadCommand(BytesIO(data), dest, remote_temp_filename=host.get_temp_filename(dest))
    yield f"chmod {shlex.quote(mode)} {shlex.quote(dest)}"


_told: set[tuple[int, str, str]] = set()  # (run, host, dest) already reported


def _first_time(dest: str) -> bool:
    key = (id(host.state), host.name, dest)
    if key in _told:
        return False
    _told.add(key)
    return True


def _show_diff(dest: str, state: dict | None, data: bytes) -> None:
    current = [line + "\n" for line in host.get_fact(FileContents, path=dest) or []] if state else []
    try:
        wanted = data.decode().splitlines(keepends=True)
    except UnicodeDecodeError:
        logger.info(f"    {dest}: binary file")
        return
    host.log(f"Will {'modify' if state else 'create'} {dest}", logger.info)
    for line in generate_color_diff(current, wanted):
        logger.info(f"  {line}")
