"""Replacing a file on the rig atomically: a reader sees the old file or the new one, whole, never a
part; the new content is on disk (fsync) before it takes the old one's place. And reading such a
file back, where missing or broken means None."""

from __future__ import annotations

import hashlib
import json
import os
import shutil


def _replace(tmp: str, target: str) -> None:
    with open(tmp, "rb") as f:
        os.fsync(f.fileno())
    os.replace(tmp, target)


def copy_over(source: str, target: str) -> None:
    """Copy `source` over `target` (mode and times kept)."""
    shutil.copy2(source, target + ".tmp")
    _replace(target + ".tmp", target)


def write_text(path: str, text: str) -> None:
    """Write `text` to `path`."""
    with open(path + ".tmp", "w") as f:
        f.write(text)
    _replace(path + ".tmp", path)


def read_json(path: str):
    """The JSON document at `path`, or None when it is missing or not whole JSON."""
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def sha256(path: str) -> str | None:
    """The hex SHA-256 of the file at `path`, or None when it cannot be read."""
    try:
        with open(path, "rb") as f:
            return bytes_sha256(f.read())
    except OSError:
        return None


def bytes_sha256(content: bytes) -> str:
    """The hex SHA-256 of `content`: of a file's bytes read once, where what is decided on and what is
    digested must be the same read (the GPU keeper's policy)."""
    return hashlib.sha256(content).hexdigest()


def files_sha256(paths) -> str:
    """One hex SHA-256 over the files at `paths`, in order, each followed by a NUL byte (rigkit-stack's
    rollout gate: the wanted compose file and settings it judged). A file that cannot be read raises."""
    digest = hashlib.sha256()
    for path in paths:
        with open(path, "rb") as f:
            digest.update(f.read())
        digest.update(b"\0")
    return digest.hexdigest()
