"""rigkit tune's pure parts, without a rig: option parsing, the safety screen, the order, the statistics."""

from __future__ import annotations

import statistics

import pytest

from rigkit.tune.cells import Cell, Workload
from rigkit.tune.grid import (
    GridError,
    build_grid,
    parse_objective,
    parse_repeats,
    parse_threshold,
    parse_values,
    parse_workload,
)
from rigkit.tune.safety import OffsetRange, screen
from rigkit.tune.schedule import abba_schedule
from rigkit.tune.stats import compare, detrend, fit_drift, summarise
from tests.tune_sim import RTX3090, SimTuneRig, rig_spec


def test_ranges_and_lists():
    assert parse_values("--power-limits", "200:350:25") == (200, 225, 250, 275, 300, 325, 350)
    assert parse_values("--power-limits", "200:340:50") == (200, 250, 300)  # stop only when on a step
    assert parse_values("--power-limits", "330, 250") == (330, 250)
    assert parse_values("--mem-offsets", "-1000:1000:1000", allow_negative=True) == (-1000, 0, 1000)
    assert parse_values("--clock-locks", "none,1800", allow_unlocked=True) == (None, 1800)


@pytest.mark.parametrize("option, text, message", [
    ("--power-limits", "200:350", "--power-limits '200:350': a range is start:stop:step, e.g. 200:350:25"),
    ("--power-limits", "350:200:25", "--power-limits '350:200:25': start 350 is above stop 200"),
    ("--power-limits", "200:350:0", "--power-limits '200:350:0': the step must be positive, got 0"),
    ("--power-limits", "200,25O", "--power-limits '200,25O': '25O' is not a whole number (ASCII digits)"),
    ("--power-limits", "-50,200", "--power-limits '-50,200': values must be positive, got -50"),
    ("--core-offsets", "", "--core-offsets: empty value; give a list (200,250) or start:stop:step (200:350:25)"),
    ("--mem-offsets", "0,0", "--mem-offsets '0,0': a value is listed twice"),
    ("--power-limits", "1:1000:1", "--power-limits '1:1000:1': 1000 values; at most 40, use a coarser step"),
])
def test_bad_values_are_one_line_naming_option_and_value(option, text, message):
    with pytest.raises(GridError) as error:
        parse_values(option, text, allow_negative=option != "--power-limits")
    assert str(error.value) == message


def test_repeats_objective_threshold_workload():
    assert parse_repeats("4") == 4 and parse_repeats("3") == 4  # mirrored pairs
    with pytest.raises(GridError, match=r"--repeats '0': give 1-50"):
        parse_repeats("0")
    assert parse_objective("efficiency") == "efficiency"
    with pytest.raises(GridError, match="--objective 'speed': choose one of decode, response-time, efficiency"):
        parse_objective("speed")
    assert parse_threshold("95%") == pytest.approx(0.95) and parse_threshold("0.9") == 0.9
    with pytest.raises(GridError, match="--keep '1.5'"):
        parse_threshold("1.5")
    assert parse_workload("8000/640") == Workload(8000, 640)
    with pytest.raises(GridError, match="--workload '8000': give input/output tokens"):
        parse_workload("8000")


def test_response_time_is_the_seeds_estimate():
    # seed 004, 35B at 32,000 input tokens, 500 output: balanced 21.18 s, memory-focused 22.30 s
    workload = Workload(32_000, 500)
    assert workload.response_time_s(2121.56, 82.07) == pytest.approx(21.18, abs=0.01)
    assert workload.response_time_s(1972.45, 82.28) == pytest.approx(22.30, abs=0.01)


def test_grid_keeps_the_starting_value_of_levers_not_swept():
    grid = build_grid(Cell(350, 2100, 0, 0), power_limits_w=(300, 250), mem_offsets_mhz=(0, 1000))
    assert grid == (Cell(250, 2100, 0, 0), Cell(250, 2100, 1000, 0), Cell(300, 2100, 0, 0), Cell(300, 2100, 1000, 0))
    with pytest.raises(GridError, match="the grid has 1600 cells; at most 200"):
        build_grid(Cell(350), tuple(range(100, 140)), tuple(range(1000, 1040)))


def test_offsets_outside_the_reported_range_are_refused():
    rig = SimTuneRig(RTX3090, Cell(300))
    spec = rig_spec("RTX 3090", [300], psu_w=1000, system_w=200)
    ranges = (OffsetRange(0, "memory", -2000, 1500),)
    allowed, refused = screen((Cell(300, None, 1000), Cell(300, None, 2000), Cell(300, None, 0, 100)),
                              spec, rig.report(), (0,), ranges)
    assert allowed == (Cell(300, None, 1000),)
    assert [r.reasons for r in refused] == [
        ("GPU 0: memory offset +2000 MHz is outside -2000..+1500 MHz, the range the driver reports",),
        ("GPU 0: graphics offset +100 MHz asked for, but the driver reported no graphics offset range for this GPU",),
    ]


def test_a_lock_above_the_cards_maximum_is_refused():
    rig = SimTuneRig(RTX3090, Cell(300))
    spec = rig_spec("RTX 3090", [300], psu_w=1000, system_w=200)
    _, [refused] = screen((Cell(300, 2500),), spec, rig.report(), (0,))
    assert refused.reasons == ("GPU 0: lock ceiling 2500 MHz is above the card's maximum 2100 MHz, so it would limit nothing",)


def test_the_schedule_is_a_palindrome_so_every_cell_sits_at_the_centre():
    cells = tuple(Cell(w) for w in (200, 250, 300, 350, 400, 450))
    slots = abba_schedule(cells, Cell(300), repeats=4, control_every=4)
    order = [(s.cell, s.control) for s in slots]
    assert order == order[::-1]
    centre = (len(slots) - 1) / 2
    for cell in cells:
        positions = [s.position for s in slots if s.cell == cell and not s.control]
        assert len(positions) == 4 and statistics.fmean(positions) == centre
    controls = [s.position for s in slots if s.control]
    assert controls[0] == 0 and controls[-1] == len(slots) - 1 and len(controls) >= 5
    assert all(s.cell == Cell(300) for s in slots if s.control)


def test_one_reading_is_never_a_win():
    assert compare(summarise([50.0]), summarise([40.0, 40.1])) == "tie"
    assert compare(summarise([50.0, 50.2, 49.9]), summarise([40.0, 40.1, 40.2])) == "better"
    assert compare(summarise([50.0, 50.2, 49.9]), summarise([50.1, 49.8, 50.0])) == "tie"
    assert compare(summarise([2.0, 2.1]), summarise([3.0, 3.1]), higher_is_better=False) == "better"


def test_drift_fit_recovers_a_planted_slope_and_detrends_to_the_centre():
    points = [(x, 100 - 0.5 * x + (0.1 if x % 2 else -0.1)) for x in range(0, 21, 4)]
    drift = fit_drift("decode tok/s", points, centre=10)
    assert drift.per_slot == pytest.approx(-0.5, abs=0.02) and drift.significant
    assert drift.level == pytest.approx(95, abs=0.1)
    assert detrend(90.0, 20, drift, 10) == pytest.approx(90.0 / (1 - 5 / 95), rel=0.01)
    assert "beyond the noise" in drift.describe(21)
    assert fit_drift("decode tok/s", points[:2], 10).describe(21).endswith("3 or more needed)")
