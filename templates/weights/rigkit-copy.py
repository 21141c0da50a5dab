"""rigkit weights copier: runs inside a short-lived helper container on the rig, or (check
only) on the rig itself as the deploy's read-only fact.

    python3 -c "<this file>" check|copy|verify [SRC DST [ROOT]]
    python3 -c "<this file>" check-each NAME SRC DST ROOT [NAME SRC DST ROOT ...]

SRC is the model folder (default /src; mounted read-only: the source is never written);
DST the Docker volume (default /dst); ROOT the folder symlinks may point into (default
SRC). In a Hugging Face cache, models--ORG--NAME/snapshots/<revision>/ holds only symlinks
into ../../blobs/: ROOT is then models--ORG--NAME, and the content behind each link is
copied under the link's name. A link that dangles or leaves ROOT is an error, as is a
source that is missing, empty or cannot be listed: the volume is never marked complete
with files missing. Standard library only: the helper image is any image with python3
(by default the model's own serving image, which the rig has).

State in the volume, under DST/.rigkit/:
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

SRC, DST, ROOT = "/src", "/dst", "/src"  # set from the command line in main()
PARTIAL = ".rigkit-partial"
CHUNK = 16 * 1024 * 1024


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
    source = listing()  # first: a source that cannot be copied whole is an error, never "unchanged"
    complete = os.path.exists(state_path("complete"))
    same = complete and manifest_listing(load_json(state_path("manifest.json"), {})) == source
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
                    if sha256_of(dst) == e["sha256"]:
                        done[e["path"]] = e
    return done, rehashed


def copy_file(path, mtime_ns):
    """Read once, in a three-stage pipeline: a reader thread, hashing here, a writer thread
    (file I/O and hashlib release the GIL, so the three overlap). Any stage's failure (a full
    disk at a write or at close) ends all three: nothing waits for a signal that is gone."""
    src, dst = os.path.join(SRC, path), os.path.join(DST, path)
    os.makedirs(os.path.dirname(dst), exist_ok=True)
    digest = hashlib.sha256()
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
            digest.update(chunk)
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
    copied = 0
    with open(state_path("progress.jsonl"), "a") as progress:
        for path, size, mtime_ns in todo:
            if os.path.isfile(os.path.join(DST, path)):
                os.remove(os.path.join(DST, path))  # the old version goes before the new one arrives
            try:
                sha = copy_file(path, mtime_ns)
            except OSError as exc:
                if exc.errno in (errno.ENOSPC, errno.EDQUOT):
                    free = os.statvfs(DST).f_bavail * os.statvfs(DST).f_frsize
                    report(status="error", error="no space", needed_bytes=needed - copied, free_bytes=free,
                           copied_bytes=copied, file=path)
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
    with open(state_path("manifest.json.tmp"), "w") as f:
        json.dump(manifest, f)
    os.replace(state_path("manifest.json.tmp"), state_path("manifest.json"))
    with open(state_path("complete"), "w") as f:
        f.write(time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()) + "\n")
    total = sum(s for _, s, _ in source)
    report(status="copied", files=len(source), bytes=total, copied_bytes=copied, hashed_bytes=copied + rehashed,
           resumed_files=len(source) - len(todo), seconds=time.monotonic() - started)
    return 0


def verify():
    started = time.monotonic()
    manifest = load_json(state_path("manifest.json"), None)
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
        if os.path.exists(state_path("complete")):
            os.remove(state_path("complete"))
    report(status="corrupt" if bad else "verified", bad=bad, files=len(manifest["files"]), hashed_bytes=hashed,
           seconds=time.monotonic() - started)
    return 1 if bad else 0


def main(argv):
    global SRC, DST, ROOT
    if len(argv) >= 2 and argv[1] == "check-each":
        return check_each(argv)
    actions = {"check": check, "copy": copy, "verify": verify}
    if len(argv) < 2 or argv[1] not in actions or len(argv) > 5:
        report(status="error", error=f"usage: check|copy|verify [SRC DST [ROOT]], not {argv[1:]!r}")
        return 2
    SRC, DST = (argv[2], argv[3]) if len(argv) >= 4 else (SRC, DST)
    ROOT = argv[4] if len(argv) == 5 else SRC
    try:
        return actions[argv[1]]()
    except SourceError as exc:
        report(status="error", error=str(exc))
        return 2
    except OSError as exc:
        if exc.errno in (errno.ENOSPC, errno.EDQUOT):
            report(status="error", error="no space", needed_bytes=0, free_bytes=0)
            return 3
        report(status="error", error=f"{exc.strerror}: {exc.filename}")
        return 2


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
