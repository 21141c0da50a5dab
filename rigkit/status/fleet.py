"""`rigkit status INVENTORY`, on the control machine: status.py run on every rig at once (read-only)
under one deadline, each rig's document gathered from where rigkit/status/collect.py left it (or, for a
rig without one, why: pyinfra's own words), one table per rig, a summary line, one JSON document.
Exit 0 when every rig is as its config says, 1 on drift, a failure or an unreachable rig."""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

from rigkit.plumbing.pyinfra_command import PYINFRA
from rigkit.status.collect import document_path
from rigkit.status.report import unreachable
from rigkit.status.table import status_table

STATUS_DEADLINE_S = 120  # the whole `rigkit status` run; a rig past it is reported without an answer


def fleet_status(inventory: str, names: list[str], limit: str | None, json_path: Path | None) -> int:
    """Read the rigs `names` of `inventory` (checked offline before; `limit` as the user gave it), print
    the report and write it to `json_path`; the command's exit code."""
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="rigkit-status-") as folder:
        command = [*PYINFRA, "-y", "--data", f"rigkit_status_dir={folder}",
                   "--data", f"rigkit_status_inventory={inventory}"]
        if limit:
            command += ["--limit", limit]
        late = False
        try:  # every read on a rig is bounded (rigkit.plumbing.rig_reads); this bounds the whole run too
            run = subprocess.run(command + [inventory, "status.py"], capture_output=True, text=True,
                                 timeout=STATUS_DEADLINE_S)
        except subprocess.TimeoutExpired as expired:  # subprocess.run killed pyinfra
            late, run = True, subprocess.CompletedProcess(expired.cmd, 0, _decoded(expired.stdout), _decoded(expired.stderr))
        output = run.stdout + run.stderr
        now = datetime.now(timezone.utc)
        rigs = []
        for name in names:
            path = document_path(Path(folder), name)
            why = f"no answer within {STATUS_DEADLINE_S} s" if late else _why(output, name)
            rigs.append(json.loads(path.read_text()) if path.is_file() else unreachable(name, why, now))
    if all(not r["reachable"] for r in rigs) and "No hosts remaining" not in output and run.returncode != 0:
        print(output[-3000:], file=sys.stderr)  # not a connection problem: a config error, a bug
        return 2
    document = {"inventory": inventory, "checked_at": now.isoformat(timespec="seconds"),
                "wall_s": round(time.monotonic() - started, 2), "ok": all(r["ok"] for r in rigs), "rigs": rigs}
    for rig in rigs:
        print(status_table(rig) + "\n")
    drift = sum(len(r["drift"]) for r in rigs)
    failed = sum(len(r["failures"]) for r in rigs)
    print(f"rigkit status: {len(rigs)} rig(s), {sum(not r['reachable'] for r in rigs)} unreachable, "
          f"{drift} drift, {failed} failure(s) in {document['wall_s']:.1f} s")
    if json_path:
        json_path.write_text(json.dumps(document, indent=2) + "\n")
    return 0 if document["ok"] else 1


def _decoded(data) -> str:
    return data.decode(errors="replace") if isinstance(data, bytes) else (data or "")


def _why(output: str, name: str) -> str:
    """pyinfra's own words about a rig it could not reach."""
    said = [line.strip() for line in output.splitlines() if f"[{name}]" in line and "Ready" not in line]
    return " ".join(said)[-400:] or "no answer (pyinfra did not reach it; run pyinfra with -v to see why)"
