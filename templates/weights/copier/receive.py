"""receive: a rig-to-rig relay's stream into the volume. Fixed-size chunks are written, fsynced and only
then journaled (chunks.jsonl), so a killed copy resumes at its last journaled chunk and at most one
chunk crosses the network twice."""

import collections
import hashlib
import json
import os
import queue
import sys
import threading
import time

from . import state
from .proofs import Proof, entry, proven
from .send import wide_pipe
from .state import PARTIAL, PROOFS, SourceError, fsync_path, hold_volume, inside, json_lines, report, state_path

CHUNK_BYTES = 64 * 1024 * 1024  # the unit fsynced, journaled and resumed (receive's argument)


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
    partial = os.path.join(state.DST, path) + PARTIAL
    chunks = journal.get((path, expected, chunk_bytes), {})
    good = 0
    final = os.path.join(state.DST, path)
    if chunks and not os.path.isfile(partial) and os.path.isfile(final):
        # Renamed into place, then killed before its progress line: not done, but its chunks still prove it
        os.replace(final, partial)
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
                and os.path.isfile(os.path.join(state.DST, e["path"]))
                and os.path.getsize(os.path.join(state.DST, e["path"])) == e["size"]):
            done[e["path"]] = e
    return done


def receive(chunk_bytes=CHUNK_BYTES):
    started = time.monotonic()
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
    for folder, _, names in os.walk(state.DST):
        if inside(folder, os.path.join(state.DST, ".rigkit")):
            continue
        for name in names:
            rel = os.path.relpath(os.path.join(folder, name), state.DST)
            if rel.endswith(PARTIAL) and rel[:-len(PARTIAL)] in proofs:
                continue  # being resumed
            if rel not in done:
                os.remove(os.path.join(folder, name))
    needed = sum(e["size"] for e in source if e["path"] in proofs) - rehashed
    stat = os.statvfs(state.DST)
    if needed > stat.f_bavail * stat.f_frsize:
        print(json.dumps({"files": []}), flush=True)  # tells the sender to send nothing
        report(status="error", error="no space", needed_bytes=needed, free_bytes=stat.f_bavail * stat.f_frsize)
        return 3
    print(json.dumps({"files": plan}), flush=True)
    by_path = {e["path"]: e for e in source}
    received, refused = 0, []
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
            partial = os.path.join(state.DST, path) + PARTIAL
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
            os.replace(partial, os.path.join(state.DST, path))
            fsync_path(os.path.dirname(os.path.join(state.DST, path)))
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
                  seconds=time.monotonic() - started, volume_path=state.DST)
    with open(state_path("last-copy.json"), "w") as f:  # what this copy read and wrote, for a person (and tests)
        json.dump(result, f)
    with open(state_path("complete"), "w") as f:
        f.write(time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()) + "\n")
        f.flush()
        os.fsync(f.fileno())
    report(**result)
    return 0
