"""Source integrity, proven in the same read that copies: a Hugging Face blob against its name (SHA-256 or
git blob hash), a safetensors header against the file's length, else the file's SHA-256 alone."""

import hashlib
import json
import os

from . import state
from .state import CHUNK, PROOFS

HEADER_MAX = 100_000_000  # safetensors' own limit on the JSON header's length
HEX = frozenset("0123456789abcdef")
# Bytes per element of the safetensors dtypes that take whole bytes (sub-byte ones are not sized).
DTYPE_BYTES = {"BOOL": 1, "U8": 1, "I8": 1, "F8_E5M2": 1, "F8_E4M3": 1, "F8_E8M0": 1, "I16": 2, "U16": 2,
               "F16": 2, "BF16": 2, "I32": 4, "U32": 4, "F32": 4, "I64": 8, "U64": 8, "F64": 8, "C64": 8}


def hub_name(path):
    """The hub's name for the file behind SRC/path when it is a blob of a Hugging Face cache
    (a link into ROOT/blobs/ whose name is 40 or 64 lowercase hex digits); else None."""
    full = os.path.join(state.SRC, path)
    if not PROOFS or not os.path.islink(full):
        return None
    target = os.path.realpath(full)
    name = os.path.basename(target)
    if os.path.dirname(target) != os.path.join(os.path.realpath(state.ROOT), "blobs"):
        return None
    return name if len(name) in (40, 64) and set(name) <= HEX else None


def safetensors_problem(head, size):
    """None when `head` (a safetensors file's first bytes: an 8-byte little-endian header length
    and the JSON header) describes a file of exactly `size` bytes, its tensors' data_offsets
    tiling the data with no gap or overlap; else what is wrong, with what was expected and found."""
    if size < 8:
        return f"expected at least the 8-byte header length, found a file of {size} bytes"
    length = int.from_bytes(bytes(head[:8]), "little")
    if length > HEADER_MAX:
        return f"expected a header length of at most {HEADER_MAX} bytes, found {length}"
    if 8 + length > size:
        return f"expected 8 + {length} header bytes, found a file of {size} bytes"
    try:
        header = json.loads(bytes(head[8:8 + length]).decode("utf-8"))
    except ValueError as exc:  # UnicodeDecodeError is one
        return f"expected a JSON header of {length} bytes, found one that does not parse ({exc})"
    if not isinstance(header, dict):
        return f"expected a JSON object as the header, found {type(header).__name__}"
    spans = []
    for name, tensor in header.items():
        if name == "__metadata__":
            continue
        offsets = tensor.get("data_offsets") if isinstance(tensor, dict) else None
        if not (isinstance(offsets, list) and len(offsets) == 2 and all(type(o) is int for o in offsets)
                and 0 <= offsets[0] <= offsets[1]):
            return f"tensor {name!r}: expected data_offsets [begin, end] with 0 <= begin <= end, found {offsets!r}"
        width, shape = DTYPE_BYTES.get(tensor.get("dtype")), tensor.get("shape")
        if width and isinstance(shape, list) and all(type(d) is int and d >= 0 for d in shape):
            count = 1
            for d in shape:
                count *= d
            if count * width != offsets[1] - offsets[0]:
                return (f"tensor {name!r}: expected {count * width} bytes ({tensor['dtype']} {shape}), "
                        f"found data_offsets spanning {offsets[1] - offsets[0]}")
        spans.append((offsets[0], offsets[1], name))
    at = 0
    for begin, end, name in sorted(spans):
        if begin != at:
            what = "a gap before it" if begin > at else "it overlaps the tensor before it"
            return f"tensor {name!r}: expected its data to start at {at}, found {begin} ({what})"
        at = end
    if 8 + length + at != size:
        return f"expected 8 + {length} header + {at} tensor bytes = {8 + length + at} bytes, found {size}"
    return None


class Proof:
    """What one read of a file proves, fed its chunks in order: its SHA-256 always; with a hub
    name, that the SHA-256 (64 hex) or the git blob hash (40 hex, hashed alongside) is that name;
    for *.safetensors, the header against the file's length (only the header's bytes are kept)."""

    def __init__(self, path, size, hub):
        self.path, self.size, self.hub, self.read = path, size, hub, 0
        self.sha256 = hashlib.sha256()
        self.git = hashlib.sha1(b"blob %d\0" % size) if hub and len(hub) == 40 else None
        self.head = bytearray() if PROOFS and path.endswith(".safetensors") else None

    def _head_wanted(self):
        if len(self.head) < 8:
            return 8
        length = int.from_bytes(bytes(self.head[:8]), "little")
        return 8 + length if length <= HEADER_MAX else 8

    def update(self, chunk):
        self.sha256.update(chunk)
        if self.git is not None:
            self.git.update(chunk)
        offset = 0
        while self.head is not None and offset < len(chunk) and len(self.head) < self._head_wanted():
            take = self._head_wanted() - len(self.head)
            self.head += chunk[offset:offset + take]
            offset += take
        self.read += len(chunk)

    def finish(self):
        """(sha256 hex, [the checks passed], [what failed: "PATH: CHECK: expected ..., found ..."])."""
        sha, passed, failed = self.sha256.hexdigest(), [], []
        if self.hub:
            check, found = ("hub-sha256", sha) if len(self.hub) == 64 else ("git-blob-sha1", self.git.hexdigest())
            if found == self.hub:
                passed.append(check)
            else:
                failed.append(f"{self.path}: {check}: expected {self.hub} (the name of its blob in blobs/), found {found}")
        if self.head is not None:
            problem = safetensors_problem(self.head, self.read)
            if problem:
                failed.append(f"{self.path}: safetensors-header: {problem}")
            else:
                passed.append("safetensors-header")
        return sha, passed or ["copied-sha256"], failed


def prove(full, proof):
    """Read `full` once through `proof`; its finish()."""
    with open(full, "rb") as f:
        for chunk in iter(lambda: f.read(CHUNK), b""):
            proof.update(chunk)
    return proof.finish()


def proven(entries):
    """{check: how many files passed it} over manifest entries."""
    counts = {}
    for e in entries:
        for check in e.get("proof", ["copied-sha256"]):
            counts[check] = counts.get(check, 0) + 1
    return counts


def entry(path, size, mtime_ns, sha, passed, hub):
    """A file's line in progress.jsonl and the manifest."""
    line = {"path": path, "size": size, "mtime_ns": mtime_ns, "sha256": sha, "proof": passed}
    if hub:
        line["hub"] = hub
    return line
