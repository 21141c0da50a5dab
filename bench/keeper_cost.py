"""What the GPU policy keeper's watch costs while nothing happens: its CPU share of one core (#30).

Starts its own simulated rig, deploys the GPU policy (which starts the keeper), lets it settle,
then reads the keeper's CPU time (utime + stime of its main process, /proc/PID/stat, in clock
ticks) at the start and end of an idle window and prints the share of one core. The target is
under 0.5%. The simulated NVML (tests/simrig/pynvml.py) reads two small files per call, about
what a real NVML query costs; the rig shares this machine's cores with whatever else runs.

    flock /tmp/rigkit-docker.lock .venv/bin/python bench/keeper_cost.py [--window-s 60]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.conftest import run_deploy  # noqa: E402
from tests.simrig.rig import SimRig  # noqa: E402

PORT = 2232
TICKS = os.sysconf("SC_CLK_TCK")


def cpu_s(rig: SimRig, pid: str) -> float:
    fields = rig.exec(f"cat /proc/{pid}/stat")[1].rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS  # utime, stime (fields 14 and 15)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--window-s", type=float, default=60.0)
    args = parser.parse_args()
    rig = SimRig(name="rigkit-bench-keeper-cost", ssh_port=PORT).start(log=lambda m: None)
    try:
        run = run_deploy(rig, verify=False)
        if run.returncode != 0:
            sys.exit(run.output[-3000:])
        time.sleep(5)
        pid = rig.exec("systemctl show -p MainPID --value rigkit-gpu-keeper.service")[1].strip()
        start_cpu, start = cpu_s(rig, pid), time.monotonic()
        time.sleep(args.window_s)
        used, wall = cpu_s(rig, pid) - start_cpu, time.monotonic() - start
        same = rig.exec("systemctl show -p MainPID --value rigkit-gpu-keeper.service")[1].strip() == pid
        print(f"keeper (pid {pid}{'' if same else ', RESTARTED during the window'}): {used:.2f} s of CPU over "
              f"{wall:.1f} s idle = {100 * used / wall:.3f}% of one core (target < 0.5%)")
    finally:
        rig.remove()


if __name__ == "__main__":
    main()
