"""The NVML sampler's loop (rigkit.verify.telemetry.Sampler) when the binding surprises it, without a rig.

Simulated: NVML, by a small object with pynvml's function names and constants for one GPU whose
temperature read raises an error that is not pynvml's NVMLError on every other call (a binding's
surprise: ctypes, a decoding error). Real: the sampler's thread, its clock, the rate check's verdict.
"""

from __future__ import annotations

import re
import time
from types import SimpleNamespace

from rigkit.verify import telemetry
from rigkit.verify.checks import check_sample_rate, gpu_load


class NVMLError(Exception):
    pass


def fake_nvml(every_other_fails: bool) -> SimpleNamespace:
    calls = {"temperature": 0}

    def temperature(handle, sensor):
        calls["temperature"] += 1
        if every_other_fails and calls["temperature"] % 2:
            raise ValueError("the binding returned garbage")
        return 66

    value = SimpleNamespace(nvmlReturn=0, valueType=1, value=SimpleNamespace(uiVal=300_000))
    return SimpleNamespace(
        NVMLError=NVMLError, NVML_SUCCESS=0, NVML_CLOCK_SM=1, NVML_CLOCK_MEM=2, NVML_TEMPERATURE_GPU=0,
        NVML_VALUE_TYPE_DOUBLE=0, NVML_VALUE_TYPE_UNSIGNED_INT=1, NVML_VALUE_TYPE_UNSIGNED_LONG=2,
        NVML_VALUE_TYPE_SIGNED_LONG_LONG=4, NVML_VALUE_TYPE_SIGNED_INT=5,
        nvmlInit=lambda: None, nvmlShutdown=lambda: None, nvmlSystemGetDriverVersion=lambda: "580.95.05",
        nvmlDeviceGetHandleByIndex=lambda i: i, nvmlDeviceGetName=lambda h: "NVIDIA GeForce RTX 4090",
        nvmlDeviceGetPowerManagementDefaultLimit=lambda h: 450_000, nvmlDeviceGetMaxClockInfo=lambda h, c: 3105,
        nvmlDeviceGetTotalEnergyConsumption=lambda h: 1_000, nvmlDeviceGetClockInfo=lambda h, c: 2190,
        nvmlDeviceGetTemperature=temperature, nvmlDeviceGetCurrentClocksEventReasons=lambda h: 0x4,
        nvmlDeviceGetEnforcedPowerLimit=lambda h: 330_000,
        nvmlDeviceGetFieldValues=lambda h, ids: [value for _ in ids])


def sample(monkeypatch, every_other_fails: bool, seconds: float = 1.0) -> dict:
    monkeypatch.setattr(telemetry, "pynvml", fake_nvml(every_other_fails))
    sampler = telemetry.Sampler([0], hz=50).start()
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:  # bounded: the sampler runs on its own thread meanwhile
        time.sleep(0.05)
    return sampler.stop()


def test_a_read_that_raises_skips_that_sample_whole_and_the_rate_check_says_why(monkeypatch):
    run = sample(monkeypatch, every_other_fails=True)
    (gpu,) = run["gpus"]
    lengths = {key: len(series) for key, series in gpu["samples"].items()}
    assert len(set(lengths.values())) == 1, lengths  # no series one sample ahead of another
    assert 10 <= lengths["t"] <= 35, lengths  # about half of 50 at 50 Hz: sampling went on past each error
    assert gpu["errors"] == ["ValueError: the binding returned garbage"]  # kept once, not per sample
    check = check_sample_rate(gpu_load(gpu, run["t_start"], run["t_end"]), minimum_hz=40)
    assert not check.passed
    assert "the sampler could not read: ValueError: the binding returned garbage" in check.message, check.message


def test_a_stall_is_named_with_its_length(monkeypatch):
    run = sample(monkeypatch, every_other_fails=False, seconds=0.3)
    (gpu,) = run["gpus"]
    assert not gpu["errors"] and len(gpu["samples"]["t"]) >= 5
    stalled_end = run["t_end"] + 2.0  # as if the sampler got no CPU for its last 2 s
    check = check_sample_rate(gpu_load(gpu, run["t_start"], stalled_end))
    assert not check.passed
    assert re.search(r"longest stretch without a sample 2\.0 s of 2\.\d s", check.message), check.message
    assert "could not read" not in check.message
    passed = check_sample_rate(gpu_load(gpu, run["t_start"], run["t_end"]))
    assert passed.passed and "stretch" not in passed.message
