"""The sweep driver against the simulated rig (tests/tune_sim.py): what it finds, what it refuses,
what it reports as not in effect, and that it always restores. Pure and seeded; no rig, no Docker."""

from __future__ import annotations

import re

import pytest

from rigkit.tune.analysis import ranking
from rigkit.tune.cells import Cell, Workload
from rigkit.tune.grid import build_grid, parse_values
from rigkit.tune.schedule import in_a_row_schedule
from rigkit.tune.sweep import SweepPlan, TuneError, plan_sweep, run_sweep
from tests.tune_sim import QWEN27_DFLASH2, QWEN35_A3B, RTX3090, SimTuneRig, rig_spec

SEEDS = range(5)
PRO_4000 = "RTX PRO 4000 Blackwell SFF"  # not in rigkit's reference list: the driver's range rules


def sweep(profile, start, powers="", mems="", locks="", repeats=4, seed=0, spec=None, **sim):
    rig = SimTuneRig(profile, start, seed=seed, **sim)
    spec = spec or rig_spec(PRO_4000 if profile is not RTX3090 else "RTX 3090", [start.power_limit_w], 1200, 200)
    grid = build_grid(start,
                      power_limits_w=parse_values("--power-limits", powers) if powers else (),
                      clock_locks_mhz=parse_values("--clock-locks", locks, allow_unlocked=True) if locks else (),
                      mem_offsets_mhz=parse_values("--mem-offsets", mems, allow_negative=True) if mems else ())
    plan = plan_sweep(grid, start, spec, rig.report(), (0,), repeats, rig.offset_ranges())
    return rig, plan, run_sweep(rig, plan)


def row(result, **cell):
    return next(r for r in result.table if r.cell == Cell(**cell))


@pytest.mark.parametrize("seed", SEEDS)
def test_the_3090_knee_is_found_within_one_grid_step(seed):
    # +7% from 200 to 250 W, then about +1% per 50 W: the efficiency pick is the knee, 250 W.
    _, _, result = sweep(RTX3090, Cell(350), "200:350:25", seed=seed)
    assert abs(result.choices["efficiency"].cell.power_limit_w - 250) <= 25
    assert "of the best" in result.choices["efficiency"].reason


def test_abba_ranks_two_close_settings_right_where_a_naive_order_does_not():
    # 300 vs 350 W on a 3090: 1% apart. The card loses 0.4% per measurement (heat soak).
    cells, abba_wins = (Cell(300), Cell(350)), 0
    for seed in SEEDS:
        naive_rig = SimTuneRig(RTX3090, Cell(350), seed=seed, drift_per_measurement=-0.004)
        naive = run_sweep(naive_rig, SweepPlan(Cell(350), cells, (), in_a_row_schedule(cells, 10), (0,)))
        [(first, _), (second, verdict)] = ranking(naive.table, "decode")
        assert (first.cell, second.cell, verdict) == (Cell(300), Cell(350), "worse")  # drift called a win

        _, _, abba = sweep(RTX3090, Cell(350), "300,350", repeats=10, seed=seed, drift_per_measurement=-0.004)
        [(first, _), (second, verdict)] = ranking(abba.table, "decode")
        assert (first.cell, second.cell) == (Cell(350), Cell(300))
        abba_wins += verdict == "worse"
        decode_drift = abba.drift[0]
        assert decode_drift.significant and decode_drift.per_slot / decode_drift.level == pytest.approx(-0.004, abs=0.0015)
    assert abba_wins >= len(SEEDS) - 1  # 1% at n=10 and 0.6% noise: now and then honestly a tie


@pytest.mark.parametrize("seed", SEEDS)
def test_35b_is_flat_from_106_to_120_w_and_27b_still_gains(seed):
    _, _, flat = sweep(QWEN35_A3B, Cell(70), "70,90,106,120", seed=seed)
    ranked = {r.cell.power_limit_w: verdict for r, verdict in ranking(flat.table, "decode")}
    assert {ranked[106], ranked[120]} <= {"best", "tie"}  # 96.21 vs 96.43: inside the noise
    assert flat.choices["efficiency"].cell.power_limit_w < 120
    assert flat.choices["decode"].cell.power_limit_w < 120  # a tie goes to the lower power

    _, _, gaining = sweep(QWEN27_DFLASH2, Cell(70), "70,90,106,120", seed=seed)
    assert gaining.choices["decode"].cell == Cell(120)
    assert dict((r.cell.power_limit_w, v) for r, v in ranking(gaining.table, "decode"))[106] == "worse"


@pytest.mark.parametrize("seed", SEEDS)
def test_the_memory_offset_is_worth_more_on_35b_than_on_27b(seed):
    gains = {}
    for profile in (QWEN35_A3B, QWEN27_DFLASH2):
        _, _, result = sweep(profile, Cell(120), mems="0,6000", seed=seed)
        zero, plus = row(result, power_limit_w=120).decode_tok_s, row(result, power_limit_w=120, mem_offset_mhz=6000).decode_tok_s
        gains[profile.name] = plus.mean / zero.mean - 1
    assert gains[QWEN35_A3B.name] == pytest.approx(0.198, abs=0.02)
    assert gains[QWEN27_DFLASH2.name] == pytest.approx(0.050, abs=0.02)


