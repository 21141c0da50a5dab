"""One download per fleet: which rig's weights volume each model is copied from. Pure; no pyinfra.

A model's `weights.source` may name another rig (`{rig: NAME, volume: ...}`). And where several
Linux rigs of an inventory keep the same model on a volume from the same source folder, the first
of them (inventory order) copies from that folder and the others take from its volume, unless
they are the same machine (one SSH address and port: one Docker Engine, one volume already).
The rig names are checked here, against the whole inventory, before any rig is reached: unknown
rig, the rig itself, a cycle, a Windows rig on either side, a source rig that keeps no such volume,
and either rig out of reach of the relay's one transport, OpenSSH's `ssh` (rigkit/weights/relay.py):
such rigs are never paired by sharing, and a source naming one is refused with the reason.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from rigkit.config.schema import ModelConfig, RigConfig, RigSource
from rigkit.rigside.names import volume_name


class RigSourceError(ValueError):
    pass


@dataclass(frozen=True)
class FleetRig:
    name: str  # inventory host name
    rig: RigConfig
    address: str  # "host:port": two entries with one address are one machine
    no_relay: str | None = None  # why OpenSSH cannot reach it as the deploy does (rigkit.plumbing.ssh.openssh_refusal)


def _with_source(model: ModelConfig, source: RigSource) -> ModelConfig:
    weights = model.spec.weights.model_copy(update={"source": source, "hub": None})  # the hub is asked by the first rig only
    return replace(model, spec=model.spec.model_copy(update={"weights": weights}))


def share_sources(fleet: list[FleetRig]) -> dict[str, RigConfig]:
    """{host name: its rig config}, later rigs' shared sources turned into the first rig's volume."""
    first: dict[tuple[str, str, str], FleetRig] = {}
    out = {}
    for entry in fleet:
        models = []
        for model in entry.rig.models:
            weights = model.spec.weights
            if weights.storage != "volume" or weights.from_rig is not None or entry.rig.spec.os != "linux":
                models.append(model)
                continue
            if entry.no_relay:  # the relay cannot reach it: its own copy, and no rig copies from it
                models.append(model)
                continue
            key = (model.name, weights.source, volume_name(model))
            owner = first.setdefault(key, entry)  # the first rig the relay reaches
            if owner is entry or owner.address == entry.address:
                models.append(model)
            else:
                models.append(_with_source(model, RigSource(rig=owner.name, volume=volume_name(model))))
        out[entry.name] = replace(entry.rig, models=tuple(models))
    return out


def check_rig_sources(rigs: dict[str, RigConfig], no_relay: dict[str, str | None] | None = None) -> None:
    """RigSourceError, one line, for the first bad rig source; rigs in inventory order; `no_relay`: {rig
    name: why the relay cannot reach it} (FleetRig.no_relay)."""
    no_relay = no_relay or {}
    edges: dict[tuple[str, str], tuple[str, str]] = {}  # (rig, volume) -> the (rig, volume) it copies from
    for name, rig in rigs.items():
        for model in rig.models:
            source = model.spec.weights.from_rig
            if source is None:
                continue
            where = f"rig {name} ({rig.file}), model {model.name} ({model.file}): weights.source {source}"
            if source.rig == name:
                raise RigSourceError(f"{where}: names this rig itself; give the folder on this rig instead")
            if source.rig not in rigs:
                raise RigSourceError(f"{where}: no rig of that name in the inventory; rigs: {', '.join(rigs)}")
            other = rigs[source.rig]
            if rig.spec.os != "linux" or other.spec.os != "linux":
                raise RigSourceError(f"{where}: copies between rigs are for Linux rigs only (a Windows rig's volumes "
                                     "live in Docker Desktop's VM); give a folder on this rig")
            wanted = source.volume or volume_name(model)
            kept = {volume_name(m): m for m in other.models if m.spec.weights.storage == "volume"}
            if wanted not in kept:
                raise RigSourceError(f"{where}: rig {source.rig} keeps no weights volume {wanted}; its volumes: "
                                     f"{', '.join(sorted(kept)) or 'none'}")
            for end in (name, source.rig):
                if no_relay.get(end):
                    raise RigSourceError(f"{where}: the copy between rigs runs over OpenSSH's `ssh`, which cannot reach "
                                         f"rig {end} as the deploy does: {no_relay[end]}; or give this model a "
                                         "folder on this rig")
            edges[(name, volume_name(model))] = (source.rig, wanted)
    for start in edges:
        seen, at = [start], edges[start]
        while at in edges:
            if at in seen:
                loop = " -> ".join(f"{r}:{v}" for r, v in seen[seen.index(at):] + [at])
                raise RigSourceError(f"weights sources form a cycle, no rig has the files first: {loop}; "
                                     "give one of them a folder as its source")
            seen.append(at)
            at = edges[at]
