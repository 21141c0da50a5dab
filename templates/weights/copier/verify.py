"""verify: every file in the volume re-read against the manifest and proven again; files that fail and
the marker are removed, so the next copy fetches them."""

import os
import time

from . import state
from .proofs import Proof, hub_name, prove, proven
from .state import PROOFS, hold_volume, load_json, report, state_path


def verify():
    started = time.monotonic()
    held = hold_volume()  # noqa: F841: it removes files; released when the process ends
    manifest = load_json(state_path("manifest.json"), None)
    if manifest is None:
        report(status="corrupt", bad=[], error="no manifest: the volume was never completely copied")
        return 1
    bad, reasons, hashed, checked = [], {}, 0, []
    for e in manifest["files"]:
        dst = os.path.join(state.DST, e["path"])
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
            if os.path.exists(os.path.join(state.DST, path)):
                os.remove(os.path.join(state.DST, path))
        if os.path.exists(state_path("complete")):
            os.remove(state_path("complete"))
    report(status="corrupt" if bad else "verified", bad=bad, reasons=reasons, files=len(manifest["files"]),
           hashed_bytes=hashed, proven=proven(checked), seconds=time.monotonic() - started)
    return 1 if bad else 0
