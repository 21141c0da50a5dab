"""What rigkit-ondemand is told about a rig's on-demand models: each one's front and engine, how it is parked,
which models it cannot be loaded beside, and what it holds on its GPUs when loaded. Pure functions; the serving
role installs what they return (roles/serving.py)."""

from __future__ import annotations

import json

from rigkit.config import gpu_models
from rigkit.config.schema import ModelConfig, RigConfig
from rigkit.plumbing.render import render
from rigkit.rigside.names import (
    ONDEMAND_CONFIG_PATH,
    ONDEMAND_PATH,
    ONDEMAND_PROOF_DIR,
    ONDEMAND_STATE_PATH,
    SECRETS_ENV_FILE,
    project_name,
    served_name,
)
from rigkit.rigside.stack import PROVEN_COMPOSE_FILE, stack_file

SLEEP_LEVEL = 1  # level 2 discards the weights, which vLLM must then be given again before a wake serves right


def on_demand(rig: RigConfig) -> list[ModelConfig]:
    return [m for m in rig.models if m.on_demand]


def conflicts(rig: RigConfig) -> dict[str, set[str]]:
    """{on-demand model: the on-demand models it cannot be loaded beside}. Two conflict where they share a GPU on
    which the models always loaded and every on-demand model together ask for more than all of its memory
    (each takes its gpu_memory_utilization of the whole GPU)."""
    found = {m.name: set() for m in on_demand(rig)}
    for index in sorted({i for m in rig.models for i in m.spec.gpus}):
        on = [m for m in rig.models if index in m.spec.gpus]
        if sum(m.spec.vllm.gpu_memory_utilization for m in on) <= 1.0:
            continue
        turns = [m.name for m in on if m.on_demand]
        for name in turns:
            found[name].update(other for other in turns if other != name)
    return found


def held_mib(rig: RigConfig, model: ModelConfig) -> int:
    """What the model holds on its GPUs when loaded, all together (MiB): its share of each GPU's memory, as the
    rig file's GPU models are known (0 where one is not: no proof of a sleep by the GPUs' memory then)."""
    by_index = {g.index: g.model for g in rig.spec.gpus}
    total = 0
    for index in model.spec.gpus:
        info = gpu_models.lookup(by_index.get(index, ""))
        if info is None:
            return 0
        total += int(model.spec.vllm.gpu_memory_utilization * info.memory_gib * 1024)
    return total


def front_config(rig: RigConfig, with_api_key: bool) -> str:
    """rigkit-ondemand's settings (JSON; no secret: the key is read from the rig's root-only env file)."""
    clash = conflicts(rig)
    models = [{
        "name": m.name,
        "served_name": served_name(m),
        "listen": [rig.spec.serve_address, m.spec.port],
        "engine_url": f"http://127.0.0.1:{m.engine_port}",
        "project": project_name(m),
        "gpus": list(m.spec.gpus),
        "swap": m.on_demand.swap,
        "checkpoint_tool": rig.spec.on_demand.cuda_checkpoint if m.on_demand.swap == "checkpoint" else "",
        "sleep_level": SLEEP_LEVEL,
        "idle_park_s": m.on_demand.idle_park_s,
        "conflicts": sorted(clash[m.name]),
        "held_mib": held_mib(rig, m),
        "ready_timeout_s": m.spec.ready_timeout_s,
        "proof_file": f"{ONDEMAND_PROOF_DIR}/{m.name}.json",
        "config_file": stack_file(m.name, PROVEN_COMPOSE_FILE),
    } for m in on_demand(rig)]
    return json.dumps({"hold_s": rig.spec.on_demand.hold_s, "state_file": ONDEMAND_STATE_PATH,
                       "release_clocks_on": release_clocks_on(rig),
                       "api_key_env_file": SECRETS_ENV_FILE if with_api_key else None, "models": models},
                      indent=2) + "\n"


def release_clocks_on(rig: RigConfig) -> list[int]:
    """The GPUs that only on-demand models use: their clock locks are released while those models are parked
    (rigside.parked_clocks); a GPU a model always loaded uses keeps its lock."""
    on_demand_gpus = {g for m in on_demand(rig) for g in m.spec.gpus}
    resident_gpus = {g for m in rig.models if not m.on_demand for g in m.spec.gpus}
    return sorted(on_demand_gpus - resident_gpus)


# What taking over one model may take at start, beyond its own ready_timeout_s: a sleep (120 s) that did not
# take and the stop after it (120 s), or a restart (180 s) (rigside.engine_control's bounds).
TAKE_OVER_MARGIN_S = 420


def service_unit(rig: RigConfig) -> str:
    """The unit, Type=notify: started (a deploy's restart returns) once the fronts listen, within the time
    taking over every model may take."""
    start_timeout_s = 60 + sum(m.spec.ready_timeout_s + TAKE_OVER_MARGIN_S for m in on_demand(rig))
    return render("ondemand/rigkit-ondemand.service.j2", script_path=ONDEMAND_PATH, config_path=ONDEMAND_CONFIG_PATH,
                  start_timeout_s=start_timeout_s)
