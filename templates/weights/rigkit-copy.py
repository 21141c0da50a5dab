"""rigkit weights copier: runs inside a short-lived helper container on the rig, or on the rig
itself (check, as the deploy's read-only fact; manifest, send, receive and verify of a relay where
the rig's shell reaches the volume's folder, rigkit/weights/relay.py).

    python3 -c "<this file>" check|copy|verify [SRC DST [ROOT]]
    python3 -c "<this file>" check-each NAME SRC DST ROOT [NAME SRC DST ROOT ...]
    python3 -c "<this file>" manifest|send VOLUME     (on the rig a model's weights come from)
    python3 -c "<this file>" receive VOLUME [CHUNK_BYTES]  (on the rig that takes them; see send())

SRC is the model folder (default /src; mounted read-only: the source is never written);
DST the Docker volume (default /dst); ROOT the folder symlinks may point into (default
SRC). In a Hugging Face cache, models--ORG--NAME/snapshots/<revision>/ holds only symlinks
into ../../blobs/: ROOT is then models--ORG--NAME, and the content behind each link is
copied under the link's name. A link that dangles or leaves ROOT is an error, as is a
source that is missing, empty or cannot be listed: the volume is never marked complete
with files missing. Standard library only: the helper image is any image with python3
(by default the model's own serving image, which the rig has).

Source integrity, proven in the same read that copies (class Proof): in a Hugging Face cache
the file behind each link is ROOT/blobs/<name>, and <name> is the hub's own hash of it: 64 hex
digits are an LFS file's SHA-256 ("hub-sha256"), 40 a small file's git blob hash, sha1(b"blob
<size>\0" + content) ("git-blob-sha1"). A *.safetensors file (any source) must have a header
whose tensors tile the rest of the file exactly ("safetensors-header"). A file no check applies
to has only its SHA-256 ("copied-sha256"). A file that fails is not copied, and the copy ends
without a manifest or a marker, naming each such file with what was expected and what was found.

State in the volume, under DST/.rigkit/:
  progress.jsonl  one line per file copied: path, size, mtime_ns, sha256, proof (the checks it
                  passed), hub (its blob name, if any); on resume each listed file is re-read in
                  the volume and proven again before it is trusted
  manifest.json   every file, as in progress.jsonl; written when all files are in
  complete        the completion marker, written last; removed first by every copy
  writer.lock     flock'd by receive and verify while they run: one writer at a time
  chunks.jsonl    receive: each chunk fsynced, then journaled here (resume point)
  last-copy.json  receive: what the last complete copy read and wrote

check   compare the source's paths, sizes and mtimes with the manifest (reads no file contents)
copy    copy what is missing or different, resuming an interrupted copy, then write manifest and marker
verify  re-read every file in the volume: its SHA-256 against the manifest, and its proofs again (the
        hub name the manifest records, the safetensors header); remove files that fail and the marker

The last line printed is a JSON report. Exit codes: 0 ok, 1 corrupt (verify), 3 no space, 4 a source
file fails its integrity check (copy), 2 other errors. RIGKIT_WEIGHTS_PROOFS=off in the environment
turns the source checks off (bench/weights_copy.py measures their cost so; rigkit never sets it).
"""

import collections
import errno
import hashlib
import json
import os
import queue
import sys
import threading
import time

SRC, DST, ROOT = "/src", "/dst", "/src"  # set from the command line in main()
PARTIAL = ".rigkit-partial"
CHUNK = 16 * 1024 * 1024
CHUNK_BYTES = 64 * 1024 * 1024  # rig to rig: the unit fsynced, journaled and resumed (receive's argument)
PROOFS = os.environ.get("RIGKIT_WEIGHTS_PROOFS", "on") != "off"
HEADER_MAX = 100_000_000  # safetensors' own limit on the JSON header's length
HEX = frozenset("0123456789abcdef")
# Bytes per element of the safetensors dtypes that take whole bytes (sub-byte ones are not sized).
DTYPE_BYTES = {"BOOL": 1, "U8": 1, "I8": 1, "F8_E5M2": 1, "F8_E4M3": 1, "F8_E8M0": 1, "I16": 2, "U16": 2,
               "F16": 2, "BF16": 2, "I32": 4, "U32": 4, "F32": 4, "I64": 8, "U64": 8, "F64": 8, "C64": 8}


