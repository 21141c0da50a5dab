"""Xid errors in the monitoring exporter (rigkit.rigside.xid), without a rig or Docker.

Simulated: NVML's events, by the simulated rig's own pynvml stand-in (tests/simrig/pynvml.py), loaded
here with its GPU list and its Xid file pointed into tmp_path; an Xid is a line appended to that file,
as the kernel's part on a real rig. The stand-in's event API is checked against the real binding,
nvidia-ml-py (installed here: its names, argument names, constants, error classes and event fields),
so the watcher that runs on the stand-in runs on the real module too.
"""

from __future__ import annotations

import importlib.util
import inspect
import threading
import time
from pathlib import Path

import pynvml as real
import pytest
from prometheus_client import CollectorRegistry, core, generate_latest

from rigkit.rigside import metrics, xid

REPO = Path(__file__).resolve().parents[1]
EVENT_CALLS = ("nvmlEventSetCreate", "nvmlDeviceGetSupportedEventTypes", "nvmlDeviceRegisterEvents",
               "nvmlEventSetWait_v2", "nvmlEventSetWait", "nvmlEventSetFree", "nvmlDeviceGetIndex")
GPUS = [{"name": "NVIDIA GeForce RTX 4090", "default_w": 450, "max_clock_mhz": 3105}] * 2
WAIT_S = 10


