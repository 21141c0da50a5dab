"""Idle energy on a real NVIDIA GPU (issue #51): the GPU keeper's ledger (rigkit/rigside/idle_energy.py), fed by
its own NVML reader (read_gpu) at the keeper's 1.5 s, first with no work on the GPU, then under a matrix-multiply
loop. Idle must read idle (NVML's utilization 0) and its energy, from the energy counter, must agree with the
power NVML reports over the same time; under load, next to nothing may count as idle.

Nothing is simulated. It ONLY READS the GPU's settings (checked equal before and after) and loads it with work:
no power limit, clock lock, offset, persistence mode or application clocks are changed.

Runs on the lent H200 with: python3 -m pytest --noconftest -s tests/gpu (docs/verification.md). The figures it
prints (and writes to $RIGKIT_GPU_OUT/idle-energy.json where that is set) go in the closing note.
"""

from __future__ import annotations

import json
import os
import select
import statistics
import subprocess
import sys
import time

import pytest

pynvml = pytest.importorskip("pynvml")
pytest.importorskip("torch")

from rigkit.rigside import idle_energy  # noqa: E402
from tests.gpu.gpu import have_gpu, settings  # noqa: E402

pytestmark = pytest.mark.skipif(not have_gpu(), reason="no NVIDIA GPU with NVML and CUDA here")

EVERY_S = 1.5  # the keeper's watch
PHASE_S = 24.0
BUSY_WAIT_S = 120.0  # the load's CUDA start, bounded
AGREE_WITHIN = 0.10  # the counter's idle draw against NVML's power readings

LOAD = """
import sys, time, torch
a = torch.rand(8192, 8192, device="cuda")
print("busy", flush=True)
end = time.monotonic() + float(sys.argv[1])
while time.monotonic() < end:
    a = (a @ a).clamp_(-1, 1)
    torch.cuda.synchronize()
"""


def phase(handle, ledger_path) -> dict:
    """PHASE_S of the keeper's sampling into a ledger of its own: what last_day makes of it, and NVML's power
    readings taken with the samples."""
    ledger = idle_energy.Ledger(str(ledger_path))
    powers, utilizations = [], []
    end = time.monotonic() + PHASE_S
    while time.monotonic() < end:
        energy_j, power_w, utilization = idle_energy.read_gpu(pynvml, handle)
        assert energy_j is not None and power_w is not None and utilization is not None, (energy_j, power_w, utilization)
        ledger.add(0, time.monotonic(), energy_j, power_w, utilization)
        powers.append(power_w)
        utilizations.append(utilization)
        time.sleep(EVERY_S)
    ledger.save(force=True)
    day = idle_energy.last_day(json.loads(ledger_path.read_text()), time.time())
    gpu = day["gpus"][0]
    return {"measured_s": gpu["measured_s"], "idle_s": gpu["idle_s"], "idle_w": gpu["idle_w"],
            "idle_kwh": gpu["idle_kwh"], "mean_power_w": round(statistics.mean(powers), 1),
            "utilization": [min(utilizations), max(utilizations)]}


def test_the_keepers_ledger_counts_idle_energy_as_nvml_reports_it_and_not_work(tmp_path):
    pynvml.nvmlInit()
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    name = pynvml.nvmlDeviceGetName(handle)
    before = settings(handle)
    idle = phase(handle, tmp_path / "idle.json")
    load = subprocess.Popen([sys.executable, "-c", LOAD, str(PHASE_S + BUSY_WAIT_S)], stdout=subprocess.PIPE, text=True)
    try:
        started, _, _ = select.select([load.stdout], [], [], BUSY_WAIT_S)
        assert started and load.stdout.readline().strip() == "busy", f"the load did not start within {BUSY_WAIT_S:g} s"
        deadline = time.monotonic() + BUSY_WAIT_S
        while pynvml.nvmlDeviceGetUtilizationRates(handle).gpu == 0 and time.monotonic() < deadline:
            time.sleep(0.2)
        busy = phase(handle, tmp_path / "busy.json")
    finally:
        load.kill()
        load.wait(timeout=30)
    after = settings(handle)
    pynvml.nvmlShutdown()
    figures = {"gpu": name, "every_s": EVERY_S, "idle": idle, "busy": busy}
    print("\nidle energy:", json.dumps(figures))
    if os.environ.get("RIGKIT_GPU_OUT"):
        with open(os.path.join(os.environ["RIGKIT_GPU_OUT"], "idle-energy.json"), "w") as f:
            json.dump(figures, f, indent=1)
    assert after == before, f"a GPU setting changed: {before} -> {after}"
    assert idle["measured_s"] >= PHASE_S - 2 * EVERY_S - 1, figures
    assert idle["idle_s"] >= 0.9 * idle["measured_s"], figures  # nothing ran: idle
    assert abs(idle["idle_w"] - idle["mean_power_w"]) <= AGREE_WITHIN * idle["mean_power_w"], figures
    assert busy["measured_s"] >= PHASE_S - 2 * EVERY_S - 1, figures
    assert busy["idle_s"] <= 0.1 * busy["measured_s"], figures  # the load's work is not idle
