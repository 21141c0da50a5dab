"""Does `rigkit status` fan out? Wall time for 1 and for 8 rigs, side by side in one run.

The 8 rigs are 8 inventory hosts with distinct names on the one simulated rig (same SSH
endpoint; tests/data/status-fleet.py), so each does the whole read: an SSH connection, nvidia-smi,
the weights facts, the status probe with a one-token completion per model. A ratio near 1 means
the rigs were read in parallel; near 8, one after another. On one simulated rig the 8 reads share
its CPU (and this machine's), so the ratio is an upper bound for 8 real rigs.

Needs the demo rig (`./run demo`, or `python -m tests.simrig`) on RIGKIT_SIM_PORT (default 2222);
it uses Docker on the rig, so run it under the shared lock:

    flock -w 3000 /tmp/rigkit-docker.lock .venv/bin/python bench/status_fleet.py
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]



def status_wall_s(rigs: int) -> tuple[float, int]:
    env = dict(os.environ, RIGKIT_SIM_PORT=os.environ.get("RIGKIT_SIM_PORT", "2222"),
               RIGKIT_STATE=os.environ.get("RIGKIT_STATE", str(REPO / ".state")),
               RIGKIT_RIG_FILE="inventory/rigs/sim.yml", RIGKIT_STATUS_RIGS=str(rigs))
    started = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "rigkit.cli", "status", "tests/data/status-fleet.py"],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    wall = time.monotonic() - started
    if "rig(s)" not in proc.stdout:
        sys.exit(f"rigkit status did not run (exit {proc.returncode}):\n{(proc.stdout + proc.stderr)[-2000:]}")
    return wall, proc.returncode


def main() -> None:
    walls: dict[int, list[float]] = {1: [], 8: []}
    for rigs in (1, 8, 8, 1):
        wall, code = status_wall_s(rigs)
        walls[rigs].append(wall)
        print(f"rigkit status, {rigs} rig(s): {wall:6.2f} s (exit {code})", flush=True)
    one, eight = (sum(walls[n]) / len(walls[n]) for n in (1, 8))
    print(f"mean wall time: 1 rig {one:.2f} s, 8 rigs {eight:.2f} s; ratio 8/1 = {eight / one:.2f} "
          f"(8.00 would be one rig after another)")


if __name__ == "__main__":
    main()
