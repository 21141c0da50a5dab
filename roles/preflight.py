"""Role preflight (Linux): stop a rig before anything on it changes, when what follows cannot work.

Runs first, before the base role, the GPU policy, any weight copy or stack change. Reads
only (rigkit.preflight.facts) and checks (rigkit.preflight.checks):
- the NVIDIA driver is installed (rigkit does not install it);
- its kernel module and user-space library are the same version (else: reboot to finish
  the driver upgrade);
- it is at least each serving image's `image_requires.driver_min`;
- every GPU a model runs on has an architecture in its image's `image_requires.archs`;
- the weights still to copy fit in the free space of Docker's data-root;
- for each model spanning GPUs (tensor x pipeline above 1), the topology it runs on
  (rigkit.topology, docs/topology.md): the links its all-reduce crosses are printed; a
  configuration known to hang NCCL is refused; where P2P is not usable the serving role gets the
  vLLM flags and environment that avoid it.
Each failure names the rig, the GPU or model, the numbers and the fix (docs/base.md).

Defaults: none; it reads only the validated RigConfig.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from pyinfra import host, logger
from pyinfra.api import deploy
from pyinfra.api.exceptions import DeployError

from rigkit.config.schema import RigConfig
from rigkit.plumbing.facts_once import Read, read_once
from rigkit.fit.check import model_fit, shapes_reads, shared_gpu_problems, variant_findings
from rigkit.fit.roofline import roofline_tok_s
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
from rigkit.topology.decide import Verdict
from rigkit.topology.facts import GpuTopology
from rigkit.topology.rig import needs_topology, render_verdict, spans_gpus, verdicts_from_fact
from rigkit.weights.facts import volume_states, volume_states_reads


@dataclass(frozen=True)
class Preflight:
    """What the preflight read and decided, for the roles after it."""

    driver: DriverState
    topology: dict[str, Verdict] = field(default_factory=dict)  # per model spanning GPUs


def preflight_reads(rig: RigConfig) -> list[Read]:
    """What the role asks the rig while planning (deploy.py reads them ahead, all at once)."""
    topology = [(GpuTopology, {})] if needs_topology(rig) else []
    return [(NvidiaDriverAndGpus, {}), *volume_states_reads(rig), *shapes_reads(rig), *topology]


@deploy("Preflight")
def preflight(rig: RigConfig) -> Preflight:
    """Returns what it read of the driver and decided of the topology; raises DeployError (nothing
    changed) on any problem."""
    driver = read_once(NvidiaDriverAndGpus).driver  # the GPU report reads the same nvidia-smi start
    for note in rig.notes:  # a catalog variant chosen for this rig's GPUs
        logger.info(f"{host.print_prefix}{note}")
    problems = driver_problems(rig, driver)
    topology: dict[str, Verdict] = {}
    if not problems:
        problems = arch_problems(rig, list(driver.gpus), "as the rig reports it")
        topology, topology_problems = _topology(rig)
        problems += topology_problems
        problems += _engine_hung(rig) or disk_problems(*_weights_to_copy(rig))
        problems += _fit(rig)
    for model in rig.models:
        if model.spec.image_requires is None:
            logger.warning(f"{host.print_prefix}{model.name}: no image_requires in {model.file}; the driver "
                           f"minimum and GPU architectures of {model.spec.image} are not checked")
    if problems:
        raise DeployError(f"rig {rig.name} ({rig.file}), nothing was changed: " + "; ".join(problems))
    logger.info(f"{host.print_prefix}preflight: driver {driver.library_version}, "
                + ", ".join(f"GPU {g.index} {g.name}" + (f" (sm_{g.compute_capability[0]}{g.compute_capability[1]})"
                                                         if g.compute_capability else "") for g in driver.gpus))
    return Preflight(driver, topology)


def _topology(rig: RigConfig) -> tuple[dict[str, Verdict], list[str]]:
    """Each multi-GPU model's verdict, printed; its errors are the preflight's problems."""
    if not needs_topology(rig):
        return {}, []
    verdicts, notes = verdicts_from_fact(rig, read_once(GpuTopology))
    for note in notes:
        logger.warning(f"{host.print_prefix}topology: not read: {note}")
    if not verdicts:
        logger.warning(f"{host.print_prefix}topology: no `nvidia-smi topo -m`, so the links of "
                       + ", ".join(m.name for m in rig.models if spans_gpus(m))
                       + " are not checked and vLLM gets no P2P settings from rigkit")
    problems = []
    for verdict in verdicts.values():
        logger.info(f"{host.print_prefix}topology: " + render_verdict(verdict).replace("\n", f"\n{host.print_prefix}  "))
        for warning in verdict.warnings:
            logger.warning(f"{host.print_prefix}topology: {warning}")
        problems += verdict.errors
    return verdicts, problems


def _fit(rig: RigConfig) -> list[str]:
    """Each model's weights and one sequence's KV cache against its GPUs' memory (rigkit.fit), said per model;
    a model that would not start is a problem."""
    answers = {}
    for fact, kwargs in shapes_reads(rig):
        answers = read_once(fact, **kwargs)
    answers = {**answers, **_from_the_hub(rig, answers)}
    read = read_once(NvidiaDriverAndGpus)
    memory = {g.index: g.memory_total_mib for g in (read.gpus.gpus if read.gpus else ())
              if isinstance(g.memory_total_mib, int) and g.memory_total_mib > 0}
    caps = {g.index: g.compute_capability for g in read.driver.gpus}
    problems = shared_gpu_problems(rig) + variant_findings(rig, answers, caps)
    for model in rig.models:
        found = model_fit(model, rig, answers.get(model.name) or {}, memory)
        if found is None:
            continue
        roof = roofline_tok_s(rig, model, answers.get(model.name))
        logger.info(f"{host.print_prefix}fit: {found.summary}"
                    + (f"; decode roofline {roof:,.0f} tok/s for one sequence" if roof else ""))
        for warning in found.warnings:
            logger.warning(f"{host.print_prefix}fit: {warning}")
        problems += found.problems
    return problems


def _from_the_hub(rig: RigConfig, answers: dict) -> dict:
    """For a hub model whose snapshot is not on the rig yet: what the hub says of its files, so that the fit is
    judged before the download. A hub that does not answer leaves the fit to the next deploy, said."""
    from rigkit.fit.hub_read import HubReadError, hub_answer
    from rigkit.serving.api_key import SecretFileError
    from rigkit.weights.hub import read_hub_token

    found = {}
    for model in rig.models:
        hub = model.spec.weights.hub
        if hub is None or (answers.get(model.name) or {}).get("config"):
            continue
        try:
            found[model.name] = hub_answer(model.name, hub, read_hub_token(rig))
        except (HubReadError, SecretFileError) as exc:
            logger.warning(f"{host.print_prefix}fit: {model.name}: {hub}: {exc}; its fit is judged once it is downloaded")
    return found


def _engine_hung(rig: RigConfig) -> list[str]:
    """The weights volumes' read found the Docker Engine hung: stop here, before the weights role waits on it."""
    hung = [s for s in volume_states(rig).values() if s.get("timed_out") == "docker"]
    return [f"{hung[0]['error']} (asked for the weights volumes): the Docker Engine is hung; check "
            "`systemctl status docker` and `journalctl -u docker` on the rig"] if hung else []


def _weights_to_copy(rig: RigConfig) -> tuple[list[WeightsNeed], int | None, str]:
    needs = []
    states = volume_states(rig)
    for model in rig.models:
        if model.spec.weights.storage != "volume" or model.spec.weights.from_rig:
            continue  # from another rig: the receiver checks the space against that rig's manifest
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
