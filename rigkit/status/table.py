"""One rig's status document as text for a person (pure)."""

from __future__ import annotations


def _rows(header: list[str], rows: list[list[str]]) -> list[str]:
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    return ["  ".join(str(c).ljust(w) for c, w in zip(r, widths)).rstrip() for r in [header, *rows]]


def _age(seconds) -> str:
    if seconds is None:
        return "-"
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds >= size:
            return f"{seconds / size:.1f} {unit}"
    return f"{seconds:.0f} s"


def _watts(value) -> str:
    return "-" if value is None else f"{value:.0f} W"


def _start(start) -> str:
    """A start in a cell: its time to the first token (or to the API, where rigkit did not prove it), its
    slowest phase, and the compile cache's verdict."""
    if not start:
        return "-"
    cache = (start.get("compile_cache") or {}).get("cache")
    slowest = start.get("slowest") or {}
    return (f"{start['total_s']:.0f} s" + ("" if start.get("proven_by") else " to API")
            + (f", {slowest['phase'].split(',')[0]} {slowest['s']:.0f} s" if slowest else "")
            + (f", cache {cache}" if cache in ("hit", "miss") else ""))


def _running(stack: dict) -> str:
    if stack.get("on_demand"):  # rigkit-ondemand's word for it (docs/on-demand.md)
        return f"on demand: {stack['on_demand']}"
    return {True: "yes", False: "NO"}.get(stack["running"], "?")


def status_table(doc: dict) -> str:
    verdict = "OK" if doc.get("ok") else "UNREACHABLE" if not doc.get("reachable") else (
        f"DRIFT ({len(doc['drift'])}), FAILED ({len(doc['failures'])})")
    lines = [f"== {doc['rig']}" + (f" ({doc.get('rig_file')})" if doc.get("rig_file") else "") + f": {verdict}"]
    if not doc.get("reachable"):
        return "\n".join(lines + [f"   not reached: {doc.get('error')}"])
    if doc.get("gpus"):
        lines += _rows(["GPU", "name", "requested", "limit", "enforced", "persistence", "driver"],
                       [[g["index"], g["name"], _watts(g["requested_w"]), _watts(g["power_limit_w"]),
                         _watts(g["enforced_power_limit_w"]), "on" if g["persistence"] else "off",
                         g.get("driver_version") or "-"] for g in doc["gpus"]])
    unit = doc.get("gpu_policy_unit")
    if unit:
        last = unit["journal"][-1] if unit.get("journal") else "(no journal lines this boot)"
        lines.append(f"{unit['unit']}: {unit['enabled']}, {unit['active']} ({unit['result']}), "
                     f"{'ran' if unit['ran_this_boot'] else 'did NOT run'} this boot; last: {last}")
    if doc.get("stacks"):
        lines += _rows(["stack", "running", "restarts", "watchdog/h", "ready", "last start", "image", "compose"],
                       [[s["model"], _running(s), s["restarts_since_deploy"],
                         s["watchdog_restarts_last_hour"] if s["watchdog_restarts_last_hour"] is not None else "-",
                         f"yes {s['ready_s']:.2f} s" if s["ready"] else "parked" if s["ready"] is None and
                         s.get("on_demand") not in (None, "loaded") else "NO", _start(s.get("last_start")),
                         f"{s['image']} {(s['image_id'] or '')[:19]}",
                         "as rendered" if s["compose_as_rendered"] else {"held": "HELD for the gate",
                         "refused": "REFUSED, old serves"}.get(s.get("gate"), "DIFFERS")] for s in doc["stacks"]])
    if doc.get("weights"):
        lines += _rows(["weights", "volume", "status", "marker", "files"],
                       [[w["model"], w.get("volume", "bind mount"), w.get("status", "-"),
                         {True: "yes", False: "NO"}.get(w.get("marker"), "-"),
                         (f"{w['manifest_files']} in manifest, {len(w.get('missing_files', []))} missing"
                          if w.get("manifest_files") is not None else "not read")
                         if w.get("volume") else w.get("source", "")] for w in doc["weights"]])
    if doc.get("verification"):
        lines += _rows(["verified", "age", "passed", "regressions"],
                       [[v["model"], _age(v.get("age_s")) if v.get("time") else "never",
                         "-" if v.get("time") is None else "yes" if v["passed"] else "NO",
                         "; ".join(v.get("regressions", [])) or "-"] for v in doc["verification"]])
    if doc.get("gpu_keeper"):
        k = doc["gpu_keeper"]
        counts = ", ".join(f"{cause} {n}" for cause, n in k["counts"].items())
        last = k["events"][-1] if k["events"] else None
        lines.append(f"GPU policy keeper: {k['enabled']}, {k['active']}; repairs: {counts}"
                     + (f"; last {last['time']} ({last['cause']}, {'ok' if last['ok'] else 'FAILED'})" if last else "")
                     + (f"; holding off: {k['holding']}" if k.get("holding") else ""))
    if doc.get("gpus_parked"):
        lines.append(f"clock locks released while parked (on-demand models): GPU {', '.join(map(str, doc['gpus_parked']))}")
    if doc.get("idle_energy"):
        lines.append(idle_energy_line(doc["idle_energy"]))
    if doc.get("watchdog") and doc["watchdog"]["watched"]:
        w = doc["watchdog"]
        lines.append(f"watchdog timer: {w['timer_enabled']}, {w['timer_active']}; watching {', '.join(w['watched'])}")
    for d in doc["drift"]:
        lines.append(f"DRIFT  {d['what']}: {d['found']}; wanted {d['wanted']}\n       repair: {d['repair']}")
    for f in doc["failures"]:
        lines.append(f"FAIL   {f['what']}: {f['detail']}" + (f"\n       repair: {f['repair']}" if f.get("repair") else ""))
    for note in doc.get("notes", []):
        lines.append(f"note   {note}")
    return "\n".join(lines)


def idle_energy_line(day: dict) -> str:
    """The GPUs' idle energy over the last 24 h (rigside.idle_energy.last_day), as one line: what each GPU drew
    while idle, and for how much of the time measured, scaled to a day while less than a day was measured."""
    hours = day["measured_s"] / 3600
    gpus = "; ".join(f"GPU {g} {v['idle_kwh']:.3f} kWh, idle {100 * v['idle_s'] / v['measured_s']:.0f}%"
                     + (f" at {v['idle_w']:.1f} W" if v.get("idle_w") is not None else "")
                     for g, v in day["gpus"].items() if v["measured_s"])
    if hours >= 23.5:  # a day, but for the keeper's gaps (a repair, a restart)
        return f"idle energy, last 24 h: {day['idle_kwh']:.3f} kWh ({gpus})"
    return (f"idle energy: {day['idle_kwh']:.3f} kWh in the {hours:.1f} h measured, "
            f"{day['idle_kwh_per_day']:.2f} kWh/day at that rate ({gpus})")
