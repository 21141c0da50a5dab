"""The rig-side watchdog (templates/serving/rigkit-watchdog): its settings file and its systemd
timer, rendered from the catalog's `watchdog:` entries. Pure functions; roles/serving.py installs
what they return. A Windows rig's watchdog (rigkit.windows.watchdog) reads the same settings."""

from __future__ import annotations

import json

from rigkit.config.schema import RigConfig
from rigkit.plumbing.render import render
from rigkit.rigside.keyfile import API_KEY_ENV_NAME
from rigkit.rigside.names import (
    SECRETS_ENV_FILE,
    WATCHDOG_CONFIG_PATH,
    WATCHDOG_PATH,
    WATCHDOG_SERVICE,
    WATCHDOG_STATE_DIR,
    engine_container,
    project_name,
    served_name,
)


def watched(rig: RigConfig) -> list:
    """Models the watchdog probes: not on-demand ones, which rigkit-ondemand parks and loads (docs/on-demand.md)."""
    return [m for m in rig.models if m.spec.watchdog.enabled and not m.on_demand]


def watchdog_config(rig: RigConfig, with_api_key: bool, api_key_env_file: str = SECRETS_ENV_FILE,
                    state_dir: str = WATCHDOG_STATE_DIR) -> str:
    """The settings file the watchdog reads on every pass (JSON). A Windows rig's watchdog reads the
    same file, with its own paths (rigkit.windows.watchdog)."""
    models = []
    for model in watched(rig):
        w = model.spec.watchdog
        models.append({
            "name": model.name,
            "project": project_name(model),
            "container": engine_container(project_name(model)),  # for `docker logs` in what it says
            "port": model.spec.port,
            "served_model_name": served_name(model),
            "interval_s": w.interval_s,
            "wedged_after_s": w.wedged_after_s,
            "max_restarts_per_hour": w.max_restarts_per_hour,
            "probe_timeout_s": w.probe_timeout_s,
            "ready_timeout_s": model.spec.ready_timeout_s,
        })
    document = {
        "rig": rig.name,
        "api_key_env_file": api_key_env_file if with_api_key else None,
        "api_key_env_name": API_KEY_ENV_NAME,
        "state_dir": state_dir,
        "models": models,
    }
    return json.dumps(document, indent=2) + "\n"


def timer_interval_s(rig: RigConfig) -> int:
    """The timer fires at the shortest interval of the watched models; each pass skips a model
    whose own interval has not passed since its last check."""
    return min((m.spec.watchdog.interval_s for m in watched(rig)), default=30)


def service_unit() -> str:
    return render("serving/rigkit-watchdog.service.j2", script_path=WATCHDOG_PATH, config_path=WATCHDOG_CONFIG_PATH)


def timer_unit(rig: RigConfig) -> str:
    return render("serving/rigkit-watchdog.timer.j2", interval_s=timer_interval_s(rig), service=WATCHDOG_SERVICE)