@pytest.fixture
def standin(tmp_path, monkeypatch):
    spec = importlib.util.spec_from_file_location("simrig_pynvml", REPO / "tests/simrig/pynvml.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    monkeypatch.setattr(module, "_config", lambda: GPUS)
    monkeypatch.setattr(module, "XID_EVENTS_PATH", str(tmp_path / "xid-events"))
    monkeypatch.setattr(module, "STATE_DIR", str(tmp_path))
    return module


def xid_line(module, gpu: int, value: int) -> None:
    with open(module.XID_EVENTS_PATH, "a") as f:
        f.write(f"{gpu} {value}\n")


def wait_until(what: str, check):
    deadline = time.monotonic() + WAIT_S
    while not (value := check()):
        assert time.monotonic() < deadline, f"waited {WAIT_S} s for {what}"
        time.sleep(0.05)
    return value


def test_the_stand_ins_event_api_is_nvidia_ml_pys(standin):
    for name in EVENT_CALLS:
        assert list(inspect.signature(getattr(standin, name)).parameters) == \
            list(inspect.signature(getattr(real, name)).parameters), name
    for name in ("nvmlEventTypeXidCriticalError", "NVML_ERROR_TIMEOUT", "NVML_ERROR_NOT_SUPPORTED"):
        assert getattr(standin, name) == getattr(real, name), name
    assert [f for f, _ in real.c_nvmlEventData_t._fields_] == list(vars(standin.c_nvmlEventData_t(0, 8, 79)))
    for cls in ("NVMLError_Timeout", "NVMLError_NotSupported"):
        assert (getattr(standin, cls)().value, str(getattr(standin, cls)())) == \
            (getattr(real, cls)().value, str(getattr(real, cls)())), cls
    # the watcher's own copies of NVML's numbers (the rig side imports no pynvml at import time)
    assert (xid.XID_EVENT, xid.NVML_ERROR_TIMEOUT, xid.NVML_ERROR_NOT_SUPPORTED) == \
        (real.nvmlEventTypeXidCriticalError, real.NVML_ERROR_TIMEOUT, real.NVML_ERROR_NOT_SUPPORTED)


def scrape_text(xids) -> str:
    reading = {"labels": {"gpu": "1", "UUID": "GPU-1", "modelName": "RTX 4090", "device": "nvidia1"},
               "DCGM_FI_DEV_POWER_USAGE": 300.0}
    other = {"labels": {**reading["labels"], "gpu": "0", "device": "nvidia0"}, "DCGM_FI_DEV_POWER_USAGE": 300.0}
    families = metrics.build([other, reading], {}, None, {}, {}, {}, 0.0, xids)

    class Collector:
        def collect(self):
            return metrics.to_prometheus(families, core)

    registry = CollectorRegistry()
    registry.register(Collector())
    return generate_latest(registry).decode()


def test_an_xid_is_counted_per_gpu_and_exported_under_dcgms_name(standin):
    """An Xid before the watch began is not the watcher's (NVML delivers events to a set registered
    before them); Xid 79 on GPU 1 afterwards is counted once, GPU 0 stays at 0."""
    xid_line(standin, 1, 13)
    counts, stop, said = xid.XidCounts(), threading.Event(), []
    watcher = threading.Thread(target=xid.watch, args=(standin, [0, 1], counts, stop, said.append),
                               kwargs={"wait_ms": 200}, daemon=True)
    watcher.start()
    try:
        wait_until("both GPUs watched", lambda: counts.snapshot() == {0: (0, 0), 1: (0, 0)})
        xid_line(standin, 1, 79)
        wait_until("Xid 79 counted on GPU 1", lambda: counts.snapshot()[1] == (1, 79))
        assert counts.snapshot()[0] == (0, 0)
    finally:
        stop.set()
        watcher.join(timeout=WAIT_S)
    assert not watcher.is_alive(), "the watcher did not stop within its bounded wait"
    assert said == ["watching Xid events of GPUs [0, 1]"]
    text = scrape_text(counts.snapshot())
    assert 'DCGM_FI_DEV_XID_ERRORS{UUID="GPU-1",device="nvidia1",gpu="1",modelName="RTX 4090"} 79.0' in text
    assert 'rigkit_gpu_xid_errors_total{UUID="GPU-1",device="nvidia1",gpu="1",modelName="RTX 4090"} 1.0' in text
    assert 'rigkit_gpu_xid_errors_total{UUID="GPU-1",device="nvidia0",gpu="0",modelName="RTX 4090"} 0.0' in text
    assert "# TYPE rigkit_gpu_xid_errors_total counter" in text


def test_a_gpu_without_xid_events_is_left_out_and_nvml_failing_ends_the_watch_until_it_answers(standin, monkeypatch):
    """GPU 0's NVML has no Xid events (only P-state ones): it is not watched and has no Xid series.
    Then the wait fails as NVML does after a driver reload (GPU is lost): nothing is watched, so no
    Xid series is served, until a registration succeeds again."""
    supported = standin.nvmlDeviceGetSupportedEventTypes
    monkeypatch.setattr(standin, "nvmlDeviceGetSupportedEventTypes",
                        lambda handle: standin.nvmlEventTypePState if handle == 0 else supported(handle))
    lost = threading.Event()
    wait = standin.nvmlEventSetWait_v2

    def failing_wait(eventSet, timeoutms):  # noqa: N803
        if lost.is_set():
            raise standin.NVMLError("GPU is lost")
        return wait(eventSet, timeoutms)

    monkeypatch.setattr(standin, "nvmlEventSetWait_v2", failing_wait)
    counts, stop, said = xid.XidCounts(), threading.Event(), []
    watcher = threading.Thread(target=xid.watch, args=(standin, [0, 1], counts, stop, said.append),
                               kwargs={"wait_ms": 100, "retry_s": 0.5}, daemon=True)
    watcher.start()
    try:
        wait_until("GPU 1 alone watched", lambda: counts.snapshot() == {1: (0, 0)})
        assert "DCGM_FI_DEV_XID_ERRORS" not in scrape_text({})
        lost.set()
        wait_until("the watch ended", lambda: counts.snapshot() == {})
        assert "Xid events cannot be watched (GPU is lost); trying again every 0.5 s" in said
        lost.clear()
        wait_until("GPU 1 watched again", lambda: counts.snapshot() == {1: (0, 0)})
    finally:
        stop.set()
        watcher.join(timeout=WAIT_S)
    assert not watcher.is_alive()