class SourceError(Exception):
    """The source cannot be copied completely; the message says why and where."""


def state_path(name):
    return os.path.join(DST, ".rigkit", name)


def _inside(path, root):
    return path == root or path.startswith(root.rstrip(os.sep) + os.sep)


def _raise(error):
    raise SourceError(f"cannot list the source: {error.strerror}: {error.filename}")


def listing():
    """[(path, size, mtime_ns)] of every file under SRC, sorted; a symlink counts as the file it
    resolves to, which must lie inside ROOT. Reads metadata only."""
    if not os.path.isdir(SRC):
        raise SourceError(f"the source folder {SRC} does not exist (or is not a folder)")
    root = os.path.realpath(ROOT)
    files = []
    for folder, dirs, names in os.walk(SRC, onerror=_raise):
        for name in sorted(dirs):
            if os.path.islink(os.path.join(folder, name)):
                raise SourceError(f"{os.path.join(folder, name)} is a symlink to a folder; link files, not folders")
        dirs.sort()
        for name in names:
            full = os.path.join(folder, name)
            if os.path.islink(full):
                target = os.path.realpath(full)
                if not _inside(target, root):
                    raise SourceError(f"{full} links to {target}, outside {ROOT}; copy the file there instead")
                if not os.path.isfile(target):
                    raise SourceError(f"{full} is a dangling symlink (to {os.readlink(full)}); "
                                      "the download is incomplete")
            elif not os.path.isfile(full):
                continue  # sockets, fifos: not weights
            try:
                st = os.stat(full)
            except OSError as exc:
                raise SourceError(f"cannot read {full}: {exc.strerror}") from None
            files.append((os.path.relpath(full, SRC), st.st_size, st.st_mtime_ns))
    if not files:
        raise SourceError(f"the source folder {SRC} has no files")
    return sorted(files)


def load_json(path, default):
    try:
        with open(path) as f:
            return json.load(f)
    except (FileNotFoundError, ValueError):
        return default


def manifest_listing(manifest):
    return sorted((e["path"], e["size"], e["mtime_ns"]) for e in manifest.get("files", []))


def report(**fields):
    print(json.dumps(fields), flush=True)


def check():
    if SRC == "-":  # weights from another rig: this volume's own state; the deploy compares it with that rig's
        complete = os.path.exists(state_path("complete"))
        files = load_json(state_path("manifest.json"), {}).get("files", []) if complete else []
        rows = sorted((e["path"], e["size"], e["sha256"]) for e in files)
        report(status="unchanged" if complete else "needed", complete=complete, completed_at=completed_at(),
               digest=hashlib.sha256(json.dumps(rows).encode()).hexdigest() if complete else None)
        return 0
    source = listing()  # first: a source that cannot be copied whole is an error, never "unchanged"
    complete = os.path.exists(state_path("complete"))
    same = complete and manifest_listing(load_json(state_path("manifest.json"), {})) == source
    report(status="unchanged" if same else "needed", complete=complete, hashed_bytes=0, copied_bytes=0,
           completed_at=completed_at())
    return 0


def completed_at():
    """When the completion marker was written (seconds since the epoch), or None: a model started before it
    serves what the volume held then (a copy that went on after its deploy was killed), not what it holds."""
    try:
        return os.stat(state_path("complete")).st_mtime
    except OSError:
        return None


def hub_name(path):
    """The hub's name for the file behind SRC/path when it is a blob of a Hugging Face cache
    (a link into ROOT/blobs/ whose name is 40 or 64 lowercase hex digits); else None."""
    full = os.path.join(SRC, path)
    if not PROOFS or not os.path.islink(full):
        return None
    target = os.path.realpath(full)
    name = os.path.basename(target)
    if os.path.dirname(target) != os.path.join(os.path.realpath(ROOT), "blobs"):
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


def read_progress(source):
    """Files a previous, interrupted copy finished that still match the source. Each is re-read
    in the volume and proven again first (its SHA-256 as recorded, its hub name, its safetensors
    header): after a crash, a file can have its size but not all its bytes on disk."""
    wanted = {(p, s, m) for p, s, m in source}
    done, rehashed = {}, 0
    if os.path.exists(state_path("progress.jsonl")):
        with open(state_path("progress.jsonl")) as f:
            for line in f:
                try:
                    e = json.loads(line)
                except ValueError:
                    continue  # a line cut by a kill
                key = (e["path"], e["size"], e["mtime_ns"])
                dst = os.path.join(DST, e["path"])
                if key in wanted and os.path.isfile(dst) and os.path.getsize(dst) == e["size"]:
                    rehashed += e["size"]
                    hub = hub_name(e["path"])
                    sha, passed, failed = prove(dst, Proof(e["path"], e["size"], hub))
                    if sha == e["sha256"] and not failed:
                        done[e["path"]] = entry(e["path"], e["size"], e["mtime_ns"], sha, passed, hub)
    return done, rehashed


