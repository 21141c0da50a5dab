"""The idle-energy ledger (rigkit/rigside/idle_energy.py) on made-up samples: which intervals count as
idle, where the energy comes from (the counter, or power when the counter is missing or went back), what a
gap or a cut-off file does, the last day's figures, the status line and the exporter's families.

Simulated: NVML's readings (numbers handed to the ledger, and a stand-in module for read_gpu); the
keeper's real sampling on the simulated rig is tests/test_gpu_keeper.py's."""

from __future__ import annotations

import json

import pytest

from rigkit.rigside import idle_energy, metrics
from rigkit.rigside.idle_energy import DAY_S, HOUR_S, MAX_GAP_S, Ledger, last_day
from rigkit.status.table import idle_energy_line

T0 = 1_780_000_000.0 - 1_780_000_000.0 % HOUR_S  # an hour's start


class Clock:
    def __init__(self, now=T0):
        self.now = now

    def __call__(self):
        return self.now


def run(ledger, clock, samples, step=1.5):
    """samples: [(energy J or None, power W or None, utilization)] for GPU 0, one every `step` s."""
    for i, (energy, power, utilization) in enumerate(samples):
        clock.now = T0 + i * step
        ledger.add(0, i * step, energy, power, utilization)


def test_only_intervals_idle_at_both_ends_count_as_idle_and_the_counter_gives_the_energy(tmp_path):
    clock = Clock()
    ledger = Ledger(str(tmp_path / "ledger.json"), clock)
    # counter at 100 W for 6 s; utilization 0, 0, 0, 40, 0: two idle intervals, two busy
    run(ledger, clock, [(0.0, 999, 0), (150.0, 999, 0), (300.0, 999, 0), (450.0, 999, 40), (600.0, 999, 0)])
    ledger.save(force=True)
    day = last_day(json.loads((tmp_path / "ledger.json").read_text()), clock.now)
    gpu = day["gpus"][0]
    assert gpu["idle_s"] == 3.0 and gpu["measured_s"] == 6.0
    assert gpu["idle_w"] == 100.0  # from the counter, not the power readings (999 W)
    assert day["idle_kwh"] == round(300 / 3.6e6, 4)
    assert day["idle_kwh_per_day"] == round(300 / 3.6e6 * DAY_S / 6.0, 4)


def test_power_is_used_where_the_counter_is_missing_or_went_back_and_a_gap_is_not_measured(tmp_path):
    clock = Clock()
    ledger = Ledger(str(tmp_path / "l.json"), clock)
    # no counter: mean power; then a counter reset (driver reload): power again
    run(ledger, clock, [(None, 20.0, 0), (None, 30.0, 0), (5000.0, 30.0, 0), (10.0, 40.0, 0)], step=2.0)
    cells = ledger.doc["totals"]["0"]
    assert cells == [25.0 * 2 + 30.0 * 2 + 35.0 * 2, 6.0, 25.0 * 2 + 30.0 * 2 + 35.0 * 2, 6.0]
    ledger.add(0, 6.0 + MAX_GAP_S + 1, 20.0, 40.0, 0)  # the keeper was stopped: not measured
    assert ledger.doc["totals"]["0"][3] == 6.0
    ledger.forget(0)  # NVML did not answer: the next sample starts afresh
    ledger.add(0, 18.0, 30.0, 40.0, 0)
    assert ledger.doc["totals"]["0"][3] == 6.0


def test_a_counter_step_no_gpu_can_draw_is_not_believed(tmp_path):
    ledger = Ledger(str(tmp_path / "l.json"), Clock())
    ledger.add(0, 0.0, 0.0, 50.0, 0)
    ledger.add(0, 1.0, 1e6, 50.0, 0)  # 1 MJ in a second: a simulated counter's jump, or a bad read
    assert ledger.doc["totals"]["0"][0] == 50.0


