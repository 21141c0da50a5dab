"""check: the source's paths, sizes and mtimes against the volume's manifest (reads no file contents);
the deploy's read-only fact. Also the source's listing, which copy uses."""

import hashlib
import json
import os

from . import state
from .state import SourceError, inside, load_json, report, state_path


def _raise(error):
    raise SourceError(f"cannot list the source: {error.strerror}: {error.filename}")


def listing():
    """[(path, size, mtime_ns)] of every file under SRC, sorted; a symlink counts as the file it
    resolves to, which must lie inside ROOT. Reads metadata only."""
    if not os.path.isdir(state.SRC):
        raise SourceError(f"the source folder {state.SRC} does not exist (or is not a folder)")
    root = os.path.realpath(state.ROOT)
    files = []
    for folder, dirs, names in os.walk(state.SRC, onerror=_raise):
        for name in sorted(dirs):
            if os.path.islink(os.path.join(folder, name)):
                raise SourceError(f"{os.path.join(folder, name)} is a symlink to a folder; link files, not folders")
        dirs.sort()
        for name in names:
            full = os.path.join(folder, name)
            if os.path.islink(full):
                target = os.path.realpath(full)
                if not inside(target, root):
                    raise SourceError(f"{full} links to {target}, outside {state.ROOT}; copy the file there instead")
                if not os.path.isfile(target):
                    raise SourceError(f"{full} is a dangling symlink (to {os.readlink(full)}); "
                                      "the download is incomplete")
            elif not os.path.isfile(full):
                continue  # sockets, fifos: not weights
            try:
                st = os.stat(full)
            except OSError as exc:
                raise SourceError(f"cannot read {full}: {exc.strerror}") from None
            files.append((os.path.relpath(full, state.SRC), st.st_size, st.st_mtime_ns))
    if not files:
        raise SourceError(f"the source folder {state.SRC} has no files")
    return sorted(files)


def manifest_listing(manifest):
    return sorted((e["path"], e["size"], e["mtime_ns"]) for e in manifest.get("files", []))


def check():
    if state.SRC == "-":  # weights from another rig: this volume's own state; the deploy compares it with that rig's
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