def entry(path, size, mtime_ns, sha, passed, hub):
    """A file's line in progress.jsonl and the manifest."""
    line = {"path": path, "size": size, "mtime_ns": mtime_ns, "sha256": sha, "proof": passed}
    if hub:
        line["hub"] = hub
    return line


def copy_file(path, mtime_ns, proof):
    """Read once, in a three-stage pipeline: a reader thread, hashing and proving here (`proof`),
    a writer thread (file I/O and hashlib release the GIL, so the three overlap). Any stage's
    failure (a full disk at a write or at close) ends all three: nothing waits for a signal that
    is gone. Returns proof.finish(); a file that fails its proof is not put in place."""
    src, dst = os.path.join(SRC, path), os.path.join(DST, path)
    os.makedirs(os.path.dirname(dst), exist_ok=True)
    tmp = dst + PARTIAL
    read_q, write_q = queue.Queue(maxsize=4), queue.Queue(maxsize=4)
    failure = []
    stop = threading.Event()

    def put(q, item):
        """Put unless the pipeline stopped (bounded waits: a stopped consumer never blocks us)."""
        while not stop.is_set():
            try:
                q.put(item, timeout=0.5)
                return True
            except queue.Full:
                continue
        return False

    def read():
        try:
            with open(src, "rb", buffering=0) as fin:
                # Tell the kernel the file is read front to back: a larger read-ahead keeps
                # the disk busy while a chunk is hashed and written.
                os.posix_fadvise(fin.fileno(), 0, 0, os.POSIX_FADV_SEQUENTIAL)
                for chunk in iter(lambda: fin.read(CHUNK), b""):
                    if not put(read_q, chunk):
                        return
        except OSError as exc:
            failure.append(exc)
            stop.set()
        finally:
            put(read_q, None)

    def write():
        try:
            with open(tmp, "wb") as fout:
                while True:
                    try:
                        chunk = write_q.get(timeout=0.5)
                    except queue.Empty:
                        if stop.is_set():
                            return  # another stage failed: this file is abandoned
                        continue
                    if chunk is None:
                        break
                    fout.write(chunk)
                # No fsync here: waiting for each file's writeback would stop reading the next
                # one. sync_files makes every file durable before the manifest and marker are
                # written, and a resumed copy re-hashes what progress.jsonl lists.
                fout.flush()
        except OSError as exc:  # a full disk can surface at a write, at flush or at close
            failure.append(exc)
            stop.set()

    stages = [threading.Thread(target=read), threading.Thread(target=write)]
    for stage in stages:
        stage.start()
    try:
        while not stop.is_set():
            try:
                chunk = read_q.get(timeout=0.5)
            except queue.Empty:
                continue
            if chunk is None:
                break
            proof.update(chunk)
            if not put(write_q, chunk):
                break
    finally:
        put(write_q, None)
        stop.set()  # releases a reader still waiting to put
        for stage in stages:
            stage.join()
    if failure:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise failure[0]
    if proof.read != proof.size:
        os.remove(tmp)
        raise SourceError(f"{path} changed size while it was copied ({proof.size} bytes listed, {proof.read} read); "
                          "run again once the source is still")
    sha, passed, failed = proof.finish()
    if failed:
        os.remove(tmp)  # never in the volume under its name: a resume cannot mistake it for a copy
        return sha, passed, failed
    os.utime(tmp, ns=(mtime_ns, mtime_ns))
    os.replace(tmp, dst)
    return sha, passed, failed


