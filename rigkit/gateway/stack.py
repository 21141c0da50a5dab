"""What the gateway becomes on its rig: a Compose project `rigkit-gateway` (the LiteLLM proxy, host
networking), its root-only env file (the master key), the rigs' API keys (root only, handed to the
running proxy by the rig-side helper) and the settings that helper (templates/gateway/rigkit-gateway) reads. Pure functions; roles/gateway.py installs them.

The config and the drain filter travel inside the compose file as Compose `configs` with inline
`content`: Compose copies them into the container, so nothing is bind-mounted from the rig's disk
(on the simulated rig the host's dockerd could not see the rig's files). No secret is in it.
"""

from __future__ import annotations

import hashlib
import json

from rigkit.gateway.config import BESIDE_CONFIG, MASTER_KEY_ENV, render_config
from rigkit.gateway.plan import GatewayPlan
from rigkit.plumbing.render import template_text

from rigkit.rigside.names import (
    GATEWAY_BACKEND_KEYS_PATH,
    GATEWAY_CLIENT_KEYS_PATH,
    GATEWAY_DIR,
    GATEWAY_PROJECT,
    GATEWAY_SECRETS_ENV_FILE,
    GATEWAY_TLS_CERT_PATH,
    GATEWAY_TLS_KEY_PATH,
)

COMPOSE_PATH = f"{GATEWAY_DIR}/compose.yml"
CONTAINER_DIR = "/etc/litellm"  # config.yaml, rigkit_drain.py and drained.json inside the container
DRAINED_FILE = f"{CONTAINER_DIR}/drained.json"
CLIENT_KEYS_FILE = f"{CONTAINER_DIR}/client_keys.json"  # the hashes rigkit_auth.py reads, written at run time
BACKEND_KEYS_FILE = f"{CONTAINER_DIR}/backend_keys.json"  # the rigs' keys rigkit_drain.py sends, written at run time
# TLS: the chain is an inline config like config.yaml; the key a Compose secret that Compose takes from
# this environment variable (set by the helper from the root-only key file) and copies into the
# container as /run/secrets/<name>, readable by root only.
TLS_KEY_SECRET = "gateway_tls_key"
CONFIGS_LABEL = "rigkit.configs-sha256"  # the inline configs' content, in the service's config hash
TLS_KEY_ENV = "RIGKIT_GATEWAY_TLS_KEY"


class GatewaySecretError(Exception):
    pass


def env_file(master_key: str) -> bytes:
    """The env file Compose reads raw (no interpolation): the master key. Nothing that rotates without a
    restart of the proxy is in it: a changed env file recreates the container."""
    if not master_key.startswith("sk-"):
        raise GatewaySecretError("the gateway's master key must start with sk- (LiteLLM refuses others)")
    return f"{MASTER_KEY_ENV}={master_key}\n".encode()


def backend_keys(plan: GatewayPlan, rig_keys: dict[str, str]) -> bytes:
    """What rigkit's callback in the proxy sends each replica (rigkit_drain.py): {api_base: its rig's key},
    from {key name (Replica.key_env): key}."""
    keys = {r.api_base.rstrip("/"): rig_keys[r.key_env] for r in plan.replicas if r.key_env}
    return (json.dumps({"keys": keys}, indent=2, sort_keys=True) + "\n").encode()


def client_key_hashes(keys: list[str]) -> str:
    """What the gateway's key check reads (rigkit_auth.py): the SHA-256 of each client key, never a key."""
    return json.dumps({"sha256": sorted({hashlib.sha256(k.encode()).hexdigest() for k in keys})}, indent=2) + "\n"


def _dollars(value):
    """Compose interpolates `$` everywhere in the file, inline config content included: double it."""
    if isinstance(value, str):
        return value.replace("$", "$$")
    if isinstance(value, list):
        return [_dollars(v) for v in value]
    if isinstance(value, dict):
        return {k: _dollars(v) for k, v in value.items()}
    return value


