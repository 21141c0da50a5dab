"""Simulated NVML for the rigkit test rig. TEST INFRASTRUCTURE, never product code.

Installed on the simulated rig as the system `pynvml` module, so rigkit's telemetry
sampler runs unchanged there. It implements only the calls the sampler makes.

What it fakes: the GPUs are the ones in /etc/rigkit-sim/gpus.json, with the settings
the simulated nvidia-smi stored in /run/nvidia-sim/state.json. There is no real load:
every sample reads as a GPU under steady load, drawing 92% of its enforced limit, with
the SM clock one 15 MHz step below the lock ceiling (as real cards peak at 2190 under
a 2200 lock), or 90% of the maximum clock when unlocked. A GPU configured with
"ignores_clock_lock": true runs at 2640 MHz whatever the lock (a lock not in effect).
The driver version is "driver_version" in gpus.json, or SIM_DRIVER_VERSION.
The energy counter is that power integrated since the rig booted, so it agrees with
the power samples. RIGKIT_SIMULATED marks every run it produced as simulated.
"""

import json
import os

RIGKIT_SIMULATED = True

NVML_SUCCESS = 0
NVML_CLOCK_GRAPHICS, NVML_CLOCK_SM, NVML_CLOCK_MEM = 0, 1, 2
NVML_TEMPERATURE_GPU = 0
NVML_VALUE_TYPE_DOUBLE, NVML_VALUE_TYPE_UNSIGNED_INT, NVML_VALUE_TYPE_UNSIGNED_LONG = 0, 1, 2
NVML_VALUE_TYPE_UNSIGNED_LONG_LONG, NVML_VALUE_TYPE_SIGNED_LONG_LONG, NVML_VALUE_TYPE_SIGNED_INT = 3, 4, 5
NVML_FI_DEV_POWER_AVERAGE = 185
NVML_FI_DEV_POWER_INSTANT = 186
NVML_FI_DEV_CLOCKS_EVENT_REASON_SW_POWER_CAP = 246
NVML_FI_DEV_CLOCKS_EVENT_REASON_SYNC_BOOST = 247
NVML_FI_DEV_CLOCKS_EVENT_REASON_SW_THERM_SLOWDOWN = 248
NVML_FI_DEV_CLOCKS_EVENT_REASON_HW_THERM_SLOWDOWN = 249
NVML_FI_DEV_CLOCKS_EVENT_REASON_HW_POWER_BRAKE_SLOWDOWN = 250
LOAD_SHARE = 0.92
IGNORED_LOCK_MHZ = 2640
SIM_DRIVER_VERSION = "580.95.05"


class NVMLError(Exception):
    pass


class _Value:
    class _Union:
        def __init__(self, number):
            self.uiVal = self.ulVal = self.ullVal = self.sllVal = self.siVal = int(number)
            self.dval = float(number)

    def __init__(self, number, kind=NVML_VALUE_TYPE_UNSIGNED_INT):
        self.nvmlReturn = NVML_SUCCESS
        self.valueType = kind
        self.value = self._Union(number)


def _config():
    with open("/etc/rigkit-sim/gpus.json") as f:
        return json.load(f)["gpus"]


def _limit_w(index):
    try:
        with open("/run/nvidia-sim/state.json") as f:
            return float(json.load(f)[index]["power_limit_w"])
    except FileNotFoundError:
        return float(_config()[index]["default_w"])


def _lock(index):
    try:
        with open("/run/nvidia-sim/state.json") as f:
            return json.load(f)[index]["clock_lock"]
    except FileNotFoundError:
        return None


def _seconds_since_boot():
    with open("/proc/uptime") as f:
        uptime = float(f.read().split()[0])
    with open("/proc/1/stat") as f:
        start_ticks = int(f.read().rsplit(")", 1)[1].split()[19])
    return uptime - start_ticks / os.sysconf("SC_CLK_TCK")


def nvmlInit():
    _config()


def nvmlSystemGetDriverVersion():
    with open("/etc/rigkit-sim/gpus.json") as f:
        return json.load(f).get("driver_version", SIM_DRIVER_VERSION)


def nvmlShutdown():
    pass


def nvmlDeviceGetHandleByIndex(index):
    if not 0 <= index < len(_config()):
        raise NVMLError("Invalid Argument")
    return index


def nvmlDeviceGetName(handle):
    return _config()[handle]["name"]


def nvmlDeviceGetPowerManagementDefaultLimit(handle):
    return int(_config()[handle]["default_w"] * 1000)


def nvmlDeviceGetEnforcedPowerLimit(handle):
    return int(_limit_w(handle) * 1000)


def nvmlDeviceGetMaxClockInfo(handle, clock):
    return _config()[handle]["max_clock_mhz"]


def nvmlDeviceGetClockInfo(handle, clock):
    if clock == NVML_CLOCK_MEM:
        return 10501
    gpu, lock = _config()[handle], _lock(handle)
    if gpu.get("ignores_clock_lock"):
        return IGNORED_LOCK_MHZ
    if lock:
        return min(gpu["max_clock_mhz"], lock[1] - lock[1] % 15 - (15 if lock[1] % 15 == 0 else 0))
    return int(gpu["max_clock_mhz"] * 0.9)


def nvmlDeviceGetTemperature(handle, sensor):
    return 66


def nvmlDeviceGetCurrentClocksEventReasons(handle):
    return 0x4  # SW power cap: a capped card under load sits at its limit


def nvmlDeviceGetTotalEnergyConsumption(handle):
    return int(_limit_w(handle) * LOAD_SHARE * _seconds_since_boot() * 1000)


def nvmlDeviceGetFieldValues(handle, field_ids):
    power_mw = _limit_w(handle) * LOAD_SHARE * 1000
    values = {NVML_FI_DEV_POWER_INSTANT: power_mw, NVML_FI_DEV_POWER_AVERAGE: power_mw}
    seconds = _seconds_since_boot()
    values[NVML_FI_DEV_CLOCKS_EVENT_REASON_SW_POWER_CAP] = seconds * 1e6
    return [_Value(values.get(i, 0), NVML_VALUE_TYPE_UNSIGNED_LONG_LONG if i >= 246 else NVML_VALUE_TYPE_UNSIGNED_INT)
            for i in field_ids]