def sync_files(paths):
    """Everything on disk before the manifest and marker say it is."""
    for path in paths:
        fd = os.open(os.path.join(DST, path), os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def remove_stale(keep):
    """Files no longer in the source, and pieces of an interrupted copy."""
    for folder, _, names in os.walk(DST):
        if _inside(folder, os.path.join(DST, ".rigkit")):
            continue
        for name in names:
            rel = os.path.relpath(os.path.join(folder, name), DST)
            if rel not in keep or name.endswith(PARTIAL):
                os.remove(os.path.join(folder, name))


def copy():
    started = time.monotonic()
    source = listing()
    os.makedirs(os.path.join(DST, ".rigkit"), exist_ok=True)
    if os.path.exists(state_path("complete")):
        os.remove(state_path("complete"))  # from here until the end, the volume is not complete
    done, rehashed = read_progress(source)
    todo = [(p, s, m) for p, s, m in source if p not in done]
    remove_stale({p for p, _, _ in source})
    # Only what is really added counts: a file about to be replaced frees its old size.
    replaced = sum(os.path.getsize(os.path.join(DST, p)) for p, _, _ in todo if os.path.isfile(os.path.join(DST, p)))
    needed = sum(s for _, s, _ in todo) - replaced
    stat = os.statvfs(DST)
    free = stat.f_bavail * stat.f_frsize
    if needed > free:
        report(status="error", error="no space", needed_bytes=needed, free_bytes=free)
        return 3
    copied, refused = 0, []
    with open(state_path("progress.jsonl"), "a") as progress:
        for path, size, mtime_ns in todo:
            if os.path.isfile(os.path.join(DST, path)):
                os.remove(os.path.join(DST, path))  # the old version goes before the new one arrives
            hub = hub_name(path)
            try:
                sha, passed, failed = copy_file(path, mtime_ns, Proof(path, size, hub))
            except OSError as exc:
                if exc.errno in (errno.ENOSPC, errno.EDQUOT):
                    free = os.statvfs(DST).f_bavail * os.statvfs(DST).f_frsize
                    report(status="error", error="no space", needed_bytes=needed - copied, free_bytes=free,
                           copied_bytes=copied, file=path)
                    return 3
                raise
            copied += size
            if failed:
                refused += failed  # the other files are still copied: a run after the fix resumes
                continue
            done[path] = entry(path, size, mtime_ns, sha, passed, hub)
            progress.write(json.dumps(done[path]) + "\n")
            progress.flush()
    if listing() != source:
        report(status="error", error="the source changed during the copy; run again")
        return 2
    if refused:
        shown = "; ".join(refused[:5]) + (f"; and {len(refused) - 5} more" if len(refused) > 5 else "")
        report(status="error", error=f"{len(refused)} source file(s) are not what their checks say, so nothing was "
               f"marked complete: {shown}. The download is damaged: fetch these files again "
               "(for a Hugging Face cache, remove the blobs named and download again), then run again",
               refused=refused, copied_bytes=copied)
        return 4
    sync_files(p for p, _, _ in source)
    manifest = {"files": [done[p] for p, _, _ in source]}
    with open(state_path("manifest.json.tmp"), "w") as f:
        json.dump(manifest, f)
    os.replace(state_path("manifest.json.tmp"), state_path("manifest.json"))
    with open(state_path("complete"), "w") as f:
        f.write(time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()) + "\n")
    total = sum(s for _, s, _ in source)
    report(status="copied", files=len(source), bytes=total, copied_bytes=copied, hashed_bytes=copied + rehashed,
           resumed_files=len(source) - len(todo), proven=proven(manifest["files"]),
           seconds=time.monotonic() - started)
    return 0


def proven(entries):
    """{check: how many files passed it} over manifest entries."""
    counts = {}
    for e in entries:
        for check in e.get("proof", ["copied-sha256"]):
            counts[check] = counts.get(check, 0) + 1
    return counts


