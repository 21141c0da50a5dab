"""The GPU policy keeper's names (role gpu_policy installs it, `rigkit status` reads it) and what
status makes of its state file. Pure; the keeper itself is templates/gpu_policy/rigkit-gpu-keeper.py."""

from __future__ import annotations

from datetime import datetime

from rigkit.rigside.names import GPU_KEEPER_CAUSES, GPU_KEEPER_DRIVER_UNIT, GPU_KEEPER_RESUME_UNIT, GPU_KEEPER_UNIT


KEEPER_UNITS = (GPU_KEEPER_UNIT, GPU_KEEPER_RESUME_UNIT, GPU_KEEPER_DRIVER_UNIT)
SLEEP_TARGETS = ("suspend.target", "hibernate.target", "hybrid-sleep.target", "suspend-then-hibernate.target")
EVENTS_SHOWN = 5


def keeper_summary(unit: dict | None, state: dict | None, now: datetime) -> dict:
    """{"enabled", "active", "counts", "events": the last EVENTS_SHOWN with their age, "holding"}."""
    state = state or {}
    events = []
    for event in (state.get("events") or [])[-EVENTS_SHOWN:]:
        try:
            age_s = round((now - datetime.fromisoformat(event["time"])).total_seconds())
        except (KeyError, TypeError, ValueError):
            age_s = None
        events.append({"time": event.get("time"), "age_s": age_s, "cause": event.get("cause"), "ok": event.get("ok"),
                       "seconds": event.get("seconds"), "detail": event.get("detail")})
    counts = state.get("counts") or {}
    return {"enabled": (unit or {}).get("enabled"), "active": (unit or {}).get("active"),
            "counts": {cause: int(counts.get(cause, 0)) for cause in GPU_KEEPER_CAUSES}, "events": events,
            "holding": state.get("holding")}
