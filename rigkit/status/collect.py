"""What status.py runs on each rig, inside one `python.call` so that pyinfra's execution runs it on
every rig at once: read the facts (nvidia-smi, the status probe, each weights volume), set them
against the config, and leave the rig's document where `rigkit status` collects it.

Reads only: pyinfra facts and the read-only probe; no operation that writes is ever yielded.
"""

from __future__ import annotations

import json
from datetime import datetime, timezone
from pathlib import Path
from urllib.parse import quote

from pyinfra import host

from rigkit.config.schema import RigConfig
from rigkit.gpu.facts import NvidiaGpus
from rigkit.rigside.names import GPU_KEEPER_STATE_PATH, GPU_KEEPER_UNIT
from rigkit.gpu.nvsmi import GpuReport
from rigkit.plumbing.rig_reads import TIMED_OUT_CODES
from rigkit.config.inventory import gateway_spec
from rigkit.gateway.stack import probe_host
from rigkit.rigside.names import (
    GATEWAY_TLS_CERT_PATH,
    GPU_PARKED_PATH,
    GPU_POLICY_UNIT,
    IDLE_ENERGY_PATH,
    ONDEMAND_STATE_PATH,
    SURFACE_TABLE,
    STACKS_DIR,
    WATCHDOG_STATE_DIR,
    WATCHDOG_TIMER,
    project_name,
    served_name,
    volume_name,
)
from rigkit.rigside.stack import PROVEN_COMPOSE_FILE, PROVEN_SETTINGS_FILE
from rigkit.serving.api_key import SecretFileError, read_api_key
from rigkit.serving.compose import render_compose, stack_settings
from rigkit.status.facts import RigStatusProbe, probe_args
from rigkit.status.report import Commands, build_status, sha256
from rigkit.status.surface import known_ports
from rigkit.topology.facts import GpuTopology
from rigkit.topology.rig import compose_additions, needs_topology, verdicts_from_fact
from rigkit.verify.result import latest_result, results_folder
from rigkit.weights.facts import volume_states

# Defaults (docs/status.md)
READY_DEADLINE_S = 15  # the one-token completion per model


def document_path(status_dir: Path, host_name: str) -> Path:
    return Path(status_dir) / f"{quote(host_name, safe='')}.json"


def wanted_files(rig: RigConfig, topology: dict | None = None) -> dict[str, dict[str, str]]:
    """{model: {stack file: the SHA-256 of what the catalog renders for it}}: the proven files a deployed rig
    holds. `topology`: {model: Verdict} of the models spanning GPUs, whose compose files carry its flags."""
    try:
        with_key = read_api_key(rig) is not None
    except SecretFileError:
        with_key = True  # the deploy refuses such a key file; the files are judged as if it were fixed
    topology = topology or {}
    return {m.name: {PROVEN_COMPOSE_FILE: sha256(render_compose(m, with_key, host=rig.spec.serve_address,
                                                                **compose_additions(topology.get(m.name)))),
                     PROVEN_SETTINGS_FILE: sha256(stack_settings(m, with_key))}
            for m in rig.models}


def topology_verdicts(rig: RigConfig) -> dict:
    """The deploy's topology decisions, read again (the compose file of a model spanning GPUs depends on them)."""
    if not needs_topology(rig):
        return {}
    return verdicts_from_fact(rig, host.get_fact(GpuTopology))[0]


def latest_results(rig: RigConfig, results_dir: Path) -> tuple[dict[str, dict | None], list[str]]:
    """Each model's latest verification (by kind and the time inside, rigkit.verify.history), and a
    note per result file skipped as unreadable: one bad file never hides the rig's other sections."""
    skipped: list[str] = []
    return {m.name: latest_result(results_folder(results_dir, rig.name, m.name), skipped.append)
            for m in rig.models}, skipped


def collect(rig: RigConfig, status_dir: Path, inventory: str, results_dir: Path) -> None:
    now = datetime.now(timezone.utc)
    commands = Commands(inventory, host.name)
    gateway = gateway_spec(host)
    known = known_ports(rig, (gateway.bind_address, gateway.port) if gateway is not None else None)
    args = probe_args(
        stacks_dir=STACKS_DIR, gpu_unit=GPU_POLICY_UNIT, watchdog_timer=WATCHDOG_TIMER, watchdog_state_dir=WATCHDOG_STATE_DIR,
        gpu_keeper_unit=GPU_KEEPER_UNIT, gpu_keeper_state=GPU_KEEPER_STATE_PATH, idle_energy=IDLE_ENERGY_PATH,
        ondemand_state=ONDEMAND_STATE_PATH if any(m.on_demand for m in rig.models) else None, gpus_parked=GPU_PARKED_PATH,
        deadline_s=READY_DEADLINE_S, known_ports=known, surface_table=SURFACE_TABLE,
        gateway_tls=None if gateway is None or gateway.tls == "none" else
        {"host": probe_host(gateway), "port": gateway.port,
         "cert": GATEWAY_TLS_CERT_PATH, "issued_by_rigkit": gateway.tls == "rigkit"},
        models=[{"name": m.name, "project": project_name(m), "port": m.spec.port, "served_model_name": served_name(m),
                 "on_demand": bool(m.on_demand),
                 "image": m.spec.image, "volume": volume_name(m) if m.spec.weights.storage == "volume" else None}
                for m in rig.models],
    )
    # The probe first: where it found nvidia-smi or docker hung, they are not asked again (each
    # would wait out its own time limit), and what they would have read says why it is missing.
    probe = host.get_fact(RigStatusProbe, probe_args=args)
    hung = probe.get("timed_out") or {}
    if "nvidia-smi" in hung:
        gpus = GpuReport((), f"{hung['nvidia-smi']} (a wedged GPU or driver)", TIMED_OUT_CODES[0])
    else:
        gpus = host.get_fact(NvidiaGpus)
    if "docker" in hung:
        weights = {m.name: {"status": "error", "error": hung["docker"], "timed_out": "docker"}
                   for m in rig.models if m.spec.weights.storage == "volume"}
    else:
        weights = volume_states(rig)
    results, skipped = latest_results(rig, results_dir)
    doc = build_status(rig, host.name, commands, gpus, probe,
                       weights, wanted_files(rig, topology_verdicts(rig)), results, now, GPU_POLICY_UNIT,
                       history_notes=skipped, known=known)
    path = document_path(status_dir, host.name)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=2) + "\n")