def verify():
    started = time.monotonic()
    held = hold_volume()  # noqa: F841: it removes files; released when the process ends
    manifest = load_json(state_path("manifest.json"), None)
    if manifest is None:
        report(status="corrupt", bad=[], error="no manifest: the volume was never completely copied")
        return 1
    bad, reasons, hashed, checked = [], {}, 0, []
    for e in manifest["files"]:
        dst = os.path.join(DST, e["path"])
        if not os.path.isfile(dst):
            bad.append(e["path"])
            reasons[e["path"]] = "missing from the volume"
            continue
        size = os.path.getsize(dst)
        hashed += size
        # The hub name recorded at the copy; for a manifest from before the checks, the source's own.
        hub = (e.get("hub") or hub_name(e["path"])) if PROOFS else None
        sha, passed, failed = prove(dst, Proof(e["path"], size, hub))
        if sha != e["sha256"]:
            failed.insert(0, f"{e['path']}: sha256: expected {e['sha256']} (the manifest), found {sha}")
        if failed:
            bad.append(e["path"])
            reasons[e["path"]] = "; ".join(failed)
        else:
            checked.append({"proof": passed})
    if bad:
        for path in bad:  # the next copy fetches these again
            if os.path.exists(os.path.join(DST, path)):
                os.remove(os.path.join(DST, path))
        if os.path.exists(state_path("complete")):
            os.remove(state_path("complete"))
    report(status="corrupt" if bad else "verified", bad=bad, reasons=reasons, files=len(manifest["files"]),
           hashed_bytes=hashed, proven=proven(checked), seconds=time.monotonic() - started)
    return 1 if bad else 0


def manifest():
    """The volume at SRC as a source for another rig: its manifest, only when it is complete."""
    print(json.dumps(complete_manifest(SRC)), flush=True)
    return 0


def complete_manifest(volume):
    if not os.path.exists(os.path.join(volume, ".rigkit", "complete")):
        raise SourceError("the source rig's volume is not complete (no marker): deploy that rig first")
    found = load_json(os.path.join(volume, ".rigkit", "manifest.json"), None)
    if not isinstance(found, dict) or not isinstance(found.get("files"), list):
        raise SourceError("the source rig's volume has a marker but no readable manifest: run --verify-weights there")
    return {"status": "ok", "files": found["files"]}


# Rig to rig (a relay through the control machine: send on the source rig, receive on the target
# rig, the controller pumping the one's stdout into the other's stdin). The receiver answers the
# source's manifest with a plan, [[path, offset], ...]; the sender streams, for each, a JSON line
# {"path", "offset", "size"} and then the file's bytes from offset to its end; then {"end": true}.
# The receiver writes fixed-size chunks, fsyncs each and then journals it (chunks.jsonl): a killed
# copy resumes at its last journaled chunk, so at most one chunk crosses the network twice.

def wide_pipe(fd):
    """A pipe's buffer from 64 KiB to 1 MiB (Linux F_SETPIPE_SZ, within /proc/sys/fs/pipe-max-size):
    a 64 KiB pipe caps a Python stream near 300 MB/s. Anything else (a socket, a file) is left alone."""
    try:
        import fcntl
        fcntl.fcntl(fd, getattr(fcntl, "F_SETPIPE_SZ", 1031), 1024 * 1024)
    except OSError:
        pass


def send():
    files = {e["path"]: e for e in complete_manifest(SRC)["files"]}
    wide_pipe(sys.stdout.fileno())
    plan = json.loads(sys.stdin.buffer.readline() or b"{}")
    out, read_bytes, started = sys.stdout.buffer, 0, time.monotonic()
    for path, offset in plan.get("files", []):
        if path not in files:  # never read a path the manifest does not name
            raise SourceError(f"the target asked for {path!r}, which the source's manifest does not list")
        size = files[path]["size"]
        full = os.path.join(SRC, path)
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
                      "volume_path": SRC}),
          file=sys.stderr, flush=True)
    return 0


RELAY_BLOCK = 1024 * 1024


