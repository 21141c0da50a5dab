"""manifest and send: a complete volume as the source of a rig-to-rig relay.

The protocol (a relay through the control machine: send on the source rig, receive on the target rig,
the controller pumping the one's stdout into the other's stdin): the receiver answers the source's
manifest with a plan, [[path, offset], ...]; the sender streams, for each, a JSON line {"path",
"offset", "size"} and then the file's bytes from offset to its end; then {"end": true}."""

import json
import os
import sys
import time

from . import state
from .state import SourceError, load_json

RELAY_BLOCK = 1024 * 1024


def wide_pipe(fd):
    """A pipe's buffer from 64 KiB to 1 MiB (Linux F_SETPIPE_SZ, within /proc/sys/fs/pipe-max-size):
    a 64 KiB pipe caps a Python stream near 300 MB/s. Anything else (a socket, a file) is left alone."""
    try:
        import fcntl
        fcntl.fcntl(fd, getattr(fcntl, "F_SETPIPE_SZ", 1031), 1024 * 1024)
    except OSError:
        pass


def complete_manifest(volume):
    if not os.path.exists(os.path.join(volume, ".rigkit", "complete")):
        raise SourceError("the source rig's volume is not complete (no marker): deploy that rig first")
    found = load_json(os.path.join(volume, ".rigkit", "manifest.json"), None)
    if not isinstance(found, dict) or not isinstance(found.get("files"), list):
        raise SourceError("the source rig's volume has a marker but no readable manifest: run --verify-weights there")
    return {"status": "ok", "files": found["files"]}


def manifest():
    """The volume at SRC as a source for another rig: its manifest, only when it is complete."""
    print(json.dumps(complete_manifest(state.SRC)), flush=True)
    return 0


def send():
    files = {e["path"]: e for e in complete_manifest(state.SRC)["files"]}
    wide_pipe(sys.stdout.fileno())
    plan = json.loads(sys.stdin.buffer.readline() or b"{}")
    out, read_bytes, started = sys.stdout.buffer, 0, time.monotonic()
    for path, offset in plan.get("files", []):
        if path not in files:  # never read a path the manifest does not name
            raise SourceError(f"the target asked for {path!r}, which the source's manifest does not list")
        size = files[path]["size"]
        full = os.path.join(state.SRC, path)
        if os.path.getsize(full) != size:
            raise SourceError(f"{path} has {os.path.getsize(full)} bytes on the source rig's volume, its manifest says "
                              f"{size}: run --verify-weights on the source rig")
        out.write(json.dumps({"path": path, "offset": offset, "size": size}).encode() + b"\n")
        with open(full, "rb", buffering=0) as f:
            os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_SEQUENTIAL)
            f.seek(offset)
            for block in iter(lambda: f.read(RELAY_BLOCK), b""):
                out.write(block)
                read_bytes += len(block)
    out.write(json.dumps({"end": True}).encode() + b"\n")
    out.flush()
    print(json.dumps({"status": "sent", "read_bytes": read_bytes, "seconds": time.monotonic() - started,
                      "volume_path": state.SRC}),
          file=sys.stderr, flush=True)
    return 0

