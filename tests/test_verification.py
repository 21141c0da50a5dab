"""Verification arithmetic and verdicts: pure functions on synthetic telemetry."""

from __future__ import annotations

from dataclasses import replace

import pytest

from rigkit.config.loader import load_rig
from rigkit.verify.checks import (
    Check,
    check_clock_ceiling,
    check_enforced_limit,
    check_power_under_load,
    gpu_load,
    integrate_power,
)
from rigkit.verify.client import BenchResult
from rigkit.verify.result import build_result, regressions, roofline_tok_s
from tests.conftest import REPO


def telemetry(sm=2190, power=300.0, limit=330.0, hz=50, seconds=4.0, energy_j=None):
    n = int(hz * seconds)
    t = [100.0 + i / hz for i in range(n)]
    samples = {
        "t": t, "sm_mhz": [sm] * n, "mem_mhz": [10501] * n, "temp_c": [60] * n, "event_reasons": [4] * n,
        "enforced_limit_w": [limit] * n, "power_instant_w": [power] * n, "power_average_w": [power] * n,
    }
    energy = power * seconds if energy_j is None else energy_j
    gpu = {"index": 0, "name": "NVIDIA GeForce RTX 4090", "default_limit_w": 450.0, "samples": samples,
           "energy_start_mj": 1_000_000, "energy_end_mj": 1_000_000 + energy * 1000}
    return {"simulated": False, "t_start": 100.0, "t_end": 100.0 + seconds, "gpus": [gpu]}


BENCH = BenchResult(
    url="http://127.0.0.1:1", model="m", requested_prompt_tokens=2048, requested_output_tokens=256,
    prompt_tokens=2048, completion_tokens=256, chunks=256, ttft_s=0.5, prefill_tok_s=4096.0, decode_tok_s=40.0,
    chunk_counted_decode_tok_s=40.0, tokens_per_chunk=1.0, itl_p50_ms=25.0, itl_p99_ms=26.0, max_stall_ms=26.0,
    acceptance_length=None, concurrency=[], checks=[Check("tokens_produced", True, "ok")],
)


def rig_and_model():
    rig = load_rig(REPO / "inventory/rigs/win-2x4090-48gb.yml", REPO / "inventory/models")
    return rig, rig.models[0]


def test_integrated_power_matches_a_constant_draw():
    assert integrate_power([1.0, 2.0, 3.0], [100.0, 100.0, 100.0], 0.5, 3.5) == pytest.approx(300.0)


def test_clock_verdicts_for_ceilings_above_and_below_the_peak():
    load = gpu_load(telemetry(sm=2190)["gpus"][0], 100.0, 104.0)
    assert check_clock_ceiling(load, 2200).passed
    below = check_clock_ceiling(load, 2100)
    assert not below.passed and below.message.startswith("lock not in effect: max SM clock under load 2190 MHz")


def test_power_and_enforced_limit_verdicts():
    load = gpu_load(telemetry(power=345.0, limit=330.0)["gpus"][0], 100.0, 104.0)
    assert not check_power_under_load(load, 330).passed
    assert check_enforced_limit(load, 330).passed
    assert not check_enforced_limit(load, 300).passed


def test_figures_energy_per_token_and_roofline():
    rig, model = rig_and_model()
    result = build_result(rig, model, BENCH, telemetry(power=300.0, seconds=4.0), None)
    f = result.figures
    assert f["joules_per_token"] == pytest.approx(1200 / 256)
    assert f["mean_power_w"] == pytest.approx(300)
    assert f["decode_tok_s_per_watt"] == pytest.approx(40 / 300)
    # TP2 over two 1008 GB/s cards reading 15 GB per token: 134.4 tok/s bound.
    assert roofline_tok_s(rig, model) == pytest.approx(2 * 1008e9 / 15e9)
    assert f["roofline_share"] == pytest.approx(40 / 134.4, rel=1e-3)
    assert result.passed


def test_regressions_over_ten_percent_are_flagged_only_for_the_same_workload():
    rig, model = rig_and_model()
    before = build_result(rig, model, BENCH, telemetry(), None)
    slower = replace(BENCH, decode_tok_s=34.0)
    after = build_result(rig, model, slower, telemetry(), before.to_json())
    assert [r.figure for r in after.regressions] == ["decode_tok_s", "decode_tok_s_per_watt"]
    other = build_result(rig, model, replace(slower, requested_prompt_tokens=512), telemetry(), before.to_json())
    assert other.regressions == [] and other.previous["comparable"] is False
    [ttft] = regressions({"ttft_s": 0.56}, {"ttft_s": 0.5})
    assert (ttft.figure, ttft.previous, ttft.now) == ("ttft_s", 0.5, 0.56) and ttft.change == pytest.approx(0.12)
