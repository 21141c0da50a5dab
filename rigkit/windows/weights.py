"""Weights onto Docker volumes on a Windows rig: the Linux copy, reached through Docker Desktop.

The copy itself is rigkit.weights' (`copy_on_rig`: the docker SDK over the deploy's SSH
connection, `docker.exe system dial-stdio` on the rig; the helper container mounts the
Windows source folder read-only, as Docker Desktop takes `C:\\...` bind sources). Only the
read-only fact differs: Docker Desktop keeps volumes inside its VM, so the check runs the
same copier in a throwaway read-only container (`WindowsWeightsVolumeState`), from a copy of
the copier this puts under C:\\ProgramData\\rigkit\\weights.
"""

from __future__ import annotations

from pyinfra import host, logger

from rigkit.config.schema import RigConfig
from rigkit.weights.copier import copier_source
from rigkit.rigside.names import volume_name
from rigkit.weights.layout import helper_image
from rigkit.weights.operation import copy_operations
from rigkit.windows import operations as winops
from rigkit.windows.facts import WindowsWeightsVolumeState
from rigkit.windows.names import COPIER


def weights_onto_volumes(rig: RigConfig, verify: bool = False) -> dict:
    """{model name: its copy operation} for the models with `weights.storage: volume`; a copy
    runs only where the fact says the volume is not the source's complete copy (or `verify`)."""
    on_volumes = [m for m in rig.models if m.spec.weights.storage == "volume"]
    if not on_volumes:
        return {}
    winops.file(name=f"Put {COPIER}", dest=str(COPIER), data=copier_source().encode())
    states = volume_states(rig)
    for name, state in states.items():
        if state.get("why"):  # Docker did not answer in time, or not with the copier's JSON
            logger.warning(f"{host.print_prefix}weights check of {name}: {state['why']}; the copy checks again itself")
    return copy_operations(on_volumes, states, verify)


def volume_states(rig: RigConfig) -> dict[str, dict]:
    """{model: the copier's answer for its volume} for the models with `weights.storage: volume`
    (read-only: `WindowsWeightsVolumeState`); the deploy's decision and `rigkit status` read the same."""
    return {model.name: host.get_fact(WindowsWeightsVolumeState, volume=volume_name(model),
                                      source=model.spec.weights.source, image=helper_image(model), copier=str(COPIER))
            for model in rig.models if model.spec.weights.storage == "volume"}
