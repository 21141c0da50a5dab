"""copy: a model folder onto a volume on the same machine, read once (reader, prover and writer
threads), resuming an interrupted copy, then the manifest and, last, the marker."""

import errno
import json
import os
import queue
import threading
import time

from . import state
from .check import listing
from .proofs import Proof, entry, hub_name, prove, proven
from .state import CHUNK, PARTIAL, SourceError, inside, report, state_path


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
                dst = os.path.join(state.DST, e["path"])
                if key in wanted and os.path.isfile(dst) and os.path.getsize(dst) == e["size"]:
                    rehashed += e["size"]
                    hub = hub_name(e["path"])
                    sha, passed, failed = prove(dst, Proof(e["path"], e["size"], hub))
                    if sha == e["sha256"] and not failed:
                        done[e["path"]] = entry(e["path"], e["size"], e["mtime_ns"], sha, passed, hub)
    return done, rehashed


def copy_file(path, mtime_ns, proof):
    """Read once, in a three-stage pipeline: a reader thread, hashing and proving here (`proof`),
    a writer thread (file I/O and hashlib release the GIL, so the three overlap). Any stage's
    failure (a full disk at a write or at close) ends all three: nothing waits for a signal that
    is gone. Returns proof.finish(); a file that fails its proof is not put in place."""
    src, dst = os.path.join(state.SRC, path), os.path.join(state.DST, path)
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
        fd = os.open(os.path.join(state.DST, path), os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def remove_stale(keep):
    """Files no longer in the source, and pieces of an interrupted copy."""
    for folder, _, names in os.walk(state.DST):
        if inside(folder, os.path.join(state.DST, ".rigkit")):
            continue
        for name in names:
            rel = os.path.relpath(os.path.join(folder, name), state.DST)
            if rel not in keep or name.endswith(PARTIAL):
                os.remove(os.path.join(folder, name))


def copy():
    started = time.monotonic()
    source = listing()
    os.makedirs(os.path.join(state.DST, ".rigkit"), exist_ok=True)
    if os.path.exists(state_path("complete")):
        os.remove(state_path("complete"))  # from here until the end, the volume is not complete
    done, rehashed = read_progress(source)
    todo = [(p, s, m) for p, s, m in source if p not in done]
    remove_stale({p for p, _, _ in source})
    # Only what is really added counts: a file about to be replaced frees its old size.
    replaced = sum(os.path.getsize(os.path.join(state.DST, p)) for p, _, _ in todo if os.path.isfile(os.path.join(state.DST, p)))
    needed = sum(s for _, s, _ in todo) - replaced
    stat = os.statvfs(state.DST)
    free = stat.f_bavail * stat.f_frsize
    if needed > free:
        report(status="error", error="no space", needed_bytes=needed, free_bytes=free)
        return 3
    copied, refused = 0, []
    with open(state_path("progress.jsonl"), "a") as progress:
        for path, size, mtime_ns in todo:
            if os.path.isfile(os.path.join(state.DST, path)):
                os.remove(os.path.join(state.DST, path))  # the old version goes before the new one arrives
            hub = hub_name(path)
            try:
                sha, passed, failed = copy_file(path, mtime_ns, Proof(path, size, hub))
            except OSError as exc:
                if exc.errno in (errno.ENOSPC, errno.EDQUOT):
                    free = os.statvfs(state.DST).f_bavail * os.statvfs(state.DST).f_frsize
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
