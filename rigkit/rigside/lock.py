"""The rollout lock of a stack: one rollout per stack at a time (rigkit-stack takes it for the whole
rollout; the watchdog never restarts a model while it is held, and takes it while it restarts).
One folder for both: names.LOCK_DIR, or RIGKIT_LOCK_DIR where the rig's environment sets it."""

from __future__ import annotations

import contextlib
import fcntl
import os

from .names import LOCK_DIR, rollout_lock_path


def lock_dir() -> str:
    return os.environ.get("RIGKIT_LOCK_DIR", LOCK_DIR)


def lock_path(name: str, folder: str | None = None) -> str:
    return rollout_lock_path(name, folder or lock_dir())


def try_lock(path: str):
    """The lock at `path` held (an open file; closing it releases the lock), or None when someone
    else holds it. Never waits."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    handle = open(path, "a")
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.close()
        return None
    return handle


@contextlib.contextmanager
def held(path: str):
    """The lock at `path`, waited for and held for the `with` block (for work that must not overlap
    itself, such as the GPU keeper's repairs; a rollout uses try_lock and never waits)."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        yield handle