def test_a_cell_beyond_the_psu_budget_is_refused_before_anything_is_applied():
    spec = rig_spec("RTX 3090", [300, 330], psu_w=1100, system_w=200)  # GPU 1 stays at 330 W
    rig, plan, result = sweep(RTX3090, Cell(300), "250,300,350,400", spec=spec)
    assert [r.cell.power_limit_w for r in result.refused] == [400]
    assert result.refused[0].reasons == (
        "PSU budget: GPU caps 400 + 330 W + 200 W system = 930 W on a 1100 W PSU leaves 170 W (15%) free; "
        "20% (220 W) must stay free for transient spikes",)
    assert Cell(400) not in [call[1] for call in rig.calls if call[0] == "apply"]
    assert Cell(400) not in plan.cells and {r.cell.power_limit_w for r in result.table} == {250, 300, 350}


def test_a_cell_outside_the_drivers_range_is_refused_with_the_range():
    rig, _, result = sweep(RTX3090, Cell(300), "300,450", spec=rig_spec("RTX 3090", [300], 2000, 200))
    assert result.refused[0].reasons == ("GPU 0: 450 W is outside 100-400 W, the range this NVIDIA GeForce RTX 3090 reports",)


def test_a_start_outside_the_budget_stops_the_sweep_before_it_starts():
    with pytest.raises(TuneError, match="the starting setting, measured as the control, is itself refused: PSU budget"):
        sweep(RTX3090, Cell(350), "250,300", spec=rig_spec("RTX 3090", [350, 350], 1000, 200))


def test_a_limit_the_card_does_not_draw_is_reported_not_measured():
    # seed 004: the driver showed 106 W while the card drew about 70 W under load.
    rig, _, result = sweep(QWEN27_DFLASH2, Cell(70), "70,90,106,120", held_at_w=70)
    assert [r.cell.power_limit_w for r in result.table] == [70]
    reasons = {n.cell.power_limit_w: n.reasons for n in result.not_in_effect}
    assert sorted(reasons) == [90, 106, 120]
    assert re.fullmatch(r"GPU 0: requested 106 W, drew 6\d W under load while power-capped in 100% of samples: "
                        r"another limit \(firmware policy\) holds the card, the requested cap is not in effect", reasons[106][0])
    assert sum(1 for c in rig.calls if c == ("measure", Cell(106))) == 1  # not measured again as if it worked
    assert "efficiency" in result.choices and result.choices["decode"].cell == Cell(70)


def test_an_enforced_limit_below_the_request_is_caught_before_measuring():
    rig, _, result = sweep(RTX3090, Cell(250), "250,300,350", enforced_clamp_w=300)
    [(cell, reasons)] = [(n.cell, n.reasons) for n in result.not_in_effect]
    assert cell == Cell(350) and "enforced limit 300 W, policy 350 W" in reasons[0]
    assert ("measure", Cell(350)) not in rig.calls


def test_a_clock_lock_the_card_ignores_is_reported():
    _, _, result = sweep(RTX3090, Cell(300), locks="none,1500", lock_ignored=True)
    [bad] = result.not_in_effect
    assert bad.cell == Cell(300, 1500) and "above the lock ceiling 1500 MHz" in bad.reasons[0]
    assert [r.cell for r in result.table] == [Cell(300)]


def test_ctrl_c_inside_a_measurement_restores_at_once():
    rig = SimTuneRig(RTX3090, Cell(350), interrupt_at=3)
    spec = rig_spec("RTX 3090", [350], 1200, 200)
    plan = plan_sweep(build_grid(Cell(350), (250, 300)), Cell(350), spec, rig.report(), (0,), 4)
    with pytest.raises(KeyboardInterrupt):
        run_sweep(rig, plan)
    assert rig.calls[-1] == ("restore",) and rig.calls[-2][0] == "measure"  # nothing in between
    assert rig.settings == Cell(350)  # the simulated card's own state, not the driver's word


def test_an_error_inside_a_measurement_restores_too():
    class Broken(SimTuneRig):
        def measure(self, cell):
            if self.measurements == 2:
                raise RuntimeError("benchmark failed")
            return super().measure(cell)

    rig = Broken(RTX3090, Cell(350))
    plan = plan_sweep(build_grid(Cell(350), (250,)), Cell(350), rig_spec("RTX 3090", [350], 1200, 200),
                      rig.report(), (0,), 2)
    with pytest.raises(RuntimeError, match="benchmark failed"):
        run_sweep(rig, plan)
    assert rig.calls[-1] == ("restore",) and rig.settings == Cell(350)


def test_a_finished_sweep_restores_and_reports_n_and_intervals():
    rig, plan, result = sweep(RTX3090, Cell(350), "250,300", repeats=3)
    assert rig.calls[-1] == ("restore",) and rig.settings == Cell(350)
    for r in result.table:
        assert r.decode_tok_s.n == 4  # 3 rounded up to mirrored pairs
        assert r.decode_tok_s.low < r.decode_tok_s.mean < r.decode_tok_s.high
        assert r.power_w is not None and r.decode_tok_s_per_w > 0
    assert len(result.readings) == len(plan.schedule)


def test_response_time_needs_a_workload_and_the_efficiency_share_is_configurable():
    rig = SimTuneRig(QWEN35_A3B, Cell(70))
    plan = plan_sweep(build_grid(Cell(70), (70, 90, 106, 120)), Cell(70), rig_spec(PRO_4000, [70], 1200, 200),
                      rig.report(), (0,), 4)
    strict = run_sweep(rig, plan, workload=Workload(32_000, 500), keep_share=0.99)
    assert strict.choices["efficiency"].cell.power_limit_w == 106  # 96.21 is 99.8% of 96.43; 90 W is 97%
    chosen = strict.choices["response-time"]
    assert "s estimated response time" in chosen.reason
    # prefill keeps gaining with power in the model, so the fastest response is at the top cap
    assert chosen.cell == Cell(120)
    assert "response-time" not in run_sweep(SimTuneRig(QWEN35_A3B, Cell(70)), plan).choices