def test_the_file_survives_a_restart_keeps_48_hours_and_a_garbled_one_starts_afresh(tmp_path):
    path = tmp_path / "l.json"
    clock = Clock()
    ledger = Ledger(str(path), clock)
    run(ledger, clock, [(0.0, 1, 0), (75.0, 1, 0)])
    ledger.save(force=True)
    again = Ledger(str(path), clock)
    assert again.doc["totals"]["0"][1] == 1.5
    clock.now = T0 + 47 * HOUR_S
    again.add(0, 0.0, 0.0, 1, 0)
    again.add(0, 1.0, 50.0, 1, 0)
    clock.now = T0 + 48 * HOUR_S
    again.save(force=True)
    kept = json.loads(path.read_text())
    assert sorted(kept["hours"]) == [str(int(T0 // HOUR_S) + 47)], kept  # the first hour is 48 h old
    assert kept["totals"]["0"][1] == 2.5  # totals only grow
    # the last day leaves out what is older than 24 h
    assert last_day(kept, T0 + 48 * HOUR_S)["gpus"][0]["idle_s"] == 1.0
    assert last_day(kept, T0 + 72 * HOUR_S) is None
    path.write_text('{"hours": {"x": 1, "5": {"0": [1, 2]}}, "totals": {"0": [1, 2, 3, -4]')
    assert Ledger(str(path), clock).doc == {"version": 1, "hours": {}, "totals": {}, "since": None}


def test_the_status_line_says_the_rate_per_day_until_a_day_was_measured(tmp_path):
    clock = Clock()
    ledger = Ledger(str(tmp_path / "l.json"), clock)
    run(ledger, clock, [(0.0, 1, 0), (36.75, 1, 0), (73.5, 1, 0)])  # 24.5 W for 3 s
    line = idle_energy_line(last_day(ledger.doc, clock.now))
    assert line.startswith("idle energy: 0.000 kWh in the 0.0 h measured, 0.59 kWh/day at that rate"), line
    assert "GPU 0 0.000 kWh, idle 100% at 24.5 W" in line, line
    whole = {"hours": {str(int(T0 // HOUR_S) + h): {"0": [24.5 * 3000, 3000, 24.5 * 3000 + 300 * 600, 3600]}
                       for h in range(24)}}
    line = idle_energy_line(last_day(whole, T0 + 23 * HOUR_S + 1))
    assert line == "idle energy, last 24 h: 0.490 kWh (GPU 0 0.490 kWh, idle 83% at 24.5 W)", line


def test_the_exporter_counts_the_totals_and_gives_the_days_figure():
    doc = {"hours": {str(int(T0 // HOUR_S)): {"0": [245.0, 10.0, 545.0, 12.0], "1": [0.0, 0.0, 600.0, 12.0]}},
           "totals": {"0": [2450.0, 100.0, 5450.0, 120.0], "1": [0.0, 0.0, 6000.0, 120.0]}}
    families = {f.name: f for f in metrics.build(None, {}, None, {}, {}, {}, T0 + 60, idle_energy=doc)}
    assert families["rigkit_gpu_idle_energy_joules_total"].samples == [({"gpu": "0"}, 2450.0), ({"gpu": "1"}, 0.0)]
    assert families["rigkit_gpu_idle_seconds_total"].samples == [({"gpu": "0"}, 100.0), ({"gpu": "1"}, 0.0)]
    assert families["rigkit_gpu_measured_seconds_total"].samples == [({"gpu": "0"}, 120.0), ({"gpu": "1"}, 120.0)]
    [(labels, per_day)] = families["rigkit_idle_energy_kwh_per_day"].samples
    assert per_day == pytest.approx(245.0 / 3.6e6 * DAY_S / 12.0, rel=1e-3)
    assert "rigkit_idle_energy_kwh_per_day" not in {f.name for f in metrics.build(None, {}, None, {}, {}, {}, T0)}


class StandInNvml:
    """nvidia-ml-py's names for the calls read_gpu makes; `missing`: {call: the NVML error code it raises}."""

    NVML_ERROR_NOT_SUPPORTED = 3
    NVML_ERROR_FUNCTION_NOT_FOUND = 13

    class NVMLError(Exception):
        def __init__(self, value):
            super().__init__(value)
            self.value = value

    class Utilization:
        gpu, memory = 7, 3

    def __init__(self, missing=None):
        self.missing = missing or {}

    def _answer(self, name, value):
        if name in self.missing:
            raise self.NVMLError(self.missing[name])
        return value

    def nvmlDeviceGetTotalEnergyConsumption(self, handle):
        return self._answer("energy", 123456)

    def nvmlDeviceGetPowerUsage(self, handle):
        return self._answer("power", 24500)

    def nvmlDeviceGetUtilizationRates(self, handle):
        return self._answer("utilization", self.Utilization())


def test_read_gpu_takes_nvmls_units_and_leaves_out_what_the_gpu_does_not_support():
    assert idle_energy.read_gpu(StandInNvml(), 0) == (123.456, 24.5, 7)
    assert idle_energy.read_gpu(StandInNvml(missing={"energy": 3}), 0) == (None, 24.5, 7)  # not on this GPU
    assert idle_energy.read_gpu(StandInNvml(missing={"utilization": 13}), 0) == (123.456, 24.5, None)  # not in this driver
    nvml = StandInNvml()
    nvml.nvmlDeviceGetPowerUsage = lambda handle: (_ for _ in ()).throw(nvml.NVMLError(999))
    with pytest.raises(StandInNvml.NVMLError):  # NVML down is the keeper's to see, not a missing value
        idle_energy.read_gpu(nvml, 0)


def test_a_hostile_or_garbled_ledger_is_dropped_where_it_does_not_parse_never_a_traceback(tmp_path):
    """Keys str.isdigit takes but int refuses ("²"), numbers past a float (10**400, 1e999 read as Infinity),
    NaN, negatives, JSON nested past the parser's limit: each part dropped, the rest kept."""
    hostile = ('{"since": ' + "9" * 400 + ', "hours": {"\\u00b2": {"0": [1, 1, 1, 1]}, "7": {"0": [1e999, 1, 1, 1], '
               '"1": [NaN, 1, 1, 1], "2": [-1, 1, 1, 1], "3": [1, 1, 1, 1]}}, "totals": {"\\u00b2": [1, 1, 1, 1], '
               '"0": [' + "9" * 400 + ', 1, 1, 1], "1": [2, 2, 2, 2]}}')
    path = tmp_path / "l.json"
    path.write_text(hostile)
    ledger = Ledger(str(path), Clock(7 * HOUR_S + 1))
    assert ledger.doc == {"version": 1, "since": None, "hours": {"7": {"3": [1.0, 1.0, 1.0, 1.0]}},
                          "totals": {"1": [2.0, 2.0, 2.0, 2.0]}}
    assert last_day(json.loads(hostile.replace("9" * 400, "1")), 7 * HOUR_S + 1)["gpus"] == \
        {3: {"idle_kwh": 0.0, "idle_s": 1.0, "measured_s": 1.0, "idle_w": 1.0}}
    assert [f.name for f in metrics.build(None, {}, None, {}, {}, {}, 0.0, idle_energy=json.loads(hostile))]
    path.write_text("[" * 100_000 + "]" * 100_000)
    assert Ledger(str(path), Clock()).doc["hours"] == {}


def test_the_day_is_24_hours_back_from_now_and_hours_ahead_of_the_clock_are_dropped(tmp_path):
    """The oldest hour counts for its share within 24 h of now: a rig measured all day reads a whole day at
    any minute of the hour. Hours after now (a clock set back) are neither counted nor kept."""
    hour = int(T0 // HOUR_S)
    doc = {"hours": {str(hour + h): {"0": [3600.0, 3600.0, 3600.0, 3600.0]} for h in range(-1, 26)}}
    doc["hours"][str(hour + 24)] = {"0": [900.0, 900.0, 900.0, 900.0]}  # the hour now, a quarter gone
    now = T0 + 24 * HOUR_S + 0.25 * HOUR_S  # hour 0 counts for the 3/4 of it within 24 h
    day = last_day(doc, now)
    assert day["measured_s"] == 24 * 3600 and day["idle_kwh"] == round(24 * 3600 / 3.6e6, 4), day
    clock = Clock(now)
    path = tmp_path / "l.json"
    path.write_text(json.dumps(doc))
    ledger = Ledger(str(path), clock)
    ledger.save(force=True)
    assert max(int(h) for h in json.loads(path.read_text())["hours"]) == hour + 24


def test_each_gpu_is_scaled_to_a_day_by_its_own_measured_time():
    """A GPU measured for less time (added to the policy an hour ago) is not under-counted in the rate."""
    doc = {"hours": {str(int(T0 // HOUR_S)): {"0": [7200.0, 7200.0, 7200.0, 7200.0], "1": [1800.0, 1800.0, 1800.0, 1800.0]}}}
    day = last_day(doc, T0 + 1)
    assert day["idle_kwh_per_day"] == round((1.0 + 1.0) * 86400 / 3.6e6, 4), day  # 1 W each, a whole day
