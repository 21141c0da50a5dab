"""`rigkit status` for a Windows rig (status.py picks it for `os: windows`): what it reads through
`@winssh`, set against the inventory by Linux's report (rigkit.status.report.build_status), so the
document, its drift and failures, and `rigkit status`'s exit codes are Linux's.

Reads only, and what stands for each Linux section:
- GPUs: nvidia-smi.exe (`WindowsNvidiaGpus`), power limits against the policy (no persistence mode:
  Windows' WDDM driver has none);
- policy: the three scheduled tasks (`Export-ScheduledTask` against the rendered XML, `same_task`),
  and whether GPU-PowerPolicy and LocalLLM-Bootstrap last ran successfully on the files installed now
  (the record the deploy writes after a successful run, `applied\\<task>.txt`);
- stacks: each model's compose file and rigkit's other files (SHA-256 against the rendered bundle);
  its containers and image through Docker Desktop's Engine (the docker SDK over the SSH connection,
  `docker.exe system dial-stdio`, as verification reaches it); a one-token completion through an SSH
  port forward to its loopback port (the Linux probe's `one_token`, from the control machine);
- weights: each volume through the copier's read-only check in a throwaway container
  (`WindowsWeightsVolumeState`, as the deploy reads it);
- last verification: the results on this control machine, as on Linux.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
from datetime import datetime, timezone
from pathlib import Path

from pyinfra import host

from rigkit.config.schema import ModelConfig, RigConfig
from rigkit.rigside.names import project_name, served_name
from rigkit.rigside.probe import NoAnswer, one_token
from rigkit.serving.api_key import SecretFileError, api_key_env_file, read_api_key
from rigkit.plumbing.ssh_forward import forward
from rigkit.status.collect import READY_DEADLINE_S, document_path, latest_results
from rigkit.status.report import Commands, build_status
from rigkit.weights.engine import dial_command, rig_engine
from rigkit.windows import operations as winops
from rigkit.windows.bundle import installed_files, render_bundle, same_task
from rigkit.windows.facts import ScheduledTaskXml, WindowsFileSha256, WindowsNvidiaGpus
from rigkit.windows.names import TASK_POWER, TASKS, compose_path
from rigkit.windows.weights import volume_states

ADMIN = "an elevated administrator (PowerShell)"


def recreate_command(model_name: str) -> str:
    """What recreates a model's container on the rig (the bootstrap's own `up -d --force-recreate`)."""
    return subprocess.list2cmdline(["docker", "compose", "-f", compose_path(model_name), "up", "-d", "--force-recreate"])


def _key(rig: RigConfig) -> tuple[str | None, bytes | None]:
    try:
        key = read_api_key(rig)
    except SecretFileError:
        return None, None  # the deploy refuses such a key file; judged as if there were none
    return key, (api_key_env_file(key) if key is not None else None)


def task_states(rig: RigConfig, bundle: dict[str, str], installed: dict[str, bytes], key_file: bytes | None) -> dict:
    inputs = winops.task_inputs(installed, key_file)
    states = {}
    for task in TASKS:
        exported = host.get_fact(ScheduledTaskXml, task_name=task)
        states[task] = {"registered": exported is not None,
                        "as_rendered": exported is not None and same_task(exported, bundle[f"tasks/{task}.xml"]),
                        "applied": winops.ran_on(task, inputs[task]) if task in inputs else None}
    return states


def _containers(client, model: ModelConfig) -> dict:
    """The probe's `containers`, `containers_error` and `catalog_image` for one model, from the Engine API."""
    import docker

    found: dict = {}
    try:
        listed = client.containers.list(all=True, filters={"label": f"com.docker.compose.project={project_name(model)}"})
        found["containers"] = [{"name": c.name, "status": c.attrs["State"].get("Status"),
                                "running": bool(c.attrs["State"].get("Running")),
                                "restart_count": c.attrs.get("RestartCount", 0),
                                "started_at": c.attrs["State"].get("StartedAt"), "image_id": c.attrs.get("Image"),
                                "config_image": c.attrs.get("Config", {}).get("Image")} for c in listed]
        found["containers_error"] = None
    except docker.errors.DockerException as exc:
        found["containers"], found["containers_error"] = None, str(exc)[-300:]
    try:
        image = client.images.get(model.spec.image)
        found["catalog_image"] = {"id": image.id, "repo_digests": image.attrs.get("RepoDigests") or []}
    except docker.errors.DockerException as exc:
        found["catalog_image"] = {"id": None, "repo_digests": [], "error": str(exc)[-200:]}
    return found


