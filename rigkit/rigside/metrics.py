"""The monitoring exporter's metrics: their names, and the metric set built from NVML and rigkit's
own state files. Pure (no prometheus-client, no NVML import): the exporter on the rig
(templates/monitoring/rigkit-exporter.py) hands it the pynvml module and the files' contents, and
turns the families into prometheus-client's; the control side imports the names for the recording
rules and the dashboards (rigkit.monitoring). Standard library only (it runs on rigs too).

Names: DCGM's (dcgm-exporter's DCGM_FI_* fields, same units and labels `gpu`, `UUID`, `modelName`,
`device`) wherever DCGM has the metric, so DCGM dashboards import unchanged; `rigkit_*` for the rest.
A value NVML does not answer on this GPU (ECC on a GeForce card, a call missing from an old
nvidia-ml-py) is left out, never reported as 0.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .idle_energy import ALL_S, IDLE_J, IDLE_S, last_day, normalized
from .names import GPU_KEEPER_CAUSES

# name: (type, help). DCGM field numbers in the help where the name is DCGM's.
GPU_METRICS = {
    "DCGM_FI_DEV_POWER_USAGE": ("gauge", "Power draw (in W), NVML's power usage (a 1 s average on Ampere and newer) (DCGM field 155)."),
    "DCGM_FI_DEV_POWER_MGMT_LIMIT": ("gauge", "Power management limit as requested (in W) (DCGM field 160)."),
    "DCGM_FI_DEV_POWER_MGMT_LIMIT_DEF": ("gauge", "Default power management limit (in W) (DCGM field 163)."),
    "DCGM_FI_DEV_ENFORCED_POWER_LIMIT": ("gauge", "Power limit the driver enforces after all limiters (in W) (DCGM field 164)."),
    "DCGM_FI_DEV_SM_CLOCK": ("gauge", "SM clock frequency (in MHz) (DCGM field 100)."),
    "DCGM_FI_DEV_MEM_CLOCK": ("gauge", "Memory clock frequency (in MHz) (DCGM field 101)."),
    "DCGM_FI_DEV_MAX_SM_CLOCK": ("gauge", "Maximum SM clock of the hardware, locked or not (in MHz) (DCGM field 110)."),
    "DCGM_FI_DEV_GPU_TEMP": ("gauge", "GPU temperature (in C) (DCGM field 150)."),
    "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": ("counter", "Total energy consumption since the driver was loaded (in mJ) (DCGM field 156)."),
    "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS": ("gauge", "Current clock event (throttle) reasons, NVML's bitmask: 0x4 SW power cap, "
                                           "0x20 SW thermal, 0x40 HW thermal, 0x80 HW power brake (DCGM field 112)."),
    "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL": ("counter", "Corrected (single-bit) ECC errors since the driver was loaded (DCGM field 310)."),
    "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL": ("counter", "Uncorrected (double-bit) ECC errors since the driver was loaded (DCGM field 311)."),
}
# Xids, from NVML's events (rigside.xid): only for GPUs whose Xid events the exporter watches.
XID_METRICS = {
    "DCGM_FI_DEV_XID_ERRORS": ("gauge", "Value of the last Xid error seen since the exporter started watching; 0: none "
                               "(DCGM field 230)."),
    "rigkit_gpu_xid_errors_total": ("counter", "Xid errors seen since the exporter started watching the GPU's events."),
}
# rigkit's own, per GPU: what the rig file asks for (the GPU policy file the deploy wrote).
POLICY_METRICS = {
    "rigkit_gpu_power_limit_configured_watts": ("gauge", "Power limit the rig file configures (the driver default where it says none)."),
    "rigkit_gpu_clock_lock_floor_mhz": ("gauge", "Configured SM clock lock floor (absent: no lock configured). A lock cannot be read back: compare DCGM_FI_DEV_SM_CLOCK under load."),
    "rigkit_gpu_clock_lock_ceiling_mhz": ("gauge", "Configured SM clock lock ceiling (absent: no lock configured)."),
    "rigkit_gpu_policy_drift": ("gauge", "1 while the enforced power limit differs from the configured one by 0.5 W or more."),
}
RIG_METRICS = {
    "rigkit_gpu_policy_repairs_total": ("counter", f"Repairs of the GPU policy by the keeper, by cause ({', '.join(GPU_KEEPER_CAUSES)})."),
    "rigkit_gpu_policy_last_repair_timestamp_seconds": ("gauge", "When the keeper last repaired the GPU policy (Unix time)."),
    "rigkit_gpu_policy_last_repair_ok": ("gauge", "1 when the keeper's last repair held, 0 when it did not."),
    "rigkit_gpu_policy_keeper_holding": ("gauge", "1 while the keeper holds off repairs (a tune session, a deploy applying a policy)."),
    "rigkit_watchdog_restarts_last_hour": ("gauge", "Restarts of the model by the watchdog in the last hour."),
    "rigkit_watchdog_last_restart_timestamp_seconds": ("gauge", "When the watchdog last restarted the model (Unix time)."),
    "rigkit_verify_decode_tokens_per_second": ("gauge", "Decode rate of the model's last verification (tokens/s, one stream)."),
    "rigkit_verify_ttft_seconds": ("gauge", "Time to first token of the model's last verification."),
    "rigkit_verify_joules_per_output_token": ("gauge", "GPU energy per output token of the model's last verification (J)."),
    "rigkit_verify_passed": ("gauge", "1 when the model's last verification passed all its checks."),
    "rigkit_verify_timestamp_seconds": ("gauge", "When the model's last verification ran (Unix time)."),
    "rigkit_model_gpu_info": ("gauge", "1 for each GPU a served model runs on (join key for per-model power)."),
    "rigkit_model_start_seconds": ("gauge", "The model's last start rigkit proved: from its container's start to its first token (s)."),
    "rigkit_model_start_phase_seconds": ("gauge", "Each phase of that start, as vLLM's log marks them (docs/serving.md, Time to ready)."),
    "rigkit_model_start_compile_cache_hit": ("gauge", "1 when that start loaded its compiled graph from the cache, 0 when it compiled (absent: nothing compiled)."),
    "rigkit_model_start_timestamp_seconds": ("gauge", "When that start began (Unix time)."),
    "rigkit_exporter_nvml_up": ("gauge", "1 when NVML answered this scrape."),
    # the GPU keeper's idle-energy ledger (rigside.idle_energy): idle when NVML's utilization read 0
    "rigkit_gpu_idle_energy_joules_total": ("counter", "Energy the GPU drew while idle (utilization 0), since the GPU keeper's ledger began (J)."),
    "rigkit_gpu_idle_seconds_total": ("counter", "Time the GPU was idle (utilization 0), since the ledger began (s)."),
    "rigkit_gpu_measured_seconds_total": ("counter", "Time the ledger measured the GPU, idle or not (s)."),
    "rigkit_idle_energy_kwh_per_day": ("gauge", "The rig's GPUs' idle energy over the last 24 h (kWh), scaled to a day while less was measured (what rigkit status says)."),
}
METRICS = {**GPU_METRICS, **XID_METRICS, **POLICY_METRICS, **RIG_METRICS}
GPU_LABELS = ("gpu", "UUID", "modelName", "device")
TOLERANCE_W = 0.5  # the keeper's (templates/gpu_policy/rigkit-gpu-keeper.py)
HOUR_S = 3600

# NVML constants (pynvml's values), so that a module without one still reads the others
_CLOCK_SM, _CLOCK_MEM = 1, 2
_TEMPERATURE_GPU = 0
_ECC_CORRECTED, _ECC_UNCORRECTED, _VOLATILE_ECC = 0, 1, 0


@dataclass
class Family:
    name: str
    type: str  # gauge | counter
    help: str
    samples: list[tuple[dict[str, str], float]] = field(default_factory=list)


def parse_policy(text: str) -> dict[int, dict]:
    """The GPU policy file (templates/gpu_policy/gpu-policy.conf.j2): {index: {"limit": "330" | "default",
    "lock": (floor, ceiling) | None}}; lines that do not parse are skipped."""
    policy = {}
    for line in text.splitlines():
        cells = line.split()
        if len(cells) < 2 or cells[0].startswith("#") or not cells[0].isdigit():
            continue
        lock = None
        if len(cells) >= 3 and cells[2] != "default":
            floor, _, ceiling = cells[2].partition(",")
            if floor.isdigit() and ceiling.isdigit():
                lock = (int(floor), int(ceiling))
        policy[int(cells[0])] = {"limit": cells[1], "lock": lock}
    return policy


def _call(fn, *args):
    """fn(*args), or None where NVML does not answer it on this GPU (or the binding lacks it)."""
    if fn is None:
        return None
    try:
        return fn(*args)
    except Exception:  # NVMLError_NotSupported and kin: leave the metric out
        return None


def _text(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def read_gpu(nvml, index: int) -> dict:
    """One GPU's readings through `nvml` (the pynvml module or a stand-in): {metric name: value} plus
    "labels". nvmlDeviceGetHandleByIndex failing raises (NVML is down)."""
    handle = nvml.nvmlDeviceGetHandleByIndex(index)
    get = lambda name: getattr(nvml, name, None)  # noqa: E731
    mw = lambda value: None if value is None else value / 1000.0  # noqa: E731
    reasons = get("nvmlDeviceGetCurrentClocksEventReasons") or get("nvmlDeviceGetCurrentClocksThrottleReasons")
    ecc = get("nvmlDeviceGetTotalEccErrors")
    values = {
        "DCGM_FI_DEV_POWER_USAGE": mw(_call(get("nvmlDeviceGetPowerUsage"), handle)),
        "DCGM_FI_DEV_POWER_MGMT_LIMIT": mw(_call(get("nvmlDeviceGetPowerManagementLimit"), handle)),
        "DCGM_FI_DEV_POWER_MGMT_LIMIT_DEF": mw(_call(get("nvmlDeviceGetPowerManagementDefaultLimit"), handle)),
        "DCGM_FI_DEV_ENFORCED_POWER_LIMIT": mw(_call(get("nvmlDeviceGetEnforcedPowerLimit"), handle)),
        "DCGM_FI_DEV_SM_CLOCK": _call(get("nvmlDeviceGetClockInfo"), handle, _CLOCK_SM),
        "DCGM_FI_DEV_MEM_CLOCK": _call(get("nvmlDeviceGetClockInfo"), handle, _CLOCK_MEM),
        "DCGM_FI_DEV_MAX_SM_CLOCK": _call(get("nvmlDeviceGetMaxClockInfo"), handle, _CLOCK_SM),
        "DCGM_FI_DEV_GPU_TEMP": _call(get("nvmlDeviceGetTemperature"), handle, _TEMPERATURE_GPU),
        "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": _call(get("nvmlDeviceGetTotalEnergyConsumption"), handle),
        "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS": _call(reasons, handle),
        "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL": _call(ecc, handle, _ECC_CORRECTED, _VOLATILE_ECC),
        "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL": _call(ecc, handle, _ECC_UNCORRECTED, _VOLATILE_ECC),
    }
    uuid = _call(get("nvmlDeviceGetUUID"), handle)
    name = _call(get("nvmlDeviceGetName"), handle)
    labels = {"gpu": str(index), "UUID": _text(uuid) if uuid is not None else "",
              "modelName": _text(name) if name is not None else "", "device": f"nvidia{index}"}
    return {"labels": labels, **{k: float(v) for k, v in values.items() if v is not None}}


def configured_limit_w(policy_entry: dict | None, reading: dict) -> float | None:
    """The policy's limit in W ("default": the GPU's default limit), or None without a policy."""
    if not policy_entry:
        return None
    if policy_entry["limit"] == "default":
        return reading.get("DCGM_FI_DEV_POWER_MGMT_LIMIT_DEF")
    try:
        return float(policy_entry["limit"])
    except ValueError:
        return None


def _num(value) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _iso_seconds(text) -> float | None:
    from datetime import datetime

    try:
        return datetime.fromisoformat(text).timestamp()
    except (TypeError, ValueError):
        return None


def build(readings: list[dict] | None, policy: dict[int, dict], keeper_state: dict | None,
          watchdog_states: dict[str, dict], verifications: dict[str, dict], model_gpus: dict[str, list[int]],
          now: float, xids: dict[int, tuple[int, int]] | None = None, starts: dict[str, dict] | None = None,
          idle_energy: dict | None = None) -> list[Family]:
    """Every family of one scrape. `readings`: read_gpu's per GPU, or None when NVML did not answer;
    `xids`: rigside.xid.XidCounts.snapshot() ({GPU: (count, last Xid)} of the GPUs watched);
    `keeper_state`: the keeper's state file; `watchdog_states`: {model: its state file};
    `verifications`: {model: the last verification's summary (verification_summary)};
    `model_gpus`: {model: its GPU indexes}; `starts`: {model: its last proven start (rigside.startup's table)};
    `idle_energy`: the keeper's idle-energy ledger as read from its file (None: no file)."""
    families = {name: Family(name, kind, text) for name, (kind, text) in METRICS.items()}

    def add(name, labels, value):
        if value is not None:
            families[name].samples.append((labels, float(value)))

    add("rigkit_exporter_nvml_up", {}, 0 if readings is None else 1)
    for reading in readings or []:
        labels = reading["labels"]
        for name in GPU_METRICS:
            add(name, labels, reading.get(name))
        if int(labels["gpu"]) in (xids or {}):
            count, last = xids[int(labels["gpu"])]
            add("DCGM_FI_DEV_XID_ERRORS", labels, last)
            add("rigkit_gpu_xid_errors_total", labels, count)
        entry = policy.get(int(labels["gpu"]))
        configured = configured_limit_w(entry, reading)
        add("rigkit_gpu_power_limit_configured_watts", labels, configured)
        if entry and entry["lock"]:
            add("rigkit_gpu_clock_lock_floor_mhz", labels, entry["lock"][0])
            add("rigkit_gpu_clock_lock_ceiling_mhz", labels, entry["lock"][1])
        enforced = reading.get("DCGM_FI_DEV_ENFORCED_POWER_LIMIT")
        if configured is not None and enforced is not None:
            add("rigkit_gpu_policy_drift", labels, int(abs(enforced - configured) >= TOLERANCE_W))

    if keeper_state is not None:
        counts = keeper_state.get("counts") or {}
        for cause in GPU_KEEPER_CAUSES:
            add("rigkit_gpu_policy_repairs_total", {"cause": cause}, _num(counts.get(cause, 0)))
        events = [e for e in keeper_state.get("events") or [] if isinstance(e, dict)]
        if events:
            add("rigkit_gpu_policy_last_repair_timestamp_seconds", {}, _iso_seconds(events[-1].get("time")))
            add("rigkit_gpu_policy_last_repair_ok", {}, int(bool(events[-1].get("ok"))))
        add("rigkit_gpu_policy_keeper_holding", {}, int(bool(keeper_state.get("holding"))))

    for model, state in sorted(watchdog_states.items()):
        restarts = [t for t in state.get("restarts") or [] if _num(t) is not None and now - t < HOUR_S]
        add("rigkit_watchdog_restarts_last_hour", {"model": model}, len(restarts))
        add("rigkit_watchdog_last_restart_timestamp_seconds", {"model": model}, _num(state.get("last_restart")))

    for model, summary in sorted(verifications.items()):
        labels = {"model": model}
        add("rigkit_verify_decode_tokens_per_second", labels, _num(summary.get("decode_tok_s")))
        add("rigkit_verify_ttft_seconds", labels, _num(summary.get("ttft_s")))
        add("rigkit_verify_joules_per_output_token", labels, _num(summary.get("joules_per_output_token")))
        if isinstance(summary.get("passed"), bool):
            add("rigkit_verify_passed", labels, int(summary["passed"]))
        add("rigkit_verify_timestamp_seconds", labels, _iso_seconds(summary.get("time")))

    for model, start in sorted((starts or {}).items()):
        labels = {"model": model}
        add("rigkit_model_start_seconds", labels, _num(start.get("total_s")))
        add("rigkit_model_start_timestamp_seconds", labels, _num(start.get("started_at")))
        for phase in start.get("phases") or []:
            if isinstance(phase, dict) and isinstance(phase.get("phase"), str):
                add("rigkit_model_start_phase_seconds", {"model": model, "phase": phase["phase"]}, _num(phase.get("s")))
        cache = (start.get("compile_cache") or {}).get("cache")
        if cache in ("hit", "miss"):
            add("rigkit_model_start_compile_cache_hit", labels, int(cache == "hit"))

    if idle_energy is not None:
        for gpu, cells in sorted(normalized(idle_energy)["totals"].items(), key=lambda item: int(item[0])):
            add("rigkit_gpu_idle_energy_joules_total", {"gpu": gpu}, cells[IDLE_J])
            add("rigkit_gpu_idle_seconds_total", {"gpu": gpu}, cells[IDLE_S])
            add("rigkit_gpu_measured_seconds_total", {"gpu": gpu}, cells[ALL_S])
        day = last_day(idle_energy, now)
        add("rigkit_idle_energy_kwh_per_day", {}, day["idle_kwh_per_day"] if day else None)

    for model, gpus in sorted(model_gpus.items()):
        for index in gpus:
            add("rigkit_model_gpu_info", {"model": model, "gpu": str(index)}, 1)
    return [f for f in families.values() if f.samples]


def verification_summary(result_json: dict) -> dict:
    """What the exporter reads of a verification result (rigkit.verify.result's to_json): the
    verify role writes it to names.VERIFY_SUMMARY_DIR/<model>.json on rigs with monitoring on."""
    figures = result_json.get("figures") or {}
    return {"time": result_json.get("time"), "passed": result_json.get("passed"),
            "decode_tok_s": figures.get("decode_tok_s"), "ttft_s": figures.get("ttft_s"),
            "joules_per_output_token": figures.get("joules_per_output_token"),
            "telemetry_simulated": result_json.get("telemetry_simulated")}


def to_prometheus(families: list[Family], core) -> list:
    """prometheus-client metric families (`core`: the module prometheus_client.core). A counter named
    `..._total` is a counter (prometheus-client appends the `_total` itself); DCGM's counters
    (the energy counter, ECC counts) have no `_total`, which prometheus-client would add, so they
    keep DCGM's exact names typed as gauges, as rate() and increase() accept (docs/monitoring.md)."""
    out = []
    for family in families:
        label_names = sorted({k for labels, _ in family.samples for k in labels})
        if family.type == "counter" and family.name.endswith("_total"):
            metric = core.CounterMetricFamily(family.name[: -len("_total")], family.help, labels=label_names)
        else:
            metric = core.GaugeMetricFamily(family.name, family.help, labels=label_names)
        for labels, value in family.samples:
            metric.add_metric([labels.get(k, "") for k in label_names], value)
        out.append(metric)
    return out
