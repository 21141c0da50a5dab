"""Secrets rigkit reads on the control machine: refused unless private to their owner."""

from __future__ import annotations

import stat
from pathlib import Path

from rigkit.config.schema import RigConfig


class SecretFileError(Exception):
    pass


def read_api_key(rig: RigConfig) -> str | None:
    """The rig's API key from its `api_key_file` (mode 600), or None when the rig has none."""
    if not rig.spec.api_key_file:
        return None
    path = Path(rig.spec.api_key_file).expanduser()
    if not path.is_file():
        raise SecretFileError(f"{rig.file}: api_key_file {path} does not exist; create it (mode 600) or remove the field")
    if path.stat().st_mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise SecretFileError(f"{rig.file}: api_key_file {path} is readable by others; run chmod 600 {path}")
    key = path.read_text().strip()
    if not key or any(c.isspace() for c in key):
        raise SecretFileError(f"{rig.file}: api_key_file {path} must hold one key with no spaces")
    return key
