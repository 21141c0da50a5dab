"""Role weights: copy each model's weights onto its Docker volume, verified and resumable.

For models with `weights.storage: volume` (the default). Whether a copy is needed is a
read-only fact (rigkit.weights.facts: the volume's marker and manifest against the source's
metadata, read on the rig without starting a container), so planning changes nothing. The
copy itself talks to the rig's Docker Engine with the docker SDK through the deploy's SSH
connection (`docker system dial-stdio`, as the docker CLI does over ssh://), over a Unix
socket only the deploying user can open. `verify` (`rigkit deploy --verify-weights`)
re-hashes every volume against its manifest first; files that differ are copied again.
A source that is missing, empty, or has a symlink that dangles or leaves its cache folder
stops the deploy with the reason.
"""

from __future__ import annotations

import shlex

from pyinfra.api import deploy
from pyinfra.api.exceptions import DeployError
from pyinfra.operations import server

from rigkit.config.schema import RigConfig
from rigkit.plumbing.rig_reads import DOCKER_S, bounded
from rigkit.weights.facts import helpers_left, volume_states
from rigkit.serving.api_key import SecretFileError
from rigkit.weights.hub import read_hub_token
from rigkit.weights.operation import (cache_operations, copy_operations, download_operations, own_copies_first,
                                      relay_operations)
from rigkit.config.defaults import WEIGHTS_CHUNK_BYTES


@deploy("Weights")
def weights(rig: RigConfig, verify: bool = False, chunk_bytes: int = WEIGHTS_CHUNK_BYTES) -> dict:
    """Returns {model name: the copy operation}, so serving can restart a model whose weights changed.
    `verify`: re-hash every volume against its manifest first (`rigkit deploy --verify-weights`).
    `chunk_bytes`: a copy from another rig's volume is fsynced, journaled and resumed in chunks of this size."""
    on_volumes = [m for m in rig.models if m.spec.weights.storage == "volume"]
    # Weights left on a bind mount are warned about by the serving checks (rig.warnings).
    states = volume_states(rig)
    left = helpers_left(rig)
    if left:
        # A copy whose controller was killed finished on its own: its container stays (only the controller
        # removes one), holding its volume in use. Exited ones only: a running copy is another deploy's.
        # One already gone (its owner removed it since) is what was wanted: only a helper still there fails.
        docker = bounded("docker", DOCKER_S)
        server.shell(name=f"Remove weights helpers a killed copy left behind: {', '.join(left)}",
                     commands=[f"for n in {' '.join(shlex.quote(n) for n in left)}; do {docker} rm \"$n\" >/dev/null 2>&1 "
                               f"|| ! {docker} container inspect \"$n\" >/dev/null 2>&1 || exit 1; done"])
    own = [m for m in on_volumes if not m.spec.weights.from_rig]
    # From the hub: downloaded into the rig's cache first, then copied and proven like any cache folder. A rig
    # that takes the model from another rig's volume (the fleet's pairing) never asks the hub.
    from_hub = [m for m in own if m.spec.weights.hub]
    try:
        token = read_hub_token(rig) if from_hub else None
    except SecretFileError as exc:
        raise DeployError(str(exc)) from None
    if on_volumes:
        download_operations(from_hub, states, token)
    ops = copy_operations(own, states, verify)
    if on_volumes:
        own_copies_first()
    # After every rig's own copies (pyinfra runs one operation on all rigs before the next): a rig that
    # downloads for the fleet has its volume complete before the others take from it.
    from_rigs = [m for m in on_volumes if m.spec.weights.from_rig]
    ops.update(relay_operations(from_rigs, states, verify, chunk_bytes))
    # The graphs vLLM compiled on the same rig, where this rig can load them: not a change of the weights (the
    # running model is not restarted for them), what its next start needs no longer to compile.
    cache_operations(from_rigs)
    return ops

