"""Files a command writes its result to (`--json`), checked before the run, so that a run is never
lost to a path it cannot write. Shared by every command that writes one (rigkit.cli for `status`,
rigkit.verify.bench_command, rigkit.tune)."""

from __future__ import annotations

import os
import re
from pathlib import Path

from rigkit.config.errors import shown


class OutputPathError(ValueError):
    """An output path that cannot be written: one line for the person."""


def output_file(option: str, value: str | None) -> Path | None:
    """The path, when its folder exists and can be written and it is not a folder or a FIFO."""
    if value is None:
        return None
    path = Path(value)
    if not value or re.search(r"[\x00-\x1f\x7f]", value):
        raise OutputPathError(f"{option} {shown(value)}: give a file path (no control characters)")
    if path.exists() and not path.is_file():
        raise OutputPathError(f"{option} {shown(value)}: exists and is not a regular file; give a file path")
    folder = path.parent
    if not folder.is_dir():
        raise OutputPathError(f"{option} {shown(value)}: its folder {folder} does not exist; create it or give "
                              "another path")
    if not os.access(folder, os.W_OK | os.X_OK) or (path.exists() and not os.access(path, os.W_OK)):
        raise OutputPathError(f"{option} {shown(value)}: cannot be written here (permission denied); give another path")
    return path
