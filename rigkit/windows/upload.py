"""A file put on a Windows rig: always to a temporary name beside its destination, then moved into
place in one step, so nothing on the rig (the SYSTEM watchdog starts its script every minute, a logon
task its own) ever runs or reads a half-written file. The one way rigkit puts files there: scripts,
the tasks' XML, compose files and settings (`rigkit.windows.operations.file`) and the API key
(`rigkit.windows.acl_file`, which sets the temporary file's ACL before the move).

The move is `Move-IntoPlace` (templates/windows/_replace.ps1.j2, the same function the watchdog's
state uses): [IO.File]::Replace over an existing file, [IO.File]::Move where there is none; never
Windows PowerShell 5.1's `Move-Item -Force`, which deletes the destination first. A temporary file a
broken deploy left is overwritten by the next upload (the destination's SHA-256 still differs, so the
next deploy uploads again).
"""

from __future__ import annotations

from io import BytesIO
from pathlib import PureWindowsPath

from pyinfra.api import FileUploadCommand

from rigkit.plumbing.render import ps_quote, render

UPLOAD_SUFFIX = ".rigkit-upload"


def temporary_name(dest: str) -> str:
    """Where `dest`'s new content is uploaded first: a hidden-style name in the same folder (the same
    volume, which ReplaceFile needs, and the same ACL inheritance)."""
    path = PureWindowsPath(dest)
    return str(path.with_name(f".{path.name}{UPLOAD_SUFFIX}"))


def move_function() -> str:
    """The PowerShell function `Move-IntoPlace`, as every rendered script has it."""
    return render("windows/_replace.ps1.j2", with_write=False).lstrip("\n")


def place_script(what: str, temporary: str, dest: str, before: str = "", after: str = "") -> str:
    """The script that moves the uploaded `temporary` over `dest`; `before` and `after` are PowerShell
    lines run around the move (the key's ACL). First line: `# rigkit: <what> TEMP DEST`."""
    return (
        f"# rigkit: {what} {ps_quote(temporary)} {ps_quote(dest)}\n"
        + move_function()
        + before
        + f"Move-IntoPlace {ps_quote(temporary)} {ps_quote(dest)}\n"
        + after
    )


def upload(data: bytes, dest: str, place: str | None = None):
    """The commands of an operation that puts `data` at `dest`: the upload to `temporary_name(dest)`,
    then `place` (a `place_script` for that temporary name; by default the plain `place-file`).
    Use with `yield from`."""
    temporary = temporary_name(dest)
    yield FileUploadCommand(BytesIO(data), temporary)
    yield place or place_script("place-file", temporary, dest)
