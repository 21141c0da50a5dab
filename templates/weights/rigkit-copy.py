"""rigkit weights copier: runs inside a short-lived helper container on the rig.

    python3 -c "<this file>" check|copy|verify

/src is the model folder, mounted read-only (the source is never written);
/dst is the Docker volume. Standard library only: the helper image is any image
with python3 (by default the model's own serving image, which the rig has).

State in the volume, under /dst/.rigkit/:
  progress.jsonl  one line per file copied: path, size, mtime_ns, sha256 (hashed while copying);
                  on resume each listed file is re-hashed in the volume before it is trusted
  manifest.json   every file: path, size, mtime_ns, sha256; written when all files are in
  complete        the completion marker, written last; removed first by every copy

check   compare the source's paths, sizes and mtimes with the manifest (reads no file contents)
copy    copy what is missing or different, resuming an interrupted copy, then write manifest and marker
verify  re-hash every file in the volume against the manifest; remove files that differ and the marker

The last line printed is a JSON report. Exit codes: 0 ok, 1 corrupt (verify), 3 no space, 2 other errors.
"""

import errno
import hashlib
import json
import os
import queue
import sys
import threading
import time

SRC, DST = "/src", "/dst"
STATE = os.path.join(DST, ".rigkit")
PROGRESS = os.path.join(STATE, "progress.jsonl")
MANIFEST = os.path.join(STATE, "manifest.json")
MARKER = os.path.join(STATE, "complete")
PARTIAL = ".rigkit-partial"
CHUNK = 8 * 1024 * 1024


def listing():
    """[(path, size, mtime_ns)] of every regular file under /src, sorted. Reads metadata only."""
    files = []
    for root, dirs, names in os.walk(SRC):
        dirs.sort()
        for name in names:
            full = os.path.join(root, name)
            st = os.lstat(full)
            if os.path.isfile(full) and not os.path.islink(full):
                files.append((os.path.relpath(full, SRC), st.st_size, st.st_mtime_ns))
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
    complete = os.path.exists(MARKER)
    same = complete and manifest_listing(load_json(MANIFEST, {})) == listing()
    report(status="unchanged" if same else "needed", complete=complete, hashed_bytes=0, copied_bytes=0)
    return 0


def sha256_of(path):
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(CHUNK), b""):
            digest.update(chunk)
    return digest.hexdigest()


def read_progress(source):
    """Files a previous, interrupted copy finished that still match the source. Each is re-hashed
    in the volume first: after a crash, a file can have its size but not all its bytes on disk."""
    wanted = {(p, s, m) for p, s, m in source}
    done, rehashed = {}, 0
    if os.path.exists(PROGRESS):
        with open(PROGRESS) as f:
            for line in f:
                try:
                    e = json.loads(line)
                except ValueError:
                    continue  # a line cut by a kill
                key = (e["path"], e["size"], e["mtime_ns"])
                dst = os.path.join(DST, e["path"])
                if key in wanted and os.path.isfile(dst) and os.path.getsize(dst) == e["size"]:
                    rehashed += e["size"]
                    if sha256_of(dst) == e["sha256"]:
                        done[e["path"]] = e
    return done, rehashed


def copy_file(path, mtime_ns):
    """Read once, in a three-stage pipeline: a reader thread, hashing here, a writer thread
    (file I/O and hashlib release the GIL, so the three overlap)."""
    src, dst = os.path.join(SRC, path), os.path.join(DST, path)
    os.makedirs(os.path.dirname(dst), exist_ok=True)
    digest = hashlib.sha256()
    tmp = dst + PARTIAL
    read_q, write_q = queue.Queue(maxsize=4), queue.Queue(maxsize=4)
    failure = []

    def read():
        try:
            with open(src, "rb") as fin:
                for chunk in iter(lambda: fin.read(CHUNK), b""):
                    read_q.put(chunk)
        except OSError as exc:
            failure.append(exc)
        finally:
            read_q.put(None)

    def write():
        try:
            with open(tmp, "wb") as fout:
                for chunk in iter(write_q.get, None):
                    if not failure:
                        fout.write(chunk)
        except OSError as exc:
            failure.append(exc)
            for _ in iter(write_q.get, None):  # drain so the pipeline never blocks
                pass

    stages = [threading.Thread(target=read), threading.Thread(target=write)]
    for stage in stages:
        stage.start()
    try:
        for chunk in iter(read_q.get, None):
            digest.update(chunk)
            write_q.put(chunk)
    finally:
        write_q.put(None)
        for stage in stages:
            stage.join()
    if failure:
        raise failure[0]
    os.utime(tmp, ns=(mtime_ns, mtime_ns))
    os.replace(tmp, dst)
    return digest.hexdigest()


