"""A pyinfra operation for secrets on a Linux rig: `private_file`.

pyinfra's `files.put` prints the old and new contents of a changed text file under
`--diff`, and uploads through a temporary file in /tmp that other users can read until it
is moved. A secret must do neither: this operation compares SHA-256 digests only (the
digest is what the fact reads, never the content), uploads to a temporary name inside the
destination's own folder (which the caller keeps root-only), and then sets the mode.
"""

from __future__ import annotations

import hashlib
import shlex
from io import BytesIO
from pathlib import PurePosixPath

from pyinfra import host
from pyinfra.api import FileUploadCommand, operation

from rigkit.plumbing.facts_once import read_once
from rigkit.plumbing.files import FileStates


@operation()
def private_file(dest: str, data: bytes, mode: str = "600", owner: str = "root:root"):
    """Put `data` at `dest` with `mode` and `owner` ("user:group") unless it is already there; never
    shows the data. The file is private to `owner`: the mode is set before the owner is handed it."""
    state = read_once(FileStates, paths=(dest,)).get(dest)  # mode, owner and digest in one command
    same = state is not None and state["sha256"] == hashlib.sha256(data).hexdigest()
    if same and state["mode"] == mode.lstrip("0") and state["owner"] == owner:
        host.noop(f"{dest} is up to date (compared by SHA-256)")
        return
    if not same:
        temporary = str(PurePosixPath(dest).with_name(f".{PurePosixPath(dest).name}.rigkit-upload"))
        yield FileUploadCommand(BytesIO(data), dest, remote_temp_filename=temporary)
    yield f"chmod {shlex.quote(mode)} {shlex.quote(dest)}"
    yield f"chown {shlex.quote(owner)} {shlex.quote(dest)}"