def render_compose(plan: GatewayPlan, tls_chain: bytes | None, image: str | None = None) -> str:
    """The compose file (JSON, which is YAML). `tls_chain`: the certificates LiteLLM serves (PEM; None:
    plain HTTP). `image`: tests give a locally built one."""
    spec = plan.spec
    document = {
        "name": GATEWAY_PROJECT,
        "services": {"litellm": {
            "image": image or spec.image,
            # The official image's entrypoint is `litellm`; these are its options.
            "command": ["--config", f"{CONTAINER_DIR}/config.yaml", "--host", spec.bind_address,
                        "--port", str(spec.port), "--num_workers", str(spec.workers)],
            # Host networking: the proxy reaches replicas on this rig's 127.0.0.1 and listens on bind_address.
            "network_mode": "host",
            "restart": "unless-stopped",
            "env_file": [{"path": GATEWAY_SECRETS_ENV_FILE, "format": "raw"}],
            # LITELLM_LOCAL_MODEL_COST_MAP: the price list LiteLLM ships, instead of fetching it from GitHub at
            # every start (three tries with pauses where the rig has no route out; nothing leaves the rig).
            "environment": {"LITELLM_LOG": "ERROR", "LITELLM_TELEMETRY": "False", "LITELLM_LOCAL_MODEL_COST_MAP": "True"},
            "configs": [
                {"source": "litellm_config", "target": f"{CONTAINER_DIR}/config.yaml"},
                *({"source": _stem(m), "target": f"{CONTAINER_DIR}/{_stem(m)}.py"} for m in BESIDE_CONFIG),
            ],
        }},
        "configs": {
            "litellm_config": {"content": render_config(plan)},
            **{_stem(m): {"content": template_text(m)} for m in BESIDE_CONFIG},
        },
    }
    if tls_chain is not None:
        service = document["services"]["litellm"]
        service["command"] += ["--ssl_certfile_path", f"{CONTAINER_DIR}/tls-cert.pem",
                               "--ssl_keyfile_path", f"/run/secrets/{TLS_KEY_SECRET}"]
        service["configs"].append({"source": "tls_cert", "target": f"{CONTAINER_DIR}/tls-cert.pem"})
        service["secrets"] = [{"source": TLS_KEY_SECRET, "target": TLS_KEY_SECRET, "mode": 0o400}]
        document["configs"]["tls_cert"] = {"content": tls_chain.decode("ascii")}
        document["secrets"] = {TLS_KEY_SECRET: {"environment": TLS_KEY_ENV}}
    # Compose's config hash, on which `up -d` recreates a container, leaves out the content of inline configs
    # (docker/compose#13045): without this label a changed LiteLLM config, drain filter or certificate would be
    # written and never served. No secret is hashed: the TLS key changes only with its certificate.
    contents = json.dumps(document["configs"], sort_keys=True).encode()
    document["services"]["litellm"]["labels"] = {CONFIGS_LABEL: hashlib.sha256(contents).hexdigest()}
    header = "# Rendered by rigkit from the inventory's gateway entry (docs/gateway.md); edits are overwritten.\n"
    return header + json.dumps(_dollars(document), indent=2) + "\n"


def _stem(template: str) -> str:
    return template.rsplit("/", 1)[1].removesuffix(".py")


def probe_host(spec) -> str:
    """Where the gateway's own rig reaches it (a GatewaySpec's bind address; its loopback for 0.0.0.0)."""
    return "127.0.0.1" if spec.bind_address == "0.0.0.0" else spec.bind_address


def scheme(plan: GatewayPlan) -> str:
    return "http" if plan.spec.tls == "none" else "https"


# A routing probe waits for LiteLLM's own view to change: a replica it marked unhealthy (a health check
# that ran while the replica restarted) or cooled down is routed again after the next passing check
# and the end of its cooldown. This margin covers one check's own duration and the probes' pace.
ROUTE_MARGIN_S = 15


def route_timeout_s(spec) -> int:
    """How long drain/undrain wait for LiteLLM to route as the drained file says: one health-check
    interval or one cooldown (whichever is longer; both run from the same failed check), plus margin."""
    return max(spec.health_check_interval_s or 0, spec.cooldown_s) + ROUTE_MARGIN_S


def settings(plan: GatewayPlan) -> str:
    """What the rig-side helper needs: where to probe, how long to wait, each replica's /metrics."""
    return json.dumps({
        "project": GATEWAY_PROJECT,
        "compose": COMPOSE_PATH,
        "url": f"{scheme(plan)}://{probe_host(plan.spec)}:{plan.spec.port}",
        **({} if plan.spec.tls == "none" else
           {"tls_cert": GATEWAY_TLS_CERT_PATH, "tls_key": GATEWAY_TLS_KEY_PATH, "tls_key_env": TLS_KEY_ENV}),
        "env_file": GATEWAY_SECRETS_ENV_FILE,
        "master_key_env": MASTER_KEY_ENV,
        "ready_timeout_s": plan.spec.ready_timeout_s,
        "drain_timeout_s": plan.spec.drain_timeout_s,
        "route_timeout_s": route_timeout_s(plan.spec),
        "drained_file": DRAINED_FILE,
        "client_keys": GATEWAY_CLIENT_KEYS_PATH,
        "client_keys_file": CLIENT_KEYS_FILE,
        "backend_keys": GATEWAY_BACKEND_KEYS_PATH,
        "backend_keys_file": BACKEND_KEYS_FILE,
        "models": sorted({r.model_name for r in plan.replicas}),
        "replicas": [{"rig": r.rig, "id": r.deployment_id, "model": r.model_name,
                      "metrics": r.api_base.removesuffix("/v1") + "/metrics"} for r in plan.replicas],
    }, indent=2) + "\n"