def _ready(model: ModelConfig, key: str | None) -> dict:
    with forward(host.connector.client.get_transport(), model.spec.port) as local_port:
        try:
            seconds = one_token(local_port, served_name(model), key, READY_DEADLINE_S)
            return {"ok": True, "seconds": round(seconds, 3), "error": None, "port": model.spec.port}
        except NoAnswer as exc:
            error = ("answered without choices" if exc.no_choices else f"HTTP {exc.http_status}"
                     if exc.http_status is not None else f"no completion within {READY_DEADLINE_S} s ({exc.reason})")
            return {"ok": False, "seconds": round(exc.seconds, 3), "error": error, "port": model.spec.port}


def stacks(rig: RigConfig, installed_sha: dict[str, str | None], key: str | None) -> dict:
    """The Linux probe's `stacks` for a Windows rig."""
    found = {m.name: {"deployed": installed_sha.get(compose_path(m.name)) is not None,
                      "files": {"compose.yml": installed_sha.get(compose_path(m.name))}} for m in rig.models}
    try:
        with rig_engine(host.connector.client.get_transport(), dial_command(host.connector)) as client:
            for model in rig.models:
                found[model.name].update(_containers(client, model))
    except Exception as exc:  # noqa: BLE001 -- any failure to reach Docker Desktop is reported, never raised
        for model in rig.models:
            found[model.name].update(containers=None, catalog_image={},
                                     containers_error=f"Docker Desktop's engine not reached: {str(exc)[-300:]}")
    for model in rig.models:
        running = any(c.get("running") for c in found[model.name].get("containers") or [])
        found[model.name]["ready"] = _ready(model, key) if running else {"ok": None, "error": None}
    return found


def collect_windows(rig: RigConfig, status_dir: Path, inventory: str, results_dir: Path) -> None:
    now = datetime.now(timezone.utc)
    commands = Commands(inventory, host.name, admin=ADMIN)
    bundle = render_bundle(rig)
    installed = installed_files(bundle)
    key, key_file = _key(rig)
    installed_sha = {path: host.get_fact(WindowsFileSha256, path=path) for path in installed}
    compose_files = {compose_path(m.name) for m in rig.models}
    wanted = {m.name: {"compose.yml": hashlib.sha256(installed[compose_path(m.name)]).hexdigest()} for m in rig.models}
    probe = {"stacks": stacks(rig, installed_sha, key), "volumes": {}}
    results, skipped = latest_results(rig, results_dir)
    doc = build_status(rig, host.name, commands, host.get_fact(WindowsNvidiaGpus), probe, volume_states(rig), wanted,
                       results, now, TASK_POWER, history_notes=skipped,
                       scheduled_tasks=task_states(rig, bundle, installed, key_file),
                       recreate=lambda name: commands.on_rig(recreate_command(name)))
    if rig.spec.gpu_policy == "apply":
        changed = sorted(p for p, data in installed.items()
                         if p not in compose_files and installed_sha[p] != hashlib.sha256(data).hexdigest())
        if changed:
            doc["drift"].append({"what": "rigkit's files on the rig", "found": f"{', '.join(changed)} differ from "
                                 "what the rig file renders (edited on the rig, or rendered differently since)",
                                 "wanted": "as rendered", "repair": commands.deploy})
            doc["ok"] = False
    path = document_path(status_dir, host.name)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=2) + "\n")
