"""Role gateway: the LiteLLM proxy as a Compose project on the one rig whose inventory data has
`gateway:` (docs/gateway.md), over every replica of every model on every rig of the inventory.

Files: the rig-side helper /usr/local/sbin/rigkit-gateway, /etc/rigkit/gateway/compose.yml (the
proxy's config, drain filter and key check inline, no secret), gateway.json (the helper's settings),
client-keys.json (the client keys' SHA-256), the TLS chain (tls-cert.pem) and the root-only
/etc/rigkit/secrets/gateway.env (the master key and each rig's API key, read raw by Compose) and
gateway-tls.key. `rigkit-gateway up` runs only when one of them changed or the proxy is down; it
hands the proxy the client keys and waits, bounded, for it to list every model. A second deploy
changes nothing. A certificate rigkit issues is kept on the control machine by an operation of its
own, before the files reach the rig (rigkit.gateway.tls).
"""

from __future__ import annotations

from pathlib import Path

from pyinfra import host, logger
from pyinfra.api import deploy
from pyinfra.api.exceptions import DeployError, OperationError
from pyinfra.operations import files, python, server

from rigkit.plumbing.files import put
from rigkit.gateway.facts import GatewayRunning
from rigkit.gateway.stack import (
    COMPOSE_PATH,
    GATEWAY_DIR,
    GatewaySecretError,
    backend_keys,
    client_key_hashes,
    env_file,
    render_compose,
    settings,
)
from rigkit.gateway.plan import GatewayPlan
from rigkit.gateway.tls import TlsError, ca_dir, plain_http_warning, plan_tls
from rigkit.plumbing.private_file import private_file
from rigkit.plumbing.ssh import rig_call
from rigkit.plumbing.render import template_text
from rigkit.rigside.names import (
    GATEWAY_BACKEND_KEYS_PATH,
    GATEWAY_CLIENT_KEYS_PATH,
    GATEWAY_HELPER_PATH,
    GATEWAY_PROJECT,
    GATEWAY_SECRETS_ENV_FILE,
    GATEWAY_SETTINGS_PATH,
    GATEWAY_TLS_CERT_PATH,
    GATEWAY_TLS_KEY_PATH,
)
from rigkit.serving.api_key import SecretFileError, read_api_key, read_key_file


@deploy("Gateway")
def gateway(plan: GatewayPlan, rigs: dict) -> list:
    """`rigs`: {inventory host: RigConfig} of every rig, for their API keys. Returns the operations
    that change the gateway (its files and its start), for verification through it to follow."""
    try:
        master = read_key_file(plan.spec.master_key_file, f"host {plan.host}: gateway.master_key_file")
        keys = {env: read_api_key(rigs[name]) for name, env in plan.keyed_rigs}
        secret = env_file(master)
        clients = [read_key_file(path, f"host {plan.host}: gateway.client_key_files[{n}]")
                   for n, path in enumerate(plan.spec.client_key_files)]
        tls = plan_tls(plan)
    except (SecretFileError, GatewaySecretError, TlsError) as exc:
        raise DeployError(f"host {plan.host}: {exc}") from None
    if warning := plain_http_warning(plan.host, plan.spec):
        logger.warning(f"{host.print_prefix}{warning}")
    if tls is not None and tls.pending:
        # Issued while planning, kept only now: a dry run writes nothing (rigkit.gateway.tls).
        python.call(name=f"Keep the gateway's new certificate in {ca_dir(plan.spec)} (this control machine)",
                    function=rig_call(_keep), tls=tls)
    paths = (GATEWAY_HELPER_PATH, COMPOSE_PATH, GATEWAY_SETTINGS_PATH, GATEWAY_TLS_CERT_PATH,
             GATEWAY_CLIENT_KEYS_PATH)  # read in one command
    files.directory(name="Gateway folder", path=GATEWAY_DIR, mode="755")
    files.directory(name="Secrets folder, root only", path=str(Path(GATEWAY_SECRETS_ENV_FILE).parent), mode="700")
    changed = [
        put(name="Install the gateway helper", data=template_text("gateway/rigkit-gateway"), dest=GATEWAY_HELPER_PATH,
            mode="755", batch=paths),
        put(name="Gateway compose file (LiteLLM config inline)", data=render_compose(plan, tls and tls.cert_pem),
            dest=COMPOSE_PATH, mode="644", batch=paths),
        put(name="Gateway helper settings", data=settings(plan), dest=GATEWAY_SETTINGS_PATH, mode="644", batch=paths),
        private_file(name="Gateway master key (root only)", dest=GATEWAY_SECRETS_ENV_FILE, data=secret),
        # Changed alone, `up` recreates nothing either: the proxy sends the rigs' new keys from its next call.
        private_file(name=f"The keys of the gateway's {len(keys)} keyed rig(s) (root only)",
                     dest=GATEWAY_BACKEND_KEYS_PATH, data=backend_keys(plan, keys)),
        # Changed alone, `up` recreates nothing: it hands the new list to the running proxy (no request fails).
        put(name=f"Gateway client keys ({len(clients)}, as SHA-256)", data=client_key_hashes(clients),
            dest=GATEWAY_CLIENT_KEYS_PATH, mode="600", batch=paths),
    ]
    if tls is not None:
        changed += [
            put(name="Gateway TLS certificate", data=tls.cert_pem, dest=GATEWAY_TLS_CERT_PATH, mode="644", batch=paths),
            private_file(name="Gateway TLS key (root only)", dest=GATEWAY_TLS_KEY_PATH, data=tls.key_pem),
        ]
    else:
        changed += [files.file(name="No TLS certificate", path=path, present=False)
                    for path in (GATEWAY_TLS_CERT_PATH, GATEWAY_TLS_KEY_PATH)]
    running = host.get_fact(GatewayRunning, project=GATEWAY_PROJECT)
    started = server.shell(
        name=f"Start the gateway on port {plan.spec.port} and wait until it lists every model",
        commands=[f"{GATEWAY_HELPER_PATH} up"],
        _if=lambda: running == 0 or any(op.did_change() for op in changed),
    )
    return [*changed, started]



def _keep(tls) -> None:
    try:
        tls.save()
    except (TlsError, OSError) as exc:
        raise OperationError(f"could not keep the gateway's certificate: {exc}") from None
