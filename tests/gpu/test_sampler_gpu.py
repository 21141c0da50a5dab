"""The telemetry sampler on a real NVIDIA GPU under load (skipped where there is none).

Nothing is simulated here: real NVML through nvidia-ml-py, a real bf16 matrix-multiply
load through PyTorch. It ONLY READS the GPU: no power limit, clock lock, persistence
mode or any other setting is changed; the clock-lock verdict is computed for declared
ceilings above and below what the card reached, never by locking anything.

Runs on the lent H200 with: python3 -m pytest --noconftest tests/gpu (see docs/verification.md).
"""

from __future__ import annotations

import json
import os
import time

import pytest

pynvml = pytest.importorskip("pynvml")
torch = pytest.importorskip("torch")

from rigkit.verify.checks import check_clock_ceiling, check_sample_rate, gpu_load  # noqa: E402
from rigkit.verify.telemetry import Sampler  # noqa: E402
from tests.gpu.gpu import have_gpu  # noqa: E402

LOAD_S = 12.0
IDLE_EDGE_S = 1.0




pytestmark = pytest.mark.skipif(not have_gpu(), reason="no NVIDIA GPU with NVML and CUDA here")


def _matmul_load(seconds: float) -> int:
    a = torch.randn(8192, 8192, dtype=torch.bfloat16, device="cuda")
    b = torch.randn(8192, 8192, dtype=torch.bfloat16, device="cuda")
    deadline = time.monotonic() + seconds
    iterations = 0
    while time.monotonic() < deadline:  # bounded by time
        for _ in range(20):
            a @ b
        torch.cuda.synchronize()
        iterations += 20
    return iterations


def test_sampler_under_load_rate_energy_and_clock_verdicts():
    sampler = Sampler([0], hz=50).start()
    time.sleep(IDLE_EDGE_S)
    iterations = _matmul_load(LOAD_S)
    time.sleep(IDLE_EDGE_S)
    run = sampler.stop()

    gpu = run["gpus"][0]
    load = gpu_load(gpu, run["t_start"], run["t_end"])
    above = check_clock_ceiling(load, int(load.max_sm_mhz) + 100)
    below = check_clock_ceiling(load, int(load.max_sm_mhz) - 100)
    energy_error = abs(load.integrated_energy_j - load.energy_counter_j) / load.energy_counter_j
    figures = {
        "gpu": gpu["name"],
        "iterations": iterations,
        "samples": load.samples,
        "samples_per_s": load.samples_per_s,
        "duration_s": load.duration_s,
        "max_sm_mhz": load.max_sm_mhz,
        "max_clock_sm_mhz_hw": gpu["max_clock_sm_mhz"],
        "mean_power_under_load_w": load.mean_power_under_load_w,
        "enforced_limit_w": load.enforced_limit_w,
        "energy_counter_j": load.energy_counter_j,
        "integrated_energy_j": load.integrated_energy_j,
        "energy_error": energy_error,
        "instant_power_supported": any(v is not None for v in gpu["samples"]["power_instant_w"]),
        "event_reasons_seen": sorted({r for r in gpu["samples"]["event_reasons"] if r is not None}),
        "verdict_above": above.message,
        "verdict_below": below.message,
    }
    print(json.dumps(figures, indent=2))
    if os.environ.get("OUT"):
        with open(os.path.join(os.environ["OUT"], "gpu_sampler_figures.json"), "w") as f:
            json.dump({"figures": figures, "run": run}, f)

    assert check_sample_rate(load).passed, figures
    assert energy_error < 0.05, figures
    assert above.passed, figures
    assert not below.passed and "lock not in effect" in below.message, figures
