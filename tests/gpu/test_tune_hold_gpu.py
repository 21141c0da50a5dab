"""`rigkit tune --hold`'s measuring loop on a real NVIDIA GPU (skipped where there is none): the
run-to-run noise that decides how many repeats a real sweep needs.

Real: the GPU doing the work (tests/gpu/llm_server.py: a randomly initialised model served over
HTTP with PyTorch), NVML through nvidia-ml-py sampling in this process, the benchmark client over
HTTP on 127.0.0.1, and the same loop `rigkit tune --hold` runs (rigkit.tune.measure.hold), minus
SSH. Simulated: nothing but the weights (random). It ONLY READS the GPU: no power limit, clock
lock, offset or other setting is changed (the test checks the enforced limit before and after).

Runs on the lent H200 with: python3 -m pytest --noconftest -s tests/gpu/test_tune_hold_gpu.py
It prints the decode tok/s CV and the repeats per cell that a 1% and a 2% difference need.
"""

from __future__ import annotations

import os
import time

import pytest

pynvml = pytest.importorskip("pynvml")
pytest.importorskip("torch")
pytest.importorskip("transformers")
httpx = pytest.importorskip("httpx")

from rigkit.tune.measure import BenchSettings, LocalSampling, hold, hold_text, measure_once  # noqa: E402
from tests.gpu.gpu import have_gpu, llm_server  # noqa: E402

REPEATS = int(os.environ.get("RIGKIT_HOLD_REPEATS", "8"))
SETTINGS = BenchSettings(prompt_tokens=1024, output_tokens=256, timeout_s=300)

pytestmark = pytest.mark.skipif(not have_gpu(), reason="no NVIDIA GPU with NVML and CUDA here")


@pytest.fixture(scope="module")
def server():
    with llm_server() as url:
        yield url


def _enforced_w() -> float:
    pynvml.nvmlInit()
    try:
        return pynvml.nvmlDeviceGetEnforcedPowerLimit(pynvml.nvmlDeviceGetHandleByIndex(0)) / 1000
    finally:
        pynvml.nvmlShutdown()


def test_hold_reports_the_run_to_run_noise_and_changes_nothing(server):
    limit_before = _enforced_w()
    started = time.monotonic()
    result = hold(lambda: measure_once(server, "gpu-llm", LocalSampling([0]), SETTINGS), REPEATS,
                  lambda n, f: print(f"  [{n}/{REPEATS}] decode {f.decode_tok_s:.2f} tok/s, prefill "
                                     f"{f.prefill_tok_s:.0f} tok/s, {f.mean_power_w or 0:.0f} W", flush=True))
    wall_s = time.monotonic() - started
    print()
    print(hold_text(result))
    print(f"{REPEATS} measurements ({SETTINGS.prompt_tokens} prompt / {SETTINGS.output_tokens} output tokens) "
          f"in {wall_s:.1f} s; decode 95% interval half-width "
          f"{result.decode_tok_s.half_width / result.decode_tok_s.mean:.2%} of the mean")
    assert len(result.readings) == REPEATS
    assert result.decode_cv is not None and result.decode_cv < 0.5  # a real rate, not a broken run
    assert all(f.gpus and f.gpus[0].mean_power_under_load_w for f in result.readings)  # measured draw, decode phase
    assert _enforced_w() == limit_before  # only read
