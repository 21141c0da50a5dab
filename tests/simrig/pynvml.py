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

Idle GPUs (the GPU keeper's idle-energy ledger, rigside.idle_energy): a GPU whose index a test
wrote into /run/nvidia-sim/idle reads as idle instead: utilization 0 and the draw the simulated
nvidia-smi reads (its idle draw, plus the GPU's context_draw_w while a stand-in holds memory on
it). Every other GPU reads utilization 100 (the steady load above).

For `rigkit tune` (docs/simulated-rig.md):
- Clock offsets: nvmlDeviceGetClockOffsets / nvmlDeviceSetClockOffsets with nvidia-ml-py's
  c_nvmlClockOffset_t (passed as is or through ctypes.byref), per GPU and domain (graphics,
  memory) within "offset_range_mhz" of gpus.json; stored in state.json beside nvidia-smi's
  settings, so a reboot forgets them. Out of range: NVMLError "Invalid Argument". A GPU without
  "offset_range_mhz" raises "Not Supported", as older drivers do. Like the real binding, a
  set does not prove itself: read it back.
- A GPU with "tune_profile" (a name in tests/sim_curves.py) draws and clocks as that curve says
  for its current limit, lock and offsets; "held_at_w" is another firmware limit that holds the
  card at that draw while the requested limit is reported as enforced (seed 004's "requested
  106 W, drew 70 W"); the power-cap reason is set only while the cap (or that limit) holds it.

Xid events (the monitoring exporter): nvmlEventSetCreate, nvmlDeviceGetSupportedEventTypes,
nvmlDeviceRegisterEvents, nvmlEventSetWait(_v2), nvmlEventSetFree and nvmlDeviceGetIndex, with
nvidia-ml-py's names, constants and event data fields (device, eventType, eventData,
gpuInstanceId, computeInstanceId). A test makes an Xid by appending a line "GPU XID" to
/run/nvidia-sim/xid-events (the kernel's part on a real rig). As in NVML, a set gets only the
events after its registration, each once; a wait with none raises NVMLError_Timeout after its
timeout; a type the GPU does not support (only Xid, P-state and clock events here: no ECC on
these GeForce cards) raises NVMLError_NotSupported.
"""

import fcntl
import json
import os
import time

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
NVML_PSTATE_0 = 0
nvmlClockOffset_v1 = 0x1000018
STATE_DIR = "/run/nvidia-sim"
_DOMAINS = {NVML_CLOCK_GRAPHICS: "graphics", NVML_CLOCK_MEM: "memory"}
LOAD_SHARE = 0.92
IGNORED_LOCK_MHZ = 2640
SIM_DRIVER_VERSION = "580.95.05"


NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_TIMEOUT = 10
nvmlEventTypePState = 0x0000000000000004
nvmlEventTypeXidCriticalError = 0x0000000000000008
nvmlEventTypeClock = 0x0000000000000010
_SUPPORTED_EVENTS = nvmlEventTypeXidCriticalError | nvmlEventTypePState | nvmlEventTypeClock
XID_EVENTS_PATH = STATE_DIR + "/xid-events"
IDLE_PATH = STATE_DIR + "/idle"  # a test's switch: the GPUs listed read idle
_EVENT_POLL_S = 0.1


class NVMLError(Exception):
    pass


class NVMLError_NotSupported(NVMLError):  # noqa: N801 (nvidia-ml-py's names, value and text)
    value = NVML_ERROR_NOT_SUPPORTED

    def __init__(self):
        super().__init__("Not Supported")


class NVMLError_Timeout(NVMLError):  # noqa: N801
    value = NVML_ERROR_TIMEOUT

    def __init__(self):
        super().__init__("Timeout")


class c_nvmlEventData_t:  # noqa: N801 (nvidia-ml-py's name and fields)
    def __init__(self, device, event_type, event_data):
        self.device, self.eventType, self.eventData = device, event_type, event_data
        self.gpuInstanceId = self.computeInstanceId = 0xFFFFFFFF  # not a MIG instance


class _EventSet:
    def __init__(self):
        self.types = {}  # GPU index -> registered event types
        self.offset = _xid_log_size()  # events before the set existed are not its own


def _xid_log_size():
    try:
        return os.path.getsize(XID_EVENTS_PATH)
    except OSError:
        return 0


class c_nvmlClockOffset_t:  # noqa: N801 (nvidia-ml-py's name)
    def __init__(self):
        self.version = self.type = self.pstate = 0
        self.clockOffsetMHz = self.minClockOffsetMHz = self.maxClockOffsetMHz = 0


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


def _state():
    try:
        with open(STATE_DIR + "/state.json") as f:
            return json.load(f)
    except FileNotFoundError:
        return [{"power_limit_w": g["default_w"], "clock_lock": None, "persistence": False} for g in _config()]


def _limit_w(index):
    return float(_state()[index]["power_limit_w"])


def _lock(index):
    return _state()[index]["clock_lock"]


def _offset(index, domain):
    return int(_state()[index].get(f"{domain}_offset_mhz", 0))


def _truth(index):
    """The curve's answer for this GPU's settings, or None for a GPU without a tune profile."""
    gpu = _config()[index]
    if not gpu.get("tune_profile"):
        return None
    import rigkit_sim_curves as curves  # tests/sim_curves.py, mounted beside this module

    lock = _lock(index)
    return curves.truth(curves.PROFILES[gpu["tune_profile"]], _limit_w(index), lock[1] if lock else None,
                        _offset(index, "memory"), _offset(index, "graphics"), gpu.get("held_at_w"),
                        bool(gpu.get("ignores_clock_lock")))


def _info(info):
    return getattr(info, "_obj", info)  # ctypes.byref(info) as the real binding is called


def nvmlDeviceGetClockOffsets(handle, info):
    info = _info(info)
    low, high = _offset_range(handle, info.type)
    info.minClockOffsetMHz, info.maxClockOffsetMHz = low, high
    info.clockOffsetMHz = _offset(handle, _DOMAINS[info.type])
    return NVML_SUCCESS


def nvmlDeviceSetClockOffsets(handle, info):
    info = _info(info)
    low, high = _offset_range(handle, info.type)
    if not low <= info.clockOffsetMHz <= high:
        raise NVMLError("Invalid Argument")
    if os.geteuid() != 0:
        raise NVMLError("Insufficient Permissions")
    os.makedirs(STATE_DIR, exist_ok=True)
    with open(STATE_DIR + "/lock", "w") as lock:  # the simulated nvidia-smi's lock: one writer at a time
        fcntl.flock(lock, fcntl.LOCK_EX)
        state = _state()
        state[handle][f"{_DOMAINS[info.type]}_offset_mhz"] = int(info.clockOffsetMHz)
        with open(STATE_DIR + "/state.json.tmp", "w") as f:
            json.dump(state, f)
        os.replace(STATE_DIR + "/state.json.tmp", STATE_DIR + "/state.json")
        with open(STATE_DIR + "/calls.log", "a") as log:
            log.write(f"nvml set {_DOMAINS[info.type]} offset {info.clockOffsetMHz} on GPU {handle}\n")
    return NVML_SUCCESS


def _offset_range(handle, clock_type):
    ranges = _config()[handle].get("offset_range_mhz")
    if not ranges or clock_type not in _DOMAINS:
        raise NVMLError("Not Supported")
    return tuple(ranges[_DOMAINS[clock_type]])


def _seconds_since_boot():
    with open("/proc/uptime") as f:
        uptime = float(f.read().split()[0])
    with open("/proc/1/stat") as f:
        start_ticks = int(f.read().rsplit(")", 1)[1].split()[19])
    return uptime - start_ticks / os.sysconf("SC_CLK_TCK")


def nvmlInit():
    while os.path.exists(STATE_DIR + "/hang"):  # a wedged GPU or driver (nvidia-smi's switch too)
        time.sleep(0.5)
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


def nvmlDeviceGetPowerManagementLimit(handle):
    return int(_limit_w(handle) * 1000)  # the requested limit (nvidia-smi -pl)


def nvmlDeviceGetUUID(handle):
    return f"GPU-00000000-0000-4000-8000-{handle:012d}"  # fixed per index: a simulated card's identity


def nvmlDeviceGetPowerUsage(handle):
    return int(_draw_w(handle) * 1000)  # mW, as NVML answers (a 1 s average on Ampere and newer)


def nvmlDeviceGetEnforcedPowerLimit(handle):
    return int(_limit_w(handle) * 1000)


def nvmlDeviceGetMaxClockInfo(handle, clock):
    return _config()[handle]["max_clock_mhz"]


def nvmlDeviceGetClockInfo(handle, clock):
    if clock == NVML_CLOCK_MEM:
        return 10501 + _offset(handle, "memory") // 2  # NVML's memory offset is twice the clock's change
    truth = _truth(handle)
    if truth is not None:
        return int(truth.sm_mhz)
    gpu, lock = _config()[handle], _lock(handle)
    if gpu.get("ignores_clock_lock"):
        return IGNORED_LOCK_MHZ
    if lock:
        return min(gpu["max_clock_mhz"], lock[1] - lock[1] % 15 - (15 if lock[1] % 15 == 0 else 0))
    return int(gpu["max_clock_mhz"] * 0.9)


def nvmlDeviceGetTemperature(handle, sensor):
    return 66


def nvmlDeviceGetCurrentClocksEventReasons(handle):
    truth = _truth(handle)
    if truth is not None and not truth.power_capped:
        return 0x0
    return 0x4  # SW power cap: a capped card under load sits at its limit


def _idle(handle):
    """A GPU a test listed in IDLE_PATH (one index per line) reads idle."""
    try:
        with open(IDLE_PATH) as f:
            return str(handle) in f.read().split()
    except FileNotFoundError:
        return False


_IDLE_DRAW = {}  # handle: (monotonic time, W): nvidia-smi asked at most once a second per GPU


def _draw_w(handle):
    if _idle(handle):  # what the simulated nvidia-smi reads: its idle draw, a context's more while memory is held
        import subprocess

        cached = _IDLE_DRAW.get(handle)
        if cached and time.monotonic() - cached[0] < 1.0:
            return cached[1]

        try:
            found = subprocess.run(["nvidia-smi", "--query-gpu=power.draw", "--format=csv,noheader,nounits", "-i",
                                    str(handle)], capture_output=True, text=True, timeout=30)
            _IDLE_DRAW[handle] = (time.monotonic(), float(found.stdout.strip()))
            return _IDLE_DRAW[handle][1]
        except (subprocess.TimeoutExpired, ValueError):
            raise NVMLError("Unknown Error")
    truth = _truth(handle)
    return truth.draw_w if truth is not None else _limit_w(handle) * LOAD_SHARE


class c_nvmlUtilization_t:  # noqa: N801 (nvidia-ml-py's name and fields)
    def __init__(self, gpu, memory):
        self.gpu, self.memory = gpu, memory


def nvmlDeviceGetUtilizationRates(handle):
    return c_nvmlUtilization_t(0, 0) if _idle(handle) else c_nvmlUtilization_t(100, 60)


def nvmlDeviceGetTotalEnergyConsumption(handle):
    """mJ: the draw read now times the time since the rig booted. It agrees with the power samples while
    the draw holds (steady load, or an idle GPU whose memory stays as it is); a GPU whose draw changed
    (listed idle, or not, since) jumps once, as a counter the ledger does not believe (rigside.idle_energy
    then takes the power readings). The time is read first, as a real counter answers for the moment of the
    call: _draw_w of an idle GPU may run the simulated nvidia-smi, which takes a few hundred ms on a loaded
    machine, and a reading that late made the ledger's idle draw 24.9 W for 24.5 W."""
    seconds = _seconds_since_boot()
    return int(_draw_w(handle) * seconds * 1000)


def nvmlDeviceGetFieldValues(handle, field_ids):
    power_mw = _draw_w(handle) * 1000
    values = {NVML_FI_DEV_POWER_INSTANT: power_mw, NVML_FI_DEV_POWER_AVERAGE: power_mw}
    seconds = _seconds_since_boot()
    capped = nvmlDeviceGetCurrentClocksEventReasons(handle) & 0x4
    values[NVML_FI_DEV_CLOCKS_EVENT_REASON_SW_POWER_CAP] = seconds * 1e6 if capped else 0
    return [_Value(values.get(i, 0), NVML_VALUE_TYPE_UNSIGNED_LONG_LONG if i >= 246 else NVML_VALUE_TYPE_UNSIGNED_INT)
            for i in field_ids]


def nvmlDeviceGetIndex(handle):
    return handle


def nvmlEventSetCreate():
    return _EventSet()


def nvmlDeviceGetSupportedEventTypes(handle):
    return _SUPPORTED_EVENTS


def nvmlDeviceRegisterEvents(handle, eventTypes, eventSet):  # noqa: N803 (nvidia-ml-py's argument names)
    if eventTypes & ~_SUPPORTED_EVENTS:
        raise NVMLError_NotSupported()
    eventSet.types[handle] = eventSet.types.get(handle, 0) | eventTypes


def nvmlEventSetWait_v2(eventSet, timeoutms):  # noqa: N803
    """The next Xid of a registered GPU appended since the set's last event, waiting up to timeoutms."""
    deadline = time.monotonic() + timeoutms / 1000
    while True:
        try:
            with open(XID_EVENTS_PATH, "rb") as f:
                f.seek(eventSet.offset)
                lines = f.read()
        except OSError:
            lines = b""
        while b"\n" in lines:
            line, lines = lines.split(b"\n", 1)
            eventSet.offset += len(line) + 1
            gpu, xid = (int(cell) for cell in line.split())
            if eventSet.types.get(gpu, 0) & nvmlEventTypeXidCriticalError:
                return c_nvmlEventData_t(gpu, nvmlEventTypeXidCriticalError, xid)
        if time.monotonic() >= deadline:
            raise NVMLError_Timeout()
        time.sleep(min(_EVENT_POLL_S, max(0.0, deadline - time.monotonic())))


def nvmlEventSetWait(eventSet, timeoutms):  # noqa: N803
    return nvmlEventSetWait_v2(eventSet, timeoutms)


def nvmlEventSetFree(eventSet):  # noqa: N803
    eventSet.types.clear()
