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
from rigkit.fit.roofline import roofline_tok_s
from rigkit.verify.result import build_result, regressions
from rigkit.verify.table import bench_table
from tests.conftest import REPO


def telemetry(sm=2190, power=300.0, limit=330.0, hz=50, seconds=4.0, energy_j=None, driver="580.95.05",
              watts=None):
    """Synthetic samples from t=100 s; `watts(t)` gives a draw that changes over time (else `power`)."""
    n = int(hz * seconds)
    t = [100.0 + i / hz for i in range(n)]
    draw = [watts(x) if watts else power for x in t]
    samples = {
        "t": t, "sm_mhz": [sm] * n, "mem_mhz": [10501] * n, "temp_c": [60] * n, "event_reasons": [4] * n,
        "enforced_limit_w": [limit] * n, "power_instant_w": draw, "power_average_w": draw,
    }
    energy = power * seconds if energy_j is None else energy_j
    gpu = {"index": 0, "name": "NVIDIA GeForce RTX 4090", "default_limit_w": 450.0, "samples": samples,
           "energy_start_mj": 1_000_000, "energy_end_mj": 1_000_000 + energy * 1000}
    return {"simulated": False, "t_start": 100.0, "t_end": 100.0 + seconds, "gpus": [gpu], "driver_version": driver}


BENCH = BenchResult(
    url="http://127.0.0.1:1", model="m", requested_prompt_tokens=2048, requested_output_tokens=256,
    prompt_tokens=2048, completion_tokens=256, chunks=256, ttft_s=0.5, prefill_tok_s=4096.0, decode_tok_s=40.0,
    chunk_counted_decode_tok_s=40.0, tokens_per_chunk=1.0, itl_p50_ms=25.0, itl_p99_ms=26.0, max_stall_ms=26.0,
    acceptance_length=None, concurrency=[], checks=[Check("tokens_produced", True, "ok")],
    # Wall-clock instants inside the synthetic telemetry window (100-104 s): prefill 0.5 s, decode 2.5 s.
    wall_send_s=100.5, wall_first_token_s=101.0, wall_last_token_s=103.5,
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
    assert not [w for w in result.bench.warnings if "its GPUs' memory allows" in w]  # 30%: not far below


def test_a_decode_far_below_the_roofline_is_a_warning_naming_the_likely_causes():
    """The same model at 20 tok/s: 15% of its 134 tok/s roofline; the result still passes (the gate judges speed)."""
    from dataclasses import replace

    rig, model = rig_and_model()
    result = build_result(rig, model, replace(BENCH, decode_tok_s=20.0), telemetry(power=300.0, seconds=4.0), None)
    [warning] = [w for w in result.bench.warnings if "its GPUs' memory allows" in w]
    assert warning.startswith("decode 20.0 tok/s is 15% of the 134 tok/s its GPUs' memory allows one sequence "
                              "(15.0 GB read per token); likely: a power cap or clock lock far below"), warning
    assert result.passed and f"WARN  {warning}" in bench_table(result.bench)  # what the deploy prints


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


def test_energy_is_split_at_the_first_token_from_measured_power():
    """Simulated: a GPU drawing 400 W while prefilling (100.5-101.0 s) and 250 W while decoding (101.0-103.5 s),
    50 W otherwise. Each phase's energy, mean power and sample count come from its own samples, not the cap."""
    rig, model = rig_and_model()

    def watts(t):
        return 400.0 if 100.5 <= t < 101.0 else 250.0 if 101.0 <= t < 103.5 else 50.0

    f = build_result(rig, model, BENCH, telemetry(watts=watts), None).figures
    # Samples every 20 ms: the edges interpolate over one gap, so allow one sample's share of error.
    assert f["prefill_energy_j"] == pytest.approx(400 * 0.5, rel=0.05)
    assert f["decode_energy_j"] == pytest.approx(250 * 2.5, rel=0.02)
    assert f["decode_mean_power_w"] == pytest.approx(250, rel=0.02)
    assert f["decode_tok_s_per_watt"] == pytest.approx(40 / 250, rel=0.02)  # the cap is 330 W: not used
    assert f["joules_per_output_token"] == pytest.approx((200 + 625) / 256, rel=0.03)
    assert 20 <= f["prefill_samples"] <= 26 and 120 <= f["decode_samples"] <= 126
    # The run's counter covers all 4 s, idle included: a cross-check, not the request's energy.
    assert f["run_energy_counter_j"] == pytest.approx(300 * 4)
    # 2048 tokens at 4096 tok/s + 256 tokens at 40 tok/s.
    assert f["response_time_estimate_s"] == pytest.approx(0.5 + 6.4)


def test_a_phase_outside_the_sampled_window_gives_no_energy_rather_than_a_wrong_one():
    """Simulated: the control machine's clock is 60 s ahead of the rig's, so the request falls outside the samples."""
    rig, model = rig_and_model()
    skewed = replace(BENCH, wall_send_s=160.5, wall_first_token_s=161.0, wall_last_token_s=163.5)
    result = build_result(rig, model, skewed, telemetry(), None)
    assert result.figures["decode_energy_j"] is None and result.figures["decode_tok_s_per_watt"] is None
    assert "clocks in sync" in result.phases[1].note


def test_results_with_different_provenance_are_not_compared_and_say_what_changed():
    """A faster-looking run after a driver upgrade and an image change is not a regression or a win: it is another
    measurement. The same provenance is compared."""
    rig, model = rig_and_model()
    serving = {"image": "vllm/vllm-openai:v0.11.0", "image_digest": None, "vllm_args": ["/m", "--dtype", "auto"]}
    before = build_result(rig, model, BENCH, telemetry(), None, serving=serving).to_json()
    slower = replace(BENCH, decode_tok_s=30.0)
    same = build_result(rig, model, slower, telemetry(), before, serving=serving)
    assert same.previous["comparable"] and "decode_tok_s" in [r.figure for r in same.regressions]
    other = build_result(rig, model, slower, telemetry(driver="590.10"), before,
                         serving={**serving, "image": "vllm/vllm-openai:v0.12.0"})
    assert other.regressions == [] and other.previous["comparable"] is False
    changed = {c["key"]: (c["previous"], c["now"]) for c in other.previous["changed"]}
    assert changed == {"driver_version": ("580.95.05", "590.10"),
                       "serving_image": ("vllm/vllm-openai:v0.11.0", "vllm/vllm-openai:v0.12.0")}
    assert other.provenance["gpus"][0]["enforced_limit_w"] == 330


def test_an_earlier_result_without_provenance_is_not_compared():
    rig, model = rig_and_model()
    old = build_result(rig, model, BENCH, telemetry(), None).to_json()
    del old["provenance"]
    after = build_result(rig, model, replace(BENCH, decode_tok_s=20.0), telemetry(), old)
    assert after.regressions == [] and after.previous["changed"][0]["key"] == "provenance"


def test_regressions_compare_with_the_newest_run_measured_the_same_way():
    rig, model = rig_and_model()
    same = build_result(rig, model, BENCH, telemetry(), None).to_json()
    other = build_result(rig, model, BENCH, telemetry(limit=300.0), None).to_json()  # another enforced limit
    after = build_result(rig, model, replace(BENCH, decode_tok_s=34.0), telemetry(), [other, same])
    assert after.previous["comparable"] is True
    assert "decode_tok_s" in [r.figure for r in after.regressions]
    alone = build_result(rig, model, replace(BENCH, decode_tok_s=34.0), telemetry(), [other])
    assert alone.regressions == [] and alone.previous["comparable"] is False
    assert any(c["key"] == "gpus" for c in alone.previous["changed"])
