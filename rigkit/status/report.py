"""One rig's status document: what the rig reports, set against what the inventory says. Pure.

`build_status` takes the validated config, the facts read on the rig and the latest
verification results, and returns a JSON-ready document. Every difference from the inventory is
a `drift` entry with the command that repairs it; what is wrong but not a difference from the
inventory (a requested power limit that is not enforced, a model that does not answer, a failed
verification) is a `failure`; `notes` never fail the run. The document is described in
docs/status.md.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable
from datetime import datetime

from rigkit.config.schema import RigConfig
from rigkit.gpu.keeper import keeper_summary
from rigkit.rigside.names import GPU_KEEPER_STATE_PATH, GPU_KEEPER_UNIT
from rigkit.gpu.nvsmi import GpuReport, timed_out
from rigkit.gpu.policy import wanted_limits_w
from rigkit.rigside.idle_energy import last_day
from rigkit.rigside.names import GPU_POLICY_UNIT, ONDEMAND_STATE_STALE_S, volume_name
from rigkit.rigside.stack import FAILED_COMPOSE_FILE, PROVEN_COMPOSE_FILE, rollout_command
from rigkit.rigside.startup import slowest_phase
from rigkit.status.surface import judge_gateway_tls, judge_surface

ENFORCED_TOLERANCE_W = 0.5


def sha256(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


class Commands:
    """The repair commands, spelled for this inventory and rig."""

    def __init__(self, inventory: str, rig: str, admin: str = "root"):
        self.deploy = f"rigkit deploy {inventory} --limit {rig}"
        self.verify_weights = f"rigkit deploy {inventory} --limit {rig} --verify-weights"
        self.verify = f"rigkit verify {inventory} --limit {rig}"
        self.rig = rig
        self.admin = admin  # who runs a command on the rig: root, or on Windows an elevated administrator

    def on_rig(self, command: str) -> str:
        return f"on {self.rig} as {self.admin}: {command}"


def build_status(rig: RigConfig, host_name: str, commands: Commands, gpus: GpuReport | None, probe: dict,
                 weights: dict[str, dict], wanted_files: dict[str, dict[str, str]],
                 results: dict[str, dict | None], now: datetime, gpu_unit: str,
                 history_notes: list[str] = (), scheduled_tasks: dict[str, dict] | None = None,
                 recreate: Callable[[str], str] | None = None, known: dict[int, str] | None = None) -> dict:
    """`weights`: {model: WeightsVolumeState}; `wanted_files`: {model: {file name: sha256 of what the
    catalog renders}}; `results`: {model: latest verification document or None}; `history_notes`: the
    result files skipped as unreadable while finding them (rigkit.verify.history), one line each.
    A Windows rig (rigkit.windows.status) has no systemd units: `scheduled_tasks` {task: {"registered",
    "as_rendered", "applied" (None: not a task the deploy runs)}} stands for them, and `recreate(model)`
    is the command that recreates a model's container there (on Linux: `rigkit-stack rollout NAME recreate`).
    `known`: {port: what of rigkit's listens beyond loopback there} (rigkit.status.surface.known_ports)."""
    doc = {"rig": host_name, "rig_name": rig.name, "rig_file": str(rig.file), "reachable": True,
           "checked_at": now.isoformat(timespec="seconds"), "gpus": [], "gpu_policy_unit": None, "stacks": [],
           "weights": [], "verification": [], "watchdog": None, "gpu_keeper": None, "drift": [], "failures": [], "notes": []}

    def drift(what: str, found, wanted, repair: str) -> None:
        doc["drift"].append({"what": what, "found": found, "wanted": wanted, "repair": repair})

    def failure(what: str, detail: str, repair: str | None = None) -> None:
        doc["failures"].append({"what": what, "detail": detail, "repair": repair})

    if probe.get("error"):
        failure("status probe", probe["error"])
        probe = {}
    _gpus(doc, rig, gpus, probe, commands, drift, failure)
    _policy_unit(doc, rig, probe.get("gpu_unit"), commands, drift, failure, gpu_unit)
    _keeper(doc, rig, probe.get("gpu_keeper"), now, commands, drift)
    # the keeper's ledger, by the rig's clock (its hours are the rig's) (docs/status.md)
    rig_now = probe.get("rig_time") if isinstance(probe.get("rig_time"), (int, float)) else now.timestamp()
    doc["idle_energy"] = last_day(probe.get("idle_energy"), rig_now)
    ondemand = probe.get("ondemand") if isinstance(probe.get("ondemand"), dict) else {}
    parked = ondemand.get("gpus_parked") if isinstance(ondemand.get("gpus_parked"), list) else []
    doc["gpus_parked"] = sorted(int(g) for g in parked if str(g).isascii() and str(g).isdigit())
    if scheduled_tasks is not None:
        _tasks(doc, rig, scheduled_tasks, commands, drift, failure)
    recreate = recreate or (lambda name: commands.on_rig(rollout_command(name, recreate=True)))
    _stacks(doc, rig, probe, wanted_files, commands, drift, failure, recreate)
    _weights(doc, rig, weights, probe.get("volumes", {}), commands, drift, failure)
    _weights_after_start(rig, weights, probe.get("stacks", {}), commands, drift)
    _verification(doc, rig, results, now, commands, failure)
    doc["notes"] += [f"results history: {note}" for note in history_notes]
    _watchdog(doc, rig, probe.get("watchdog"), commands, drift)
    judge_surface(doc, rig, probe.get("surface"), known or {}, commands, drift, failure)
    judge_gateway_tls(doc, probe.get("gateway_tls"), now, commands, drift, failure)
    doc["ok"] = not doc["drift"] and not doc["failures"]
    return doc


def unreachable(host_name: str, reason: str, now: datetime) -> dict:
    return {"rig": host_name, "reachable": False, "checked_at": now.isoformat(timespec="seconds"),
            "error": reason, "drift": [], "failures": [{"what": "connection", "detail": reason, "repair": None}],
            "notes": [], "ok": False}


def _w(value: float) -> float | None:
    return None if value is None or math.isnan(value) else round(value, 1)


def _gpus(doc, rig, report, probe, commands, drift, failure):
    if report is None:
        failure("GPUs", "nvidia-smi is not installed on the rig")
        return
    if report.error and timed_out(report.exit_code):
        failure("GPUs", f"not read: {report.error}; on the rig: `dmesg`, then a GPU reset or a reboot")
        return
    if report.error:
        failure("GPUs", f"nvidia-smi failed (exit {report.exit_code}): {report.error}")
        return
    found = {g.index: g for g in report.gpus}
    missing = [g.index for g in rig.spec.gpus if g.index not in found]
    if missing:
        failure("GPUs", f"GPU(s) {missing} are in the rig file but the rig reports {sorted(found)}")
    known = [g for g in rig.spec.gpus if g.index in found]
    wanted = wanted_limits_w(rig.spec.model_copy(update={"gpus": known}), report) if known else {}
    for spec in known:
        gpu = found[spec.index]
        want = wanted[spec.index] if rig.spec.gpu_policy == "apply" else gpu.power_default_w
        doc["gpus"].append({
            "index": gpu.index, "name": gpu.name, "requested_w": _w(want), "power_limit_w": _w(gpu.power_limit_w),
            "enforced_power_limit_w": _w(gpu.enforced_power_limit_w), "persistence": gpu.persistence_mode,
            "driver_version": probe.get("driver_version"),
            "clock_lock_mhz": spec.clock_lock_mhz.as_nvidia_smi_arg() if spec.clock_lock_mhz else None,
        })
        if abs(gpu.power_limit_w - want) >= 0.5:
            drift(f"GPU {gpu.index} power limit", f"{gpu.power_limit_w:.0f} W", f"{want:.0f} W", commands.deploy)
        if abs(gpu.enforced_power_limit_w - gpu.power_limit_w) >= ENFORCED_TOLERANCE_W:
            failure(f"GPU {gpu.index} enforced power limit",
                    f"{gpu.enforced_power_limit_w:.0f} W enforced, {gpu.power_limit_w:.0f} W requested: another "
                    "limit (firmware, thermal, board) is in force; see `nvidia-smi -q -d POWER` on the rig")
        if rig.spec.gpu_policy == "apply" and not gpu.persistence_mode and rig.spec.os == "linux":  # WDDM has none
            drift(f"GPU {gpu.index} persistence mode", "off", "on",
                  commands.on_rig(f"systemctl restart {GPU_POLICY_UNIT}"))
    if probe.get("driver_error"):
        doc["notes"].append(f"driver version not read: {probe['driver_error']}")


def _policy_unit(doc, rig, unit, commands, drift, failure, name):
    if unit is None:
        return
    ran = bool(unit.get("started")) or bool(unit.get("journal"))
    doc["gpu_policy_unit"] = {"unit": name, "enabled": unit.get("enabled"), "active": unit.get("active"),
                              "result": unit.get("result"), "exit_status": unit.get("exit_status"),
                              "ran_this_boot": ran, "started": unit.get("started"),
                              "journal": unit.get("journal", []), "journal_error": unit.get("journal_error")}
    installed = unit.get("load") == "loaded"
    if rig.spec.gpu_policy == "remove":
        if installed:
            drift(f"{name}", "installed", "removed (gpu_policy: remove)", commands.deploy)
        return
    if not installed:
        drift(f"{name}", "not installed", "installed and enabled", commands.deploy)
        return
    if unit.get("enabled") != "enabled":
        drift(f"{name} at boot", unit.get("enabled") or "unknown", "enabled", commands.deploy)
    if not ran:
        failure(f"{name}", "did not run at this boot: the caps and clock locks were not applied at boot",
                commands.on_rig(f"systemctl restart {name}"))
    elif unit.get("result") not in ("success", None) or unit.get("active") == "failed":
        last = "; ".join(unit.get("journal", [])[-3:])
        failure(f"{name}", f"ran at this boot and failed (result {unit.get('result')}, exit "
                f"{unit.get('exit_status')}): {last}", commands.on_rig(f"journalctl -b -u {name}"))


def _keeper(doc, rig, keeper, now, commands, drift):
    """The GPU policy keeper: running where the policy applies, and its repairs by cause (docs/status.md)."""
    if keeper is None:
        return
    state = keeper.get("state") if isinstance(keeper.get("state"), dict) else None
    summary = keeper_summary(keeper.get("unit"), state, now)
    doc["gpu_keeper"] = summary
    if keeper.get("state_unreadable"):
        doc["notes"].append(f"GPU policy keeper: its state file {GPU_KEEPER_STATE_PATH} is not readable (cut off, "
                            "garbage or empty): its repairs are unknown, not zero; the keeper writes it anew at "
                            "its next repair")
    unit = keeper.get("unit") or {}
    if rig.spec.gpu_policy == "remove":
        if unit.get("load") == "loaded":
            drift(GPU_KEEPER_UNIT, "installed", "removed (gpu_policy: remove)", commands.deploy)
        return
    if (doc.get("gpu_policy_unit") or {}).get("enabled") is None:
        return  # no policy installed: the policy unit's own drift says so
    if unit.get("load") != "loaded":
        drift(GPU_KEEPER_UNIT, "not installed", "installed, enabled and running", commands.deploy)
    elif unit.get("active") != "active" or unit.get("enabled") != "enabled":
        drift(GPU_KEEPER_UNIT, f"{unit.get('enabled')}, {unit.get('active')}", "enabled, active", commands.deploy)
    for event in summary["events"]:
        if event["age_s"] is not None and event["age_s"] < 86400:
            doc["notes"].append(f"GPU policy keeper: {'re-applied' if event['ok'] else 'FAILED to re-apply'} the "
                                f"policy {_ago(event['age_s'])} (cause: {event['cause']}): {event['detail']}")


def _ago(seconds: int) -> str:
    return f"{seconds} s ago" if seconds < 120 else f"{seconds // 60} min ago" if seconds < 7200 else f"{seconds // 3600} h ago"


def _tasks(doc, rig, tasks, commands, drift, failure):
    """A Windows rig's scheduled tasks: registered as rendered (or gone with `gpu_policy: remove`), and
    the logon tasks' last successful run on the files now installed (the deploy's record)."""
    doc["scheduled_tasks"] = [{"task": name, **state} for name, state in tasks.items()]
    for name, state in tasks.items():
        if rig.spec.gpu_policy == "remove":
            if state["registered"]:
                drift(f"scheduled task {name}", "registered", "removed (gpu_policy: remove)", commands.deploy)
        elif not state["registered"]:
            drift(f"scheduled task {name}", "not registered", "registered as rendered", commands.deploy)
        elif not state["as_rendered"]:
            drift(f"scheduled task {name}", "differs from the rendered task (edited in Task Scheduler?)",
                  "as rendered", commands.deploy)
        elif state.get("applied") is False:
            failure(f"scheduled task {name}", "has not run successfully on the files installed now (its last run "
                    "failed, or the files changed since)", commands.deploy)


def _stacks(doc, rig, probe, wanted_files, commands, drift, failure, recreate):
    stacks = probe.get("stacks", {})
    watchdog = (probe.get("watchdog") or {}).get("models", {})
    for model in rig.models:
        found = stacks.get(model.name)
        if found is None:
            continue
        containers = found.get("containers") or []
        running = [c for c in containers if c.get("running")]
        catalog_image = found.get("catalog_image") or {}
        files = found.get("files", {})
        wanted = wanted_files.get(model.name, {})
        compose_as_rendered = all(files.get(name) == digest for name, digest in wanted.items())
        # Where a rollout stands when the proven files are not what the catalog renders: a candidate held
        # for the gate and serving un-promoted, or the config the catalog renders refused (by the gate, or
        # it did not get ready) and kept as compose.failed.yml while the last proven one serves.
        gate = ("held" if found.get("held") else
                "refused" if not compose_as_rendered and files.get(FAILED_COMPOSE_FILE) is not None
                and files.get(FAILED_COMPOSE_FILE) == wanted.get(PROVEN_COMPOSE_FILE) else None)
        entry = {
            # Not known when docker could not be asked: None, shown as "?", never "NO" beside a model that answers.
            "model": model.name, "deployed": found.get("deployed"),
            "running": None if found.get("containers_error") else bool(running),
            "containers": [{k: c.get(k) for k in ("name", "status", "restart_count", "started_at")} for c in containers],
            "restarts_since_deploy": sum(c.get("restart_count") or 0 for c in containers),
            "watchdog_restarts_last_hour": (watchdog.get(model.name) or {}).get("restarts_last_hour"),
            "ready": found.get("ready", {}).get("ok"), "ready_s": found.get("ready", {}).get("seconds"),
            "ready_error": found.get("ready", {}).get("error"), "port": found.get("ready", {}).get("port"),
            "image": model.spec.image, "running_image": containers[0].get("config_image") if containers else None,
            "image_id": containers[0].get("image_id") if containers else None,
            "catalog_image_id": catalog_image.get("id"), "repo_digests": catalog_image.get("repo_digests", []),
            "compose_as_rendered": compose_as_rendered, "gate": gate,
            "last_start": _last_start(found.get("startup")),
            "on_demand": ondemand_state(probe.get("ondemand"), model.name) if model.on_demand else None,
        }
        doc["stacks"].append(entry)
        if not found.get("deployed"):
            drift(f"stack {model.name}", "not deployed", "deployed and running", commands.deploy)
            continue
        if found.get("containers_error"):
            failure(f"stack {model.name}", f"docker could not be asked: {found['containers_error']}")
        elif not running and not model.on_demand:  # an on-demand model not running is parked (docs/on-demand.md)
            states = ", ".join(f"{c.get('name')} {c.get('status')}" for c in containers) or "no container"
            drift(f"stack {model.name}", f"not running ({states})", "running", commands.deploy)
        if gate == "held":
            drift(f"stack {model.name} rollout", "a new config is serving un-promoted, held for the rollout gate "
                  "(the deploy that rolled it out stopped before the gate's verdict); the verification shown is "
                  "the last proven config's", "promoted by the gate, or rolled back",
                  f"{commands.deploy} (the gate judges the held config again from the start)")
        elif gate == "refused":
            drift(f"stack {model.name} rollout", "the config the catalog renders was refused (by the rollout gate, "
                  f"or it did not get ready) and is {FAILED_COMPOSE_FILE} on the rig; the last proven config serves",
                  f"as rendered from {model.file}",
                  f"change {model.file}: a deploy of it as it is is refused again (see its last gate-*.json "
                  f"under results); a slower config meant on purpose: {commands.deploy} --accept-slower {model.name}")
        elif not compose_as_rendered:
            changed = [name for name, digest in wanted.items() if files.get(name) != digest]
            drift(f"stack {model.name} files", f"{', '.join(changed)} differ from what the catalog renders "
                  "(edited on the rig, catalog changed since the deploy, or a rollout that did not finish)",
                  f"as rendered from {model.file}", commands.deploy)
        if running and not entry["ready"] and not model.on_demand:  # asleep, an on-demand engine answers 503
            failure(f"stack {model.name} readiness", f"a one-token completion failed: {entry['ready_error']}",
                    recreate(model.name))
        if containers and entry["running_image"] and entry["running_image"] != model.spec.image:
            drift(f"stack {model.name} image", entry["running_image"], model.spec.image, commands.deploy)
        elif containers and entry["catalog_image_id"] and entry["image_id"] != entry["catalog_image_id"]:
            drift(f"stack {model.name} image digest", entry["image_id"],
                  f"{entry['catalog_image_id']} (what {model.spec.image} names on the rig now)",
                  recreate(model.name))
        if entry["restarts_since_deploy"]:
            doc["notes"].append(f"{model.name}: Docker restarted its container {entry['restarts_since_deploy']} "
                                "time(s) since it was started (a crash loop if it rises)")
        if entry["watchdog_restarts_last_hour"]:
            reason = (watchdog.get(model.name) or {}).get("last_restart_reason")
            doc["notes"].append(f"{model.name}: the watchdog restarted it {entry['watchdog_restarts_last_hour']} "
                                f"time(s) in the last hour (last: {reason})")
    wanted_names = {m.name for m in rig.models}
    for name in probe.get("stacks_on_rig", []):
        if name not in wanted_names:
            drift(f"stack {name}", "on the rig", "absent (not in the rig file)", commands.deploy)


def ondemand_state(found: dict | None, name: str) -> str:
    """An on-demand model as rigkit-ondemand says it is: loaded, asleep, stopped, failed (why), or unknown
    where the program's state file is missing or stale (the program is not running)."""
    found = found if isinstance(found, dict) else {}
    state = found.get("state") if isinstance(found.get("state"), dict) else {}
    models = state.get("models") if isinstance(state.get("models"), dict) else {}
    model, written, now = models.get(name), state.get("written_at"), found.get("now")
    if not isinstance(model, dict) or not all(isinstance(v, (int, float)) for v in (written, now)):
        return "unknown (rigkit-ondemand's state not found)"
    if now - written > ONDEMAND_STATE_STALE_S:
        return f"unknown (rigkit-ondemand's state is {now - written:.0f} s old)"
    if model.get("state") == "awake":
        return "loaded"
    if model.get("state") == "parked":
        return model.get("parked_as") if model.get("parked_as") in ("asleep", "checkpointed", "stopped") else "parked"
    if model.get("state") == "failed":
        return f"failed ({model.get('failure')})"
    return str(model.get("state"))


def _last_start(start) -> dict | None:
    """The running container's start, for the table: its time, to which phase, its slowest phase, the compile
    cache, and whether rigkit proved it (rigkit-stack's table, with the first token) or read it from the log."""
    if not isinstance(start, dict) or not isinstance(start.get("total_s"), (int, float)):
        return None
    phases = [p for p in start.get("phases") or [] if isinstance(p, dict) and isinstance(p.get("s"), (int, float))]
    slowest = slowest_phase(phases)
    return {"total_s": start["total_s"], "to": start.get("to"), "proven_by": start.get("proven_by"),
            "slowest": slowest, "phases": phases, "compile_cache": start.get("compile_cache"),
            "started_at": start.get("started_at")}


def _weights_after_start(rig, weights, stacks, commands, drift):
    """A running model whose weights volume was completed after its container started serves what the volume
    held then (a copy that went on after its deploy was killed): drift until the next deploy restarts it."""
    for model in rig.models:
        completed = (weights.get(model.name) or {}).get("completed_at")
        running = [c for c in ((stacks.get(model.name) or {}).get("containers") or []) if c.get("running")]
        started = [_epoch(c.get("started_at")) for c in running]
        if not isinstance(completed, (int, float)) or not started or None in started:
            continue
        if completed > min(started) + 1:
            drift(f"{model.name} weights", f"volume completed {completed - min(started):.0f} s after the container "
                  "started: it serves what the volume held then", "started on the complete weights", commands.deploy)


def _epoch(iso: str | None) -> float | None:
    """Docker's StartedAt (RFC 3339 with nanoseconds, "2026-12-03T16:53:42.123456789Z") in seconds."""
    import re

    if not isinstance(iso, str) or not (m := re.fullmatch(r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(\.\d+)?(Z|[+-]\d\d:\d\d)", iso)):
        return None
    zone = "+00:00" if m.group(3) == "Z" else m.group(3)
    return datetime.fromisoformat(m.group(1) + zone).timestamp() + float(m.group(2) or 0)


def _weights(doc, rig, weights, volumes, commands, drift, failure):
    for model in rig.models:
        if model.spec.weights.storage != "volume":
            doc["weights"].append({"model": model.name, "storage": "bind", "source": model.spec.weights.source})
            continue
        name = volume_name(model)
        state = weights.get(model.name) or {"status": "error", "error": "not read"}
        files = volumes.get(name) or {}
        missing, resized = files.get("missing_files", []), files.get("resized_files", [])
        doc["weights"].append({"model": model.name, "volume": name, "status": state.get("status"),
                               "marker": state.get("complete"), "manifest_files": files.get("manifest_files"),
                               "missing_files": missing, "resized_files": resized})
        status = state.get("status")
        if status == "missing":
            drift(f"weights volume {name}", "missing", "copied and complete", commands.deploy)
        elif status == "needed":
            found = "no completion marker" if not state.get("complete") else "manifest differs from the source"
            drift(f"weights volume {name}", found, f"complete copy of {model.spec.weights.source}", commands.deploy)
        elif status == "error" and state.get("timed_out"):
            failure(f"weights volume {name}", f"not read: {state.get('error')}")
        elif status == "error":
            failure(f"weights of {model.name}", f"{model.spec.weights.source}: {state.get('error')}")
        elif status == "unreachable":
            doc["notes"].append(f"weights volume {name}: its mountpoint is not readable from the rig's shell; "
                                "`rigkit deploy --verify-weights` checks it through a helper container")
        if missing or resized:
            listed = ", ".join([*missing, *(f"{p} (size differs)" for p in resized)][:5])
            drift(f"weights volume {name} files", f"{len(missing) + len(resized)} file(s) differ from its "
                  f"manifest: {listed}", "every file the manifest lists", commands.verify_weights)


def _verification(doc, rig, results, now, commands, failure):
    for model in rig.models:
        result = results.get(model.name)
        if not result:
            doc["verification"].append({"model": model.name, "time": None})
            doc["notes"].append(f"{model.name}: never verified on this control machine ({commands.verify})")
            continue
        try:
            age_s = (now - datetime.fromisoformat(result["time"])).total_seconds()
        except (KeyError, TypeError, ValueError):
            age_s = None
        regressions = [f"{r['figure']} {r['previous']:.3g} -> {r['now']:.3g} ({r['change']:+.0%})"
                       for r in result.get("regressions", [])]
        failed = [f"{c['name']}: {c['message']}" for c in result.get("checks", []) if not c.get("passed")]
        doc["verification"].append({"model": model.name, "time": result.get("time"),
                                    "age_s": round(age_s) if age_s is not None else None,
                                    "passed": bool(result.get("passed")), "regressions": regressions,
                                    "failed_checks": failed})
        if not result.get("passed"):
            failure(f"verification of {model.name}", "; ".join(failed) or "failed", commands.verify)
        if regressions:
            doc["notes"].append(f"{model.name}: regressions in the latest verification: {'; '.join(regressions)}")


def _watchdog(doc, rig, watchdog, commands, drift):
    if watchdog is None:
        return
    timer = watchdog.get("timer") or {}
    watched = [m.name for m in rig.models if m.spec.watchdog.enabled]
    doc["watchdog"] = {"watched": watched, "timer_enabled": timer.get("enabled"), "timer_active": timer.get("active")}
    if watched and (timer.get("enabled") != "enabled" or timer.get("active") != "active"):
        drift("watchdog timer", f"{timer.get('enabled') or 'not installed'}, {timer.get('active') or 'inactive'}",
              "enabled, active", commands.deploy)
