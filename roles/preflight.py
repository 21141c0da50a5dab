"""Role preflight (Linux): stop a rig before anything on it changes, when what follows cannot work.

Runs first, before the base role, the GPU policy, any weight copy or stack change. Reads
only (rigkit.preflight.facts) and checks (rigkit.preflight.checks):
- the NVIDIA driver is installed (rigkit does not install it);
- its kernel module and user-space library are the same version (else: reboot to finish
  the driver upgrade);
- it is at least each serving image's `image_requires.driver_min`;
- every GPU a model runs on has an architecture in its image's `image_requires.archs`;
- the weights still to copy fit in the free space of Docker's data-root.
Each failure names the rig, the GPU or model, the numbers and the fix (docs/base.md).

Defaults: none; it reads only the validated RigConfig.
"""

from __future__ import annotations

from pyinfra import host, logger
from pyinfra.api import deploy
from pyinfra.api.exceptions import DeployError

from rigkit.config.schema import RigConfig
from rigkit.facts_once import Read, read_once
from rigkit.gpu.facts import NvidiaDriverAndGpus
from rigkit.preflight.checks import (
    DriverState,
    WeightsNeed,
    arch_problems,
    disk_problems,
    driver_problems,
)
from rigkit.preflight.facts import DockerDiskFree, WeightsBytes
from rigkit.rigside.names import volume_name
from rigkit.weights.facts import volume_states, volume_states_reads


def preflight_reads(rig: RigConfig) -> list[Read]:
    """What the role asks the rig while planning (deploy.py reads them ahead, all at once)."""
    return [(NvidiaDriverAndGpus, {}), *volume_states_reads(rig)]


@deploy("Preflight")
def preflight(rig: RigConfig) -> DriverState:
    """Returns what it read of the driver; raises DeployError (nothing changed) on any problem."""
    driver = read_once(NvidiaDriverAndGpus).driver  # the GPU report reads the same nvidia-smi start
    problems = driver_problems(rig, driver)
    if not problems:
        problems = arch_problems(rig, list(driver.gpus), "as the rig reports it")
        problems += _engine_hung(rig) or disk_problems(*_weights_to_copy(rig))
    for model in rig.models:
        if model.spec.image_requires is None:
            logger.warning(f"{host.print_prefix}{model.name}: no image_requires in {model.file}; the driver "
                           f"minimum and GPU architectures of {model.spec.image} are not checked")
    if problems:
        raise DeployError(f"rig {rig.name} ({rig.file}), nothing was changed: " + "; ".join(problems))
    logger.info(f"{host.print_prefix}preflight: driver {driver.library_version}, "
                + ", ".join(f"GPU {g.index} {g.name}" + (f" (sm_{g.compute_capability[0]}{g.compute_capability[1]})"
                                                         if g.compute_capability else "") for g in driver.gpus))
    return driver


def _engine_hung(rig: RigConfig) -> list[str]:
    """The weights volumes' read found the Docker Engine hung: stop here, before the weights role waits on it."""
    hung = [s for s in volume_states(rig).values() if s.get("timed_out") == "docker"]
    return [f"{hung[0]['error']} (asked for the weights volumes): the Docker Engine is hung; check "
            "`systemctl status docker` and `journalctl -u docker` on the rig"] if hung else []


def _weights_to_copy(rig: RigConfig) -> tuple[list[WeightsNeed], int | None, str]:
    needs = []
    states = volume_states(rig)
    for model in rig.models:
        if model.spec.weights.storage != "volume":
            continue
        volume, source = volume_name(model), model.spec.weights.source
        if states[model.name].get("status") == "unchanged":
            continue
        size = host.get_fact(WeightsBytes, source=source, volume=volume)
        if size["source_bytes"] is not None:  # a missing source is the weights role's error to report
            needs.append(WeightsNeed(model.name, source, size["source_bytes"], size["volume_bytes"]))
    if not needs:
        return [], None, ""
    disk = host.get_fact(DockerDiskFree)
    return needs, disk["free_bytes"], disk["dir"]
