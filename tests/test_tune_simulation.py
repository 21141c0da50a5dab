"""The simulation `rigkit tune` is tested against: the vLLM stand-in's rates follow the simulated
GPU's settings through tests/sim_curves.py. Simulates the GPU (a state.json as the simulated
nvidia-smi/NVML write it) and vLLM (the stand-in, as a local process); the benchmark client is real."""

from __future__ import annotations

import json

import pytest

from rigkit.verify.client import run_bench
from tests.sim_curves import PROFILES, truth
from tests.standin import standin


def _gpu_dir(tmp_path, profile: str, power_w: float, mem_offset_mhz: int = 0, held_at_w: float | None = None):
    folder = tmp_path / "gpu"
    folder.mkdir(exist_ok=True)
    gpu = {"name": "sim", "min_w": 50, "max_w": 140, "default_w": 70, "max_clock_mhz": 3105, "memory_mib": 24576,
           "tune_profile": profile, "held_at_w": held_at_w}
    (folder / "gpus.json").write_text(json.dumps({"gpus": [gpu]}))
    set_state(folder, power_w, mem_offset_mhz)
    return folder


def set_state(folder, power_w, mem_offset_mhz=0):
    (folder / "state.json").write_text(json.dumps([{"power_limit_w": power_w, "clock_lock": None, "persistence": True,
                                                    "memory_offset_mhz": mem_offset_mhz}]))


def decode(url) -> float:
    return run_bench(url, "m", prompt_tokens=256, output_tokens=48, seed=1).decode_tok_s


def test_the_standin_decodes_at_the_curve_for_the_current_power_limit_and_offset(tmp_path):
    folder = _gpu_dir(tmp_path, "qwen35_a3b", 70)
    with standin(tmp_path, standin_gpu_dir=str(folder), standin_noise_share="0") as url:
        at_70 = decode(url)
        set_state(folder, 120)  # changed live: the next request sees it, no restart
        at_120 = decode(url)
        set_state(folder, 120, 6000)
        with_mem = decode(url)
    assert at_70 == pytest.approx(84.97, rel=0.03)  # seed 004's table
    assert at_120 == pytest.approx(96.43, rel=0.03)
    assert with_mem / at_120 == pytest.approx(1.198, abs=0.03)  # +33% memory clock: +19.8% on 35B


def test_a_card_held_below_its_limit_decodes_at_the_held_draw(tmp_path):
    folder = _gpu_dir(tmp_path, "qwen27_dflash2", 106, held_at_w=70)
    with standin(tmp_path, standin_gpu_dir=str(folder), standin_noise_share="0") as url:
        held = decode(url)
    assert held == pytest.approx(35.04, rel=0.03)  # "requested 106 W, drew 70 W": the 70 W rate
    assert truth(PROFILES["qwen27_dflash2"], 106, held_at_w=70).power_capped


def test_noise_and_drift_are_what_was_asked_for(tmp_path):
    folder = _gpu_dir(tmp_path, "qwen35_a3b", 120)
    with standin(tmp_path, standin_gpu_dir=str(folder), standin_noise_share="0", standin_drift_per_s="-0.06") as url:
        first, second = decode(url), decode(url)
    # ~0.6 s or more apart at -6%/s: 3% lower or more, well past a loaded machine's timing jitter (~1%).
    assert second < first * 0.985


def test_the_hold_loop_reports_the_noise_the_standin_was_given(tmp_path):
    """`--hold`'s loop as the lead runs it on a GPU machine (no SSH, no sampler here): 8 readings at
    2% relative noise give a CV near 2%, and the repeats a 1% difference needs follow from it. 96 tokens
    out (1 s of decode): a token that comes tens of ms late on a loaded machine adds little CV."""
    from rigkit.tune.measure import BenchSettings, hold, measure_once

    folder = _gpu_dir(tmp_path, "qwen35_a3b", 120)
    with standin(tmp_path, standin_gpu_dir=str(folder), standin_noise_share="0.02", standin_seed="3") as url:
        result = hold(lambda: measure_once(url, "m", None, BenchSettings(128, 96)), 8)
    assert len(result.readings) == 8
    assert 0.007 < result.decode_cv < 0.04
    assert result.decode_tok_s.mean == pytest.approx(96.43, rel=0.03)
    assert result.repeats_to_resolve(0.01) > result.repeats_to_resolve(0.02) >= 2
