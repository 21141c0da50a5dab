"""How long a `rigkit tune` sweep takes on the simulated rig, and how much of it is not measuring.

Starts its own simulated rig (tests/simrig: systemd, sshd on 127.0.0.1, real SSH) with one
simulated RTX 3090 whose settings the vLLM stand-in follows, deploys the tune test rig
(tests/data/tune: GPU policy + the stand-in), then runs the real command once:

    rigkit tune --power-limits 200:350:50 --repeats 4 (prompt 256 / output 64 tokens)

and prints, from that one run: the wall time, the time inside the benchmark's requests, and the
shares spent applying cells (arming the dead man's switch, setting, reading back), starting and
stopping the NVML sampler over SSH, and everything else (connect, install, read, restore, report).
The stand-in decodes at the curve's ~35 tok/s, so the request share is the simulated GPU's time.

    .venv/bin/python bench/tune_sweep.py
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.conftest import STATE_ROOT, run_deploy  # noqa: E402
from tests.simrig.rig import SimGpu, SimRig  # noqa: E402
from tests.simrig.weights import SIM_MODELS, ensure_checkpoint  # noqa: E402
from tests.vllm_standin.image import ensure_standin_image  # noqa: E402

PORT = 2251
CARD = SimGpu(name="NVIDIA GeForce RTX 3090", min_w=100, max_w=400, default_w=350, max_clock_mhz=2100,
              tune_profile="rtx3090")


def main() -> int:
    ensure_standin_image()
    ensure_checkpoint("tune-sim")
    rig = SimRig(name="rigkit-bench-tune", ssh_port=PORT, gpus=[CARD], shared_gpu_dir=SIM_MODELS / "tune-sim" / "gpu")
    rig.start()
    try:
        with tempfile.TemporaryDirectory() as folder:
            folder = Path(folder)
            (folder / "rigs").mkdir()
            shutil.copy(REPO / "tests/data/tune/rigs/tune.yml", folder / "rigs" / "tune.yml")
            shutil.copytree(REPO / "tests/data/tune/models", folder / "models")
            deployed = run_deploy(rig, folder / "rigs" / "tune.yml", catalog=folder / "models", verify=False)
            if deployed.returncode != 0:
                print(deployed.output[-3000:])
                return 1
            env = dict(os.environ, RIGKIT_SIM_PORT=str(PORT), RIGKIT_RIG_FILE=str(folder / "rigs" / "tune.yml"),
                       RIGKIT_CATALOG_DIR=str(folder / "models"), RIGKIT_STATE=str(STATE_ROOT))
            out = folder / "sweep.json"
            started = time.monotonic()
            run = subprocess.run([sys.executable, "-m", "rigkit.cli", "tune", "inventory/sim.py", "--rig", "sim-rig",
                                  "--model", "tune-sim", "--power-limits", "200:350:50", "--repeats", "4",
                                  "--prompt-tokens", "256", "--output-tokens", "64", "--json", str(out)],
                                 cwd=REPO, env=env, capture_output=True, text=True)
            wall_s = time.monotonic() - started
            if run.returncode != 0:
                print(run.stdout + run.stderr)
                return 1
            doc = json.loads(out.read_text())
    finally:
        import docker

        for c in docker.from_env().containers.list(all=True, filters={"label": "com.docker.compose.project=rigkit-tune-sim"}):
            c.remove(force=True)
        rig.remove()
    measurements = len(doc["readings"])
    requests_s = doc["measure_s"] - doc["sampler_s"]
    print(f"sweep: {len(doc['table'])} cells, {measurements} measurements, {wall_s:.1f} s wall (the command)")
    for name, seconds in (("benchmark requests (port forward + warm-up + measured request)", requests_s),
                          ("sampler start/stop over SSH", doc["sampler_s"]),
                          ("applying cells (arm switch, set, read back)", doc["apply_s"]),
                          ("everything else (start-up, read, screen, restore, report)",
                           wall_s - doc["measure_s"] - doc["apply_s"])):
        print(f"  {name:<66} {seconds:7.1f} s  {seconds / wall_s:6.1%}")
    print(f"share outside measurement: {1 - requests_s / wall_s:.1%}; per measurement: "
          f"{wall_s / measurements:.2f} s, of which {requests_s / measurements:.2f} s in requests")
    return 0


if __name__ == "__main__":
    sys.exit(main())
