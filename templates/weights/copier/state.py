"""The copier's places and its state in a volume: the folders a run reads and writes (SRC, DST, ROOT, set
from the command line by main), the files under DST/.rigkit/, the JSON report it prints, and the lock
that keeps one writer per volume."""

import json
import os
import time

SRC, DST, ROOT = "/src", "/dst", "/src"  # set from the command line in main()
PARTIAL = ".rigkit-partial"
CHUNK = 16 * 1024 * 1024
PROOFS = os.environ.get("RIGKIT_WEIGHTS_PROOFS", "on") != "off"


class SourceError(Exception):
    """The source cannot be copied completely; the message says why and where."""


def state_path(name):
    return os.path.join(DST, ".rigkit", name)


def inside(path, root):
    return path == root or path.startswith(root.rstrip(os.sep) + os.sep)


def load_json(path, default):
    try:
        with open(path) as f:
            return json.load(f)
    except (FileNotFoundError, ValueError):
        return default


def json_lines(name):
    """The entries of a state file of JSON lines (none when it is not there); a line cut by a kill is skipped."""
    if not os.path.exists(state_path(name)):
        return
    with open(state_path(name)) as f:
        for line in f:
            try:
                yield json.loads(line)
            except ValueError:
                continue


def report(**fields):
    print(json.dumps(fields), flush=True)


def fsync_path(path):
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def hold_volume(wait_s=60):
    """An exclusive lock on the volume (DST/.rigkit/writer.lock), held until this process ends: one
    writer at a time, whether the copier runs on the rig's shell or in a helper container (whose
    predecessor `docker rm -f` kills; a direct one whose controller went away ends at its stdin's
    end). Waits at most `wait_s`."""
    import fcntl
    os.makedirs(os.path.join(DST, ".rigkit"), exist_ok=True)
    lock = open(state_path("writer.lock"), "a")
    deadline = time.monotonic() + wait_s
    while True:
        try:
            fcntl.flock(lock.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
            return lock
        except BlockingIOError:
            if time.monotonic() > deadline:
                raise SourceError(f"another copy into this volume was still running after {wait_s} s; deploy again "
                                  "once it has ended") from None
            time.sleep(0.2)
