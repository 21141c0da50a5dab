"""How fast the GPU policy keeper repairs each cause of a lost policy (#30), on a simulated rig.

Starts its own simulated rig (tests/simrig: systemd as PID 1, sshd on 127.0.0.1), deploys the GPU
policy (tests/data/rigs/policy.yml: two GPUs at 330 W, clocks locked 0,2200), then per cause loses
the policy REPEATS times the way tests/test_gpu_keeper.py does (resume: the GPUs' defaults written
into the simulated GPU, then the unit the sleep targets pull in; driver: the same, then
nvidia-persistenced restarted; reset: one GPU back at its defaults, noticed by the watch;
changed-by-hand: `nvidia-smi -i 0 -pl 300`) and times each from the loss to the policy read back
from the simulated GPU's own state with the keeper's event logged. Prints each cause's median,
p90 and max, and the keeper's event counts. Run it under the Docker lock:

    flock /tmp/rigkit-docker.lock .venv/bin/python bench/keeper_repairs.py [--repeats 20]
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.conftest import run_deploy  # noqa: E402
from tests.simrig.rig import SimRig  # noqa: E402
from tests.test_gpu_keeper import keeper_state, lose, repair, settle  # noqa: E402

PORT = 2231
CAUSES = {
    "resume": lambda rig: lose(rig) + " && systemctl start rigkit-gpu-keeper-resume.service",
    "driver": lambda rig: lose(rig) + " && systemctl restart nvidia-persistenced.service",
    "reset": lambda rig: lose(rig, (1,)),
    "changed-by-hand": lambda rig: "nvidia-smi -i 0 -pl 300",
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args()
    rig = SimRig(name="rigkit-bench-keeper", ssh_port=PORT).start(log=lambda m: None)
    try:
        run = run_deploy(rig, verify=False)
        if run.returncode != 0:
            sys.exit(run.output[-3000:])
        for cause, command in CAUSES.items():
            times = []
            for _ in range(args.repeats):
                times.append(repair(rig, command(rig), cause))
                settle(rig)
            times.sort()
            print(f"{cause:16s} n={len(times):3d}  median {statistics.median(times):5.2f} s  "
                  f"p90 {times[int(0.9 * (len(times) - 1))]:5.2f} s  max {times[-1]:5.2f} s", flush=True)
        print(f"keeper's counts: {keeper_state(rig)['counts']}")
    finally:
        rig.remove()


if __name__ == "__main__":
    main()
