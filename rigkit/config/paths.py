"""What a path written in a rig or catalog file is. Pure; the lint rules, serving and weights ask it."""

from __future__ import annotations

import re

_WINDOWS_PATH = re.compile(r"^([A-Za-z]:[\\/]|\\\\|//|/mnt/[a-z]/|/run/desktop/mnt/host/)")


def is_windows_path(path: str) -> bool:
    """A Windows folder as Docker Desktop sees it (reads go through 9P: slow for many small reads)."""
    return bool(_WINDOWS_PATH.match(path))
