"""The whole verification path on a real NVIDIA GPU (skipped where there is none).

Real: the GPU doing the work (a randomly initialised Llama from `transformers`, served by
tests/gpu/llm_server.py, which is test infrastructure and records when it emitted each
token: the truth), NVML through nvidia-ml-py sampling at 50 Hz, the benchmark client over
HTTP on 127.0.0.1, the phase-energy arithmetic. Simulated: nothing but the model's weights
(random) and its tokenizer (words hashed into the vocabulary). It ONLY READS the GPU: no
power limit, clock lock, persistence mode or any other setting is changed.

Runs on the lent H200 with: python3 -m pytest --noconftest -s tests/gpu (docs/verification.md).
"""

from __future__ import annotations

import json
import os
import time

import pytest

pynvml = pytest.importorskip("pynvml")
torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
httpx = pytest.importorskip("httpx")

from rigkit.verify.checks import check_sample_rate, gpu_load  # noqa: E402
from rigkit.verify.client import run_bench  # noqa: E402
from rigkit.verify.energy import phase  # noqa: E402
from rigkit.verify.telemetry import Sampler  # noqa: E402
from tests.gpu.gpu import have_gpu, llm_server  # noqa: E402

PROMPT_TOKENS = 2048
OUTPUT_TOKENS = 512


pytestmark = pytest.mark.skipif(not have_gpu(), reason="no NVIDIA GPU with NVML and CUDA here")


@pytest.fixture(scope="module")
def server():
    with llm_server() as url:
        yield url


def test_decode_matches_the_servers_own_figure_and_energy_splits_by_phase(server):
    sampler = Sampler([0], hz=50).start()
    time.sleep(1.0)
    bench = run_bench(server, "gpu-llm", PROMPT_TOKENS, OUTPUT_TOKENS, timeout_s=300, seed=7)
    time.sleep(0.5)
    telemetry = sampler.stop()
    # The measured request's own figures: the only one of the run with OUTPUT_TOKENS (the warm-up, the prompt's
    # calibration requests and the prefix cache's repeat ask for 1-4).
    [truth] = [t for t in httpx.get(f"{server}/truth", timeout=10).json() if t["completion_tokens"] == OUTPUT_TOKENS]

    load = gpu_load(telemetry["gpus"][0], telemetry["t_start"], telemetry["t_end"])
    prefill = phase(telemetry, "prefill", bench.wall_send_s, bench.wall_first_token_s)
    decode = phase(telemetry, "decode", bench.wall_first_token_s, bench.wall_last_token_s)
    decode_error = abs(bench.decode_tok_s - truth["server_decode_tok_s"]) / truth["server_decode_tok_s"]
    figures = {
        "gpu": telemetry["gpus"][0]["name"],
        "driver": telemetry.get("driver_version"),
        "client_decode_tok_s": bench.decode_tok_s,
        "server_decode_tok_s": truth["server_decode_tok_s"],
        "decode_error": decode_error,
        "client_ttft_s": bench.ttft_s,
        "server_ttft_s": truth["server_ttft_s"],
        "prefill_tok_s": bench.prefill_tok_s,
        "prefill_source": bench.prefill_source,
        "completion_tokens_from_usage": bench.completion_tokens,
        "samples_per_s": load.samples_per_s,
        "prefill_phase": vars(prefill),
        "decode_phase": vars(decode),
        "decode_tok_s_per_watt": bench.decode_tok_s / decode.mean_power_w if decode.mean_power_w else None,
        "joules_per_output_token": decode.energy_j / bench.completion_tokens if decode.energy_j else None,
        "energy_counter_j": load.energy_counter_j,
        "integrated_energy_j": load.integrated_energy_j,
        "checks": [(c.name, c.passed, c.message) for c in bench.checks],
    }
    print(json.dumps(figures, indent=2, default=str))
    if os.environ.get("OUT"):
        with open(os.path.join(os.environ["OUT"], "gpu_verification_figures.json"), "w") as f:
            json.dump({"figures": figures, "bench": bench.to_json()}, f, default=str)

    assert bench.passed, figures["checks"]
    assert bench.completion_tokens == OUTPUT_TOKENS and bench.prompt_tokens == PROMPT_TOKENS
    assert decode_error < 0.01, figures
    assert check_sample_rate(load).passed, figures
    assert prefill.energy_j and decode.energy_j and decode.samples >= 10, figures
    assert prefill.mean_power_w > 0 and decode.mean_power_w > 0, figures