def sync_files(paths):
    """Everything on disk before the manifest and marker say it is."""
    for path in paths:
        fd = os.open(os.path.join(DST, path), os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def copy():
    started = time.monotonic()
    source = listing()
    os.makedirs(STATE, exist_ok=True)
    if os.path.exists(MARKER):
        os.remove(MARKER)  # from here until the end, the volume is not complete
    done, rehashed = read_progress(source)
    todo = [(p, s, m) for p, s, m in source if p not in done]
    needed = sum(s for _, s, _ in todo)
    stat = os.statvfs(DST)
    free = stat.f_bavail * stat.f_frsize
    if needed > free:
        report(status="error", error="no space", needed_bytes=needed, free_bytes=free)
        return 3
    keep = {p for p, _, _ in source}
    for root, _, names in os.walk(DST):
        if root.startswith(STATE):
            continue
        for name in names:  # files no longer in the source, and pieces of an interrupted copy
            rel = os.path.relpath(os.path.join(root, name), DST)
            if rel not in keep or name.endswith(PARTIAL):
                os.remove(os.path.join(root, name))
    copied = 0
    with open(PROGRESS, "a") as progress:
        for path, size, mtime_ns in todo:
            try:
                sha = copy_file(path, mtime_ns)
            except OSError as exc:
                if exc.errno == errno.ENOSPC:
                    report(status="error", error="no space", needed_bytes=needed, copied_bytes=copied, file=path)
                    return 3
                raise
            entry = {"path": path, "size": size, "mtime_ns": mtime_ns, "sha256": sha}
            progress.write(json.dumps(entry) + "\n")
            progress.flush()
            done[path] = entry
            copied += size
    if listing() != source:
        report(status="error", error="the source changed during the copy; run again")
        return 2
    sync_files(p for p, _, _ in source)
    manifest = {"files": [done[p] for p, _, _ in source]}
    with open(MANIFEST + ".tmp", "w") as f:
        json.dump(manifest, f)
    os.replace(MANIFEST + ".tmp", MANIFEST)
    with open(MARKER, "w") as f:
        f.write(time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()) + "\n")
    total = sum(s for _, s, _ in source)
    report(status="copied", files=len(source), bytes=total, copied_bytes=copied, hashed_bytes=copied + rehashed,
           resumed_files=len(source) - len(todo), seconds=time.monotonic() - started)
    return 0


def verify():
    started = time.monotonic()
    manifest = load_json(MANIFEST, None)
    if manifest is None:
        report(status="corrupt", bad=[], error="no manifest: the volume was never completely copied")
        return 1
    bad, hashed = [], 0
    for e in manifest["files"]:
        dst = os.path.join(DST, e["path"])
        if not os.path.isfile(dst):
            bad.append(e["path"])
            continue
        hashed += os.path.getsize(dst)
        if sha256_of(dst) != e["sha256"]:
            bad.append(e["path"])
    if bad:
        for path in bad:  # the next copy fetches these again
            if os.path.exists(os.path.join(DST, path)):
                os.remove(os.path.join(DST, path))
        if os.path.exists(MARKER):
            os.remove(MARKER)
    report(status="corrupt" if bad else "verified", bad=bad, files=len(manifest["files"]), hashed_bytes=hashed,
           seconds=time.monotonic() - started)
    return 1 if bad else 0


if __name__ == "__main__":
    mode = sys.argv[1] if len(sys.argv) > 1 else ""
    actions = {"check": check, "copy": copy, "verify": verify}
    if mode not in actions:
        report(status="error", error=f"usage: check|copy|verify, not {mode!r}")
        sys.exit(2)
    try:
        sys.exit(actions[mode]())
    except OSError as exc:
        report(status="error", error=f"{exc.strerror}: {exc.filename}")
        sys.exit(2)
