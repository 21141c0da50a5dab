"""The LiteLLM proxy's config.yaml, rendered from a GatewayPlan. Pure functions, except
`inventory_config` (`rigkit gateway-config`), which reads the inventory file first.

Every replica of a model on every rig is one deployment of the same `model_name` (its served name),
`openai/<served name>` at the replica's api_base. Secrets are never in the file: the master key is an
`os.environ/...` reference, filled from the gateway's root-only env file, and a keyed replica's api_key is
BACKEND_KEY: rigkit's callback (templates/gateway/rigkit_drain.py, beside config.yaml) sends each call
with the replica's key from backend_keys.json, which a rotation replaces without restarting the proxy.
The same callback skips the replicas of the rigs listed in drained.json.
"""

from __future__ import annotations

import yaml

from rigkit.config.inventory import load_inventory
from rigkit.gateway.plan import GatewayPlan, gateway_plan

MASTER_KEY_ENV = "LITELLM_MASTER_KEY"
NO_KEY = "no-key"  # vLLM without --api-key ignores it; the OpenAI client refuses an empty one
BACKEND_KEY = "rigkit-sends-the-rigs-key"  # replaced on every call by rigkit_drain.py; no replica accepts it
DRAIN_CALLBACK = "rigkit_drain.handler"  # module file beside config.yaml, object in it
CUSTOM_AUTH = "rigkit_auth.user_api_key_auth"  # the master key and the client keys listed at run time
# The modules those two name, from templates/: they sit beside config.yaml wherever LiteLLM runs it.
BESIDE_CONFIG = ("gateway/rigkit_drain.py", "gateway/rigkit_auth.py")
# A health check is one completion of this many tokens (model_info.health_check_max_tokens; LiteLLM's
# own default is 16). It goes to /v1/completions (mode: completion): a base model without a chat
# template answers that endpoint, not /v1/chat/completions.
HEALTH_CHECK_MAX_TOKENS = 1
HEALTH_CHECK_MODE = "completion"


def litellm_config(plan: GatewayPlan, drain: bool = True) -> dict:
    """`drain`: load rigkit's callback (drain filter, rigs' keys) and key check (the deployed gateway has them
    beside its config; a config printed for a LiteLLM of the user's own has not, and rigkit cannot drain that
    one: it names each rig's key as an environment variable instead)."""
    spec = plan.spec
    model_list = []
    for replica in plan.replicas:
        name = replica.model_name
        model_list.append({
            "model_name": name,
            "litellm_params": {
                "model": f"openai/{name}",
                "api_base": replica.api_base,
                "api_key": (BACKEND_KEY if drain else f"os.environ/{replica.key_env}") if replica.key_env else NO_KEY,
                # Both timeouts cover the whole prefill: a long prompt sends its first token late.
                "timeout": spec.request_timeout_s,
                "stream_timeout": spec.request_timeout_s,
            },
            "model_info": {"id": replica.deployment_id, "rigkit_rig": replica.rig, "rigkit_model": replica.model.name,
                           **_health_check_info(spec)},
        })
    fallbacks = {}
    for replica in plan.replicas:
        if replica.model.spec.gateway_fallbacks:
            fallbacks.setdefault(replica.model_name, list(replica.model.spec.gateway_fallbacks))
    router = {
        "routing_strategy": "simple-shuffle",
        "num_retries": spec.num_retries,
        "retry_after": 0,  # another replica is usually free at once; waiting only adds to the client's latency
        "allowed_fails": spec.allowed_fails,
        "cooldown_time": spec.cooldown_s,
        "timeout": spec.request_timeout_s,
        "stream_timeout": spec.request_timeout_s,
    }
    if fallbacks:
        router["fallbacks"] = [{name: targets} for name, targets in sorted(fallbacks.items())]
    return {
        "model_list": model_list,
        "router_settings": router,
        "litellm_settings": {"request_timeout": spec.request_timeout_s, **({"callbacks": [DRAIN_CALLBACK]} if drain else {})},
        "general_settings": {"master_key": f"os.environ/{MASTER_KEY_ENV}", **({"custom_auth": CUSTOM_AUTH} if drain else {}),
                             **_health_check_settings(spec)},
    }


def _health_check_settings(spec) -> dict:
    """LiteLLM's background health checks (general_settings, read by proxy_server.load_config), and
    routing by their results: a replica whose last check failed gets no traffic until one passes;
    if every replica of a model failed, LiteLLM routes to all of them (its own safety net)."""
    if not spec.health_check_interval_s:
        return {}
    return {"background_health_checks": True, "health_check_interval": spec.health_check_interval_s,
            "enable_health_check_routing": True}


def _health_check_info(spec) -> dict:
    """Per deployment: what a health check sends. It authenticates as requests do (the deployment's
    api_key) and asks the deployment's own model; one token keeps it cheap."""
    if not spec.health_check_interval_s:
        return {}
    return {"mode": HEALTH_CHECK_MODE, "health_check_max_tokens": HEALTH_CHECK_MAX_TOKENS}


def render_config(plan: GatewayPlan, drain: bool = True) -> str:
    header = ("# LiteLLM proxy config rendered by rigkit (docs/gateway.md); edits are overwritten.\n"
              f"# Gateway host: {plan.host}; {len(plan.replicas)} replica(s).\n")
    return header + yaml.safe_dump(litellm_config(plan, drain), sort_keys=False, default_flow_style=False)


def inventory_config(inventory: str) -> str | None:
    """The config of the gateway of the inventory file `inventory`, without the drain filter, offline (no
    rig is reached); None when no host has `gateway` data. Its errors: RigConfigError."""
    plan = gateway_plan(list(load_inventory(inventory)))
    return None if plan is None else render_config(plan, drain=False)