class Prefetch:
    """The receiver's stdin read ahead by a thread (at most `ahead` bytes), so the network keeps
    arriving while a chunk is hashed, written and fsynced. Blocks are handed on as they came (no
    joining: a 64 MiB chunk is never copied in memory): readline() and blocks(n)."""

    BLOCK = 1024 * 1024

    def __init__(self, fd, ahead):
        self.blocks, self.eof = collections.deque(), False
        self.q = queue.Queue(maxsize=max(4, ahead // self.BLOCK))
        threading.Thread(target=self._fill, args=(fd,), daemon=True).start()

    def _fill(self, fd):
        while True:
            try:
                block = os.read(fd, self.BLOCK)
            except OSError:
                block = b""
            self.q.put(block)
            if not block:
                return

    # As rigkit/weights/relay.py's STALL_TIMEOUT_S: the relay's pipes have no timeout of their own.
    # RIGKIT_RELAY_STALL_S shortens it for tests (rigkit never sets it).
    STALL_S = int(os.environ.get("RIGKIT_RELAY_STALL_S", "300"))

    def _more(self):
        try:
            block = self.q.get(timeout=self.STALL_S) if not self.eof else b""
        except queue.Empty:
            raise SourceError(f"no byte came from the source rig for {self.STALL_S} s: the copy was cut off; deploy "
                              "again and it resumes at its last chunk") from None
        if block:
            self.blocks.append(block)
        else:
            self.eof = True
        return bool(block)

    def readline(self):
        line = b""
        while True:
            if not self.blocks and not self._more():
                return line
            block = self.blocks.popleft()
            end = block.find(b"\n")
            if end >= 0:
                if end + 1 < len(block):
                    self.blocks.appendleft(block[end + 1:])
                return line + block[:end + 1]
            line += block

    def take(self, n):
        """Up to n bytes as a list of blocks; fewer only at the end of the stream."""
        out = []
        while n > 0 and (self.blocks or self._more()):
            block = self.blocks.popleft()
            if len(block) > n:
                self.blocks.appendleft(block[n:])
                block = block[:n]
            out.append(block)
            n -= len(block)
        return out


class ChunkWriter:
    """Writes each chunk, fsyncs it and only then journals it, on its own thread (with the chunk's
    SHA-256): the receiver's main thread proves the next chunk meanwhile. A failed write (ENOSPC)
    is raised in the main thread at its next put() or wait()."""

    def __init__(self, journal):
        self.journal, self.error = journal, None
        self.q = queue.Queue(maxsize=2)
        threading.Thread(target=self._run, daemon=True).start()

    def put(self, item):
        while True:
            if self.error:
                raise self.error
            try:
                self.q.put(item, timeout=0.5)
                return
            except queue.Full:
                continue

    def wait(self):
        self.q.join()
        if self.error:
            raise self.error

    def _run(self):
        while True:
            fd, blocks, fields = self.q.get()
            try:
                if self.error is None:
                    sha = hashlib.sha256()
                    for block in blocks:
                        sha.update(block)
                        view = memoryview(block)
                        while view:
                            view = view[os.write(fd, view):]
                    os.fsync(fd)  # on disk before the journal says so
                    self.journal.write(json.dumps({**fields, "sha256": sha.hexdigest()}) + "\n")
                    self.journal.flush()
            except OSError as exc:
                self.error = exc
            finally:
                self.q.task_done()


def resume_point(path, expected, chunk_bytes, journal, proof, dropped):
    """How many bytes of DST/path.rigkit-partial the chunks journal proves: each journaled chunk is
    re-read here and its SHA-256 compared (it was fsynced before its line was written), feeding
    `proof` so the file's own SHA-256 covers every byte. The partial is cut after the last good chunk."""
    partial = os.path.join(DST, path) + PARTIAL
    chunks = journal.get((path, expected, chunk_bytes), {})
    good = 0
    if os.path.isfile(partial) and not chunks:
        os.remove(partial)  # another source file's piece, or one whose chunks were never journaled
        return 0
    if os.path.isfile(partial):
        with open(partial, "rb") as f:
            while good in chunks:
                data = f.read(chunk_bytes)
                if hashlib.sha256(data).hexdigest() != chunks[good]:
                    break
                proof.update(data)
                good += 1
        dropped.append(os.path.getsize(partial) - proof.read)  # received before, not journaled: sent again
        with open(partial, "r+b") as f:
            f.truncate(proof.read)
    return proof.read


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


def read_journal():
    """{(path, file sha256, chunk bytes): {chunk index: chunk sha256}} from chunks.jsonl."""
    journal = {}
    for e in json_lines("chunks.jsonl"):
        if {"path", "file_sha256", "chunk_bytes", "chunk", "sha256"} <= e.keys():
            journal.setdefault((e["path"], e["file_sha256"], e["chunk_bytes"]), {})[e["chunk"]] = e["sha256"]
    return journal


def durable_done(source):
    """Files of progress.jsonl written by a receiver (each fsynced before its line) that still hold
    the source's SHA-256 and size: kept without a read."""
    wanted = {e["path"]: e for e in source}
    done = {}
    for e in json_lines("progress.jsonl"):
        want = wanted.get(e.get("path"))
        if (e.get("durable") and want and e.get("sha256") == want["sha256"] and e.get("size") == want["size"]
                and os.path.isfile(os.path.join(DST, e["path"]))
                and os.path.getsize(os.path.join(DST, e["path"])) == e["size"]):
            done[e["path"]] = e
    return done


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


def receive():
    started = time.monotonic()
    chunk_bytes = CHUNK_BYTES
    wide_pipe(sys.stdin.fileno())
    stdin = Prefetch(sys.stdin.fileno(), 2 * chunk_bytes)
    source = json.loads(stdin.readline() or b"{}").get("files")
    if not source:
        raise SourceError("no manifest came from the source rig")
    for e in source:
        parts = e["path"].split("/")
        if e["path"].startswith("/") or ".." in parts or "" in parts or parts[0] == ".rigkit":
            raise SourceError(f"the source's manifest names {e['path']!r}, not a path inside a volume")
    held = hold_volume()  # noqa: F841: released when the process ends
    if os.path.exists(state_path("complete")):
        os.remove(state_path("complete"))
    done = durable_done(source)
    journal = read_journal()
    plan, proofs, rehashed, dropped = [], {}, 0, []
    for e in source:
        if e["path"] in done:
            continue
        proof = Proof(e["path"], e["size"], e.get("hub") if PROOFS else None)
        offset = resume_point(e["path"], e["sha256"], chunk_bytes, journal, proof, dropped)
        rehashed += offset
        proofs[e["path"]] = proof
        plan.append([e["path"], offset])
    keep = {e["path"] for e in source}
    for folder, _, names in os.walk(DST):
        if _inside(folder, os.path.join(DST, ".rigkit")):
            continue
        for name in names:
            rel = os.path.relpath(os.path.join(folder, name), DST)
            if rel.endswith(PARTIAL) and rel[:-len(PARTIAL)] in proofs:
                continue  # being resumed
            if rel not in done:
                os.remove(os.path.join(folder, name))
    needed = sum(e["size"] for e in source if e["path"] in proofs) - rehashed
    stat = os.statvfs(DST)
    if needed > stat.f_bavail * stat.f_frsize:
        print(json.dumps({"files": []}), flush=True)  # tells the sender to send nothing
        report(status="error", error="no space", needed_bytes=needed, free_bytes=stat.f_bavail * stat.f_frsize)
        return 3
    print(json.dumps({"files": plan}), flush=True)
    by_path = {e["path"]: e for e in source}
    received, resent, refused = 0, 0, []
    with open(state_path("chunks.jsonl"), "a") as chunks_log, open(state_path("progress.jsonl"), "a") as progress:
        writer = ChunkWriter(chunks_log)
        while True:
            line = stdin.readline()
            if not line.endswith(b"\n"):
                raise SourceError("the stream from the source rig ended early: the copy was cut off; deploy again "
                                  "and it resumes at its last chunk")
            header = json.loads(line)
            if header.get("end"):
                break
            path, offset = header["path"], header["offset"]
            e, proof = by_path[path], proofs[path]
            if offset != proof.read or header["size"] != e["size"]:
                raise SourceError(f"{path}: the sender began at byte {offset} of {header['size']}, "
                                  f"the plan asked for {proof.read} of {e['size']}")
            partial = os.path.join(DST, path) + PARTIAL
            os.makedirs(os.path.dirname(partial), exist_ok=True)
            with open(partial, "ab", buffering=0) as out:
                index = offset // chunk_bytes
                while proof.read < e["size"]:
                    want = min(chunk_bytes, e["size"] - proof.read)
                    blocks = stdin.take(want)
                    got = sum(len(b) for b in blocks)
                    if got != want:
                        raise SourceError(f"the stream from the source rig ended early ({got} of {want} bytes): the "
                                          "copy was cut off; deploy again and it resumes at its last chunk")
                    for block in blocks:
                        proof.update(block)
                    writer.put((out.fileno(), blocks, {"path": path, "file_sha256": e["sha256"],
                                                       "chunk_bytes": chunk_bytes, "chunk": index}))
                    received += got
                    index += 1
                writer.wait()
            sha, passed, failed = proof.finish()
            if sha != e["sha256"]:
                failed.insert(0, f"{path}: sha256: expected {e['sha256']} (the source rig's manifest), found {sha}")
            if failed:
                os.remove(partial)
                refused += failed
                continue
            os.utime(partial, ns=(e["mtime_ns"], e["mtime_ns"]))
            os.replace(partial, os.path.join(DST, path))
            fsync_path(os.path.dirname(os.path.join(DST, path)))
            done[path] = {**entry(path, e["size"], e["mtime_ns"], sha, passed, e.get("hub")), "durable": True}
            progress.write(json.dumps(done[path]) + "\n")
            progress.flush()
            os.fsync(progress.fileno())
    if refused:
        report(status="error", error=f"{len(refused)} file(s) from the source rig are not what their checks say, "
               f"so nothing was marked complete: {'; '.join(refused[:5])}. Run --verify-weights on the source rig",
               refused=refused, received_bytes=received)
        return 4
    missing = [e["path"] for e in source if e["path"] not in done]
    if missing:
        raise SourceError(f"the source rig sent no data for {', '.join(missing[:5])}")
    files = [{k: v for k, v in done[e["path"]].items() if k != "durable"} for e in source]
    with open(state_path("manifest.json.tmp"), "w") as f:
        json.dump({"files": files}, f)
    os.replace(state_path("manifest.json.tmp"), state_path("manifest.json"))
    if os.path.exists(state_path("chunks.jsonl")):
        os.remove(state_path("chunks.jsonl"))
    total = sum(e["size"] for e in source)
    result = dict(status="copied", files=len(source), bytes=total, copied_bytes=received, received_bytes=received,
                  rehashed_bytes=rehashed, resent_bytes=sum(dropped), resumed_at={p: o for p, o in plan if o},
                  chunk_bytes=chunk_bytes, resumed_files=len(source) - len(plan), proven=proven(files),
                  seconds=time.monotonic() - started, volume_path=DST)
    with open(state_path("last-copy.json"), "w") as f:  # what this copy read and wrote, for a person (and tests)
        json.dump(result, f)
    with open(state_path("complete"), "w") as f:
        f.write(time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()) + "\n")
        f.flush()
        os.fsync(f.fileno())
    report(**result)
    return 0



def run_action(action, say):
    """Run one mode; its failures as a report through `say` and an exit code."""
    try:
        return action()
    except SourceError as exc:
        say(status="error", error=str(exc))
        return 2
    except BrokenPipeError:
        say(status="error", error="the target rig stopped reading the stream")
        return 2
    except OSError as exc:
        if exc.errno in (errno.ENOSPC, errno.EDQUOT):
            say(status="error", error="no space", needed_bytes=0, free_bytes=0)
            return 3
        say(status="error", error=f"{exc.strerror}: {exc.filename}")
        return 2


def main(argv):
    global SRC, DST, ROOT, CHUNK_BYTES
    if len(argv) >= 2 and argv[1] == "check-each":
        return check_each(argv)
    relay = {"manifest": manifest, "send": send, "receive": receive}
    if len(argv) in (3, 4) and argv[1] in relay:
        SRC = DST = argv[2]
        if argv[1] == "receive" and len(argv) == 4:
            CHUNK_BYTES = int(argv[3])
        # The sender's stdout is the stream: its report goes to stderr.
        say = (lambda **f: print(json.dumps(f), file=sys.stderr, flush=True)) if argv[1] == "send" else report
        return run_action(relay[argv[1]], say)
    actions = {"check": check, "copy": copy, "verify": verify}
    if len(argv) < 2 or argv[1] not in actions or len(argv) > 5:
        report(status="error", error=f"usage: check|copy|verify [SRC DST [ROOT]] | manifest|send VOLUME | receive "
               f"VOLUME [CHUNK_BYTES], not {argv[1:]!r}")
        return 2
    SRC, DST = (argv[2], argv[3]) if len(argv) >= 4 else (SRC, DST)
    ROOT = argv[4] if len(argv) == 5 else SRC
    return run_action(actions[argv[1]], report)


def check_each(argv):
    """check for several volumes in one python3 start (the deploy's fact asks for all of a rig's
    volumes at once): "volume NAME" before each one's report."""
    rest = argv[2:]
    if not rest or len(rest) % 4:
        report(status="error", error=f"usage: check-each NAME SRC DST ROOT [NAME SRC DST ROOT ...], not {rest!r}")
        return 2
    for i in range(0, len(rest), 4):
        name, src, dst, root = rest[i:i + 4]
        print(f"volume {name}", flush=True)
        try:
            main([argv[0], "check", src, dst, root])
        except Exception as exc:  # one volume's surprise (a manifest missing a key) is its own answer
            report(status="error", error=f"{type(exc).__name__}: {exc}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
