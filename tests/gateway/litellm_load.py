"""Load a rendered config with LiteLLM's own proxy config loader and print what LiteLLM made of it
(JSON on stdout). Runs in LiteLLM's venv (tests/gateway/venv.py), not in rigkit's.

    litellm-venv/bin/python tests/gateway/litellm_load.py CONFIG.yaml
"""

import asyncio
import json
import sys


async def main(path: str) -> None:
    import litellm
    from litellm.proxy import proxy_server
    from litellm.proxy.proxy_server import ProxyConfig

    router, model_list, _ = await ProxyConfig().load_config(router=None, config_file_path=path)
    deployments = []
    for d in model_list:
        params = d["litellm_params"]
        deployments.append({
            "model_name": d["model_name"],
            "model": params["model"],
            "api_base": params.get("api_base"),
            "api_key": params.get("api_key"),  # resolved from os.environ/ by LiteLLM
            "timeout": params.get("timeout"),
            "stream_timeout": params.get("stream_timeout"),
            "id": d["model_info"]["id"],
            "rig": d["model_info"].get("rigkit_rig"),
            "health_check_mode": d["model_info"].get("mode"),
            "health_check_max_tokens": d["model_info"].get("health_check_max_tokens"),
        })
    print(json.dumps({
        "litellm_version": litellm.version if isinstance(getattr(litellm, "version", None), str) else None,
        "deployments": deployments,
        "num_retries": router.num_retries,
        "allowed_fails": router.allowed_fails,
        "cooldown_time": router.cooldown_time,
        "timeout": router.timeout,
        "fallbacks": router.fallbacks,
        "master_key_set": proxy_server.master_key is not None and proxy_server.master_key.startswith("sk-"),
        "callbacks": [type(c).__name__ for c in litellm.callbacks],
        # What load_config set for the background health checks (module globals it assigns).
        "background_health_checks": proxy_server.use_background_health_checks,
        "health_check_interval": proxy_server.health_check_interval,
        "health_check_routing": getattr(router, "enable_health_check_routing", None),
    }))


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1]))
