"""Role gateway: the LiteLLM proxy as a Compose project on the one rig whose inventory data has
`gateway:` (docs/gateway.md), over every replica of every model on every rig of the inventory.

Files: the rig-side helper /usr/local/sbin/rigkit-gateway, /etc/rigkit/gateway/compose.yml (the
proxy's config and drain filter inline, no secret), gateway.json (the helper's settings) and the
root-only /etc/rigkit/secrets/gateway.env (the master key and each rig's API key, read raw by
Compose). `rigkit-gateway up` runs only when one of them changed or the proxy is down; it waits,
bounded, for the proxy to list every model. A second deploy changes nothing.
"""

from __future__ import annotations

from pathlib import Path

from pyinfra import host
from pyinfra.api import deploy
from pyinfra.api.exceptions import DeployError
from pyinfra.operations import files, server

from rigkit.plumbing.files import put
from rigkit.gateway.facts import GatewayRunning
from rigkit.gateway.stack import (
    COMPOSE_PATH,
    GATEWAY_DIR,
    GatewaySecretError,
    env_file,
    render_compose,
    settings,
)
from rigkit.gateway.plan import GatewayPlan
from rigkit.plumbing.private_file import private_file
from rigkit.plumbing.render import template_text
from rigkit.rigside.names import GATEWAY_HELPER_PATH, GATEWAY_PROJECT, GATEWAY_SECRETS_ENV_FILE, GATEWAY_SETTINGS_PATH
from rigkit.serving.api_key import SecretFileError, read_api_key, read_key_file


@deploy("Gateway")
def gateway(plan: GatewayPlan, rigs: dict) -> list:
    """`rigs`: {inventory host: RigConfig} of every rig, for their API keys. Returns the operations
    that change the gateway (its files and its start), for verification through it to follow."""
    try:
        master = read_key_file(plan.spec.master_key_file, f"host {plan.host}: gateway.master_key_file")
        keys = {env: read_api_key(rigs[name]) for name, env in plan.keyed_rigs}
        secret = env_file(master, keys)
    except (SecretFileError, GatewaySecretError) as exc:
        raise DeployError(str(exc)) from None
    paths = (GATEWAY_HELPER_PATH, COMPOSE_PATH, GATEWAY_SETTINGS_PATH)  # read in one command
    files.directory(name="Gateway folder", path=GATEWAY_DIR, mode="755")
    files.directory(name="Secrets folder, root only", path=str(Path(GATEWAY_SECRETS_ENV_FILE).parent), mode="700")
    changed = [
        put(name="Install the gateway helper", data=template_text("gateway/rigkit-gateway"), dest=GATEWAY_HELPER_PATH,
            mode="755", batch=paths),
        put(name="Gateway compose file (LiteLLM config inline)", data=render_compose(plan), dest=COMPOSE_PATH,
            mode="644", batch=paths),
        put(name="Gateway helper settings", data=settings(plan), dest=GATEWAY_SETTINGS_PATH, mode="644", batch=paths),
        private_file(name="Gateway keys (root only)", dest=GATEWAY_SECRETS_ENV_FILE, data=secret),
    ]
    running = host.get_fact(GatewayRunning, project=GATEWAY_PROJECT)
    started = server.shell(
        name=f"Start the gateway on port {plan.spec.port} and wait until it lists every model",
        commands=[f"{GATEWAY_HELPER_PATH} up"],
        _if=lambda: running == 0 or any(op.did_change() for op in changed),
    )
    return [*changed, started]
