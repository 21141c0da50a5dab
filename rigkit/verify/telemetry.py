"""GPU telemetry under load from NVML: the sampler that runs on the rig while a benchmark runs.

Standard library plus `pynvml` (from nvidia-ml-py) only: the deploy copies this
file and pynvml.py to the rig and runs it there as a script:

    python3 rigkit-telemetry.py --gpus 0,1 --hz 50 --out /tmp/run.json [--max-seconds 900]

It samples every listed GPU until SIGTERM/SIGINT or --max-seconds, then writes
one JSON document (see docs/verification.md) with the driver version. Per sample: SM and memory clock,
instant and 1 s average power, temperature, clock event reasons (bitmask) and
their cumulative counters, and the enforced power limit. The energy counter is a
slow call (~4 ms), so it is read once at the start and once at the end, never polled.
It only reads: it never sets a limit, a lock or any other setting.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
import time

import pynvml

# (name in the output, NVML field id, scale to the output's unit). The clock-event counters are
# cumulative time under each reason; on an H200 one rose by 1.23e10 over ~12 s of SW-power-capped
# load, so they are nanoseconds there (the field notes said microseconds): stored raw, as `_ns`.
FIELDS = (
    ("power_instant_w", pynvml.NVML_FI_DEV_POWER_INSTANT, 1e-3),
    ("power_average_w", pynvml.NVML_FI_DEV_POWER_AVERAGE, 1e-3),
    ("sw_power_cap_ns", pynvml.NVML_FI_DEV_CLOCKS_EVENT_REASON_SW_POWER_CAP, 1.0),
    ("sw_thermal_ns", pynvml.NVML_FI_DEV_CLOCKS_EVENT_REASON_SW_THERM_SLOWDOWN, 1.0),
    ("hw_thermal_ns", pynvml.NVML_FI_DEV_CLOCKS_EVENT_REASON_HW_THERM_SLOWDOWN, 1.0),
    ("hw_power_brake_ns", pynvml.NVML_FI_DEV_CLOCKS_EVENT_REASON_HW_POWER_BRAKE_SLOWDOWN, 1.0),
)
MAX_ERRORS_KEPT = 3
SERIES = ("t", "sm_mhz", "mem_mhz", "temp_c", "event_reasons", "enforced_limit_w") + tuple(f[0] for f in FIELDS)


def _field_number(value) -> float | None:
    if value.nvmlReturn != pynvml.NVML_SUCCESS:
        return None
    kind = value.valueType
    if kind == pynvml.NVML_VALUE_TYPE_DOUBLE:
        return value.value.dval
    if kind == pynvml.NVML_VALUE_TYPE_UNSIGNED_INT:
        return float(value.value.uiVal)
    if kind == pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG:
        return float(value.value.ulVal)
    if kind == pynvml.NVML_VALUE_TYPE_SIGNED_LONG_LONG:
        return float(value.value.sllVal)
    if kind == pynvml.NVML_VALUE_TYPE_SIGNED_INT:
        return float(value.value.siVal)
    return float(value.value.ullVal)


def _optional(call, *args):
    try:
        return call(*args)
    except pynvml.NVMLError:
        return None


class Sampler:
    """Samples the given GPUs at `hz` on a background thread between start() and stop()."""

    def __init__(self, gpu_indices: list[int], hz: float = 50.0):
        self.gpu_indices = list(gpu_indices)
        self.period_s = 1.0 / hz
        self.hz = hz
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> "Sampler":
        pynvml.nvmlInit()
        driver = _optional(getattr(pynvml, "nvmlSystemGetDriverVersion", lambda: None))
        self.driver_version = driver.decode() if isinstance(driver, bytes) else driver
        self.handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in self.gpu_indices]
        self.gpus = []
        for index, handle in zip(self.gpu_indices, self.handles):
            name = pynvml.nvmlDeviceGetName(handle)
            self.gpus.append({
                "index": index,
                "name": name.decode() if isinstance(name, bytes) else name,
                "default_limit_w": _scaled(_optional(pynvml.nvmlDeviceGetPowerManagementDefaultLimit, handle)),
                "max_clock_sm_mhz": _optional(pynvml.nvmlDeviceGetMaxClockInfo, handle, pynvml.NVML_CLOCK_SM),
                "samples": {key: [] for key in SERIES},
                "errors": [],
            })
        self.t_start = time.time()
        for gpu, handle in zip(self.gpus, self.handles):
            gpu["energy_start_mj"] = _optional(pynvml.nvmlDeviceGetTotalEnergyConsumption, handle)
        self._thread = threading.Thread(target=self._run, name="rigkit-telemetry", daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        next_tick = time.monotonic()
        field_ids = [f[1] for f in FIELDS]
        while not self._stop.is_set():
            for gpu, handle in zip(self.gpus, self.handles):
                try:
                    sample = self._sample(handle, field_ids)
                except Exception as exc:  # noqa: BLE001 (a binding's surprise must not end the sampling unseen)
                    # Each series stays the same length (a sample is appended whole or not at all); what went
                    # wrong is kept for the rate check's message, a few distinct lines at most.
                    said = f"{type(exc).__name__}: {exc}"[:200]
                    if said not in gpu["errors"] and len(gpu["errors"]) < MAX_ERRORS_KEPT:
                        gpu["errors"].append(said)
                    continue
                for key, value in sample.items():
                    gpu["samples"][key].append(value)
            next_tick += self.period_s
            self._stop.wait(max(0.0, next_tick - time.monotonic()))

    @staticmethod
    def _sample(handle, field_ids) -> dict:
        sample = {
            "t": time.time(),
            "sm_mhz": _optional(pynvml.nvmlDeviceGetClockInfo, handle, pynvml.NVML_CLOCK_SM),
            "mem_mhz": _optional(pynvml.nvmlDeviceGetClockInfo, handle, pynvml.NVML_CLOCK_MEM),
            "temp_c": _optional(pynvml.nvmlDeviceGetTemperature, handle, pynvml.NVML_TEMPERATURE_GPU),
            "event_reasons": _optional(pynvml.nvmlDeviceGetCurrentClocksEventReasons, handle),
            "enforced_limit_w": _scaled(_optional(pynvml.nvmlDeviceGetEnforcedPowerLimit, handle)),
        }
        values = _optional(pynvml.nvmlDeviceGetFieldValues, handle, field_ids)
        for n, (key, _, scale) in enumerate(FIELDS):
            number = _field_number(values[n]) if values is not None else None
            sample[key] = None if number is None else number * scale
        return sample

    def stop(self) -> dict:
        self._stop.set()
        if self._thread:
            self._thread.join()
        self.t_end = time.time()
        for gpu, handle in zip(self.gpus, self.handles):
            gpu["energy_end_mj"] = _optional(pynvml.nvmlDeviceGetTotalEnergyConsumption, handle)
        pynvml.nvmlShutdown()
        return {
            "simulated": bool(getattr(pynvml, "RIGKIT_SIMULATED", False)),
            "hz_requested": self.hz,
            "driver_version": self.driver_version,
            "t_start": self.t_start,
            "t_end": self.t_end,
            "gpus": self.gpus,
        }


def _scaled(milliwatts):
    return None if milliwatts is None else milliwatts / 1000.0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description="Sample NVIDIA GPUs through NVML until stopped.")
    parser.add_argument("--gpus", required=True, help="comma-separated GPU indices")
    parser.add_argument("--hz", type=float, default=50.0)
    parser.add_argument("--out", required=True)
    parser.add_argument("--max-seconds", type=float, default=900.0)
    args = parser.parse_args(argv)
    done = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: done.set())
    sampler = Sampler([int(i) for i in args.gpus.split(",")], args.hz).start()
    print("sampling", flush=True)
    done.wait(args.max_seconds)
    run = sampler.stop()
    with open(args.out + ".tmp", "w") as f:
        json.dump(run, f)
    os.replace(args.out + ".tmp", args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
