"""What a served model becomes on the rig: the `vllm serve` command line, its
compose file and the readiness settings the rig-side helper reads. Pure functions.
"""

from __future__ import annotations

import json
import re

from rigkit.config.paths import is_windows_path
from rigkit.config.schema import ModelConfig
from rigkit.plumbing.render import render
from rigkit.rigside.names import (
    ACCEPTED_KEYS_ENV, ENGINE_SERVICE, SECRETS_ENV_FILE, compile_cache_volume, project_name, served_name, volume_name,
)

MODELS_MOUNT = "/models"


def container_model_path(model: ModelConfig) -> str:
    return f"{MODELS_MOUNT}/{model.name}"


def load_strategy(model: ModelConfig) -> str | None:
    """Weights that must stay on a bind mount are read ahead: vLLM's automatic
    prefetch only recognises NFS and Lustre, and prefetch cut one 9P load 1028 s -> 756 s."""
    explicit = model.spec.vllm.safetensors_load_strategy
    if explicit or model.spec.weights.storage != "bind":
        return explicit
    return "prefetch"


def vllm_args(model: ModelConfig, host: str = "127.0.0.1", topology_args: tuple[str, ...] = ()) -> list[str]:
    """The command after the image's `vllm serve` entrypoint: the model path first. `host`: the rig's
    serve_address (0.0.0.0 only with an API key; rigkit.config.loader checks). `topology_args`: what
    the topology preflight adds for a model spanning GPUs (rigkit.topology), before the catalog's own
    extra_args (one the catalog already gives is not repeated)."""
    spec, v = model.spec, model.spec.vllm
    if model.on_demand:  # behind rigkit-ondemand's front, which has the model's own port (docs/on-demand.md)
        host = "127.0.0.1"
    args = [
        container_model_path(model),
        "--host", host,
        "--port", str(model.engine_port),
        "--served-model-name", served_name(model),
        "--tensor-parallel-size", str(spec.parallel.tensor),
        "--pipeline-parallel-size", str(spec.parallel.pipeline),
        "--data-parallel-size", str(spec.parallel.data),
        "--dtype", v.dtype,
        "--gpu-memory-utilization", str(v.gpu_memory_utilization),
        "--enable-prefix-caching" if v.enable_prefix_caching else "--no-enable-prefix-caching",
    ]
    if v.quantization:
        args += ["--quantization", v.quantization]
    if v.kv_cache_dtype != "auto":
        args += ["--kv-cache-dtype", v.kv_cache_dtype]
    if v.max_model_len:
        args += ["--max-model-len", str(v.max_model_len)]
    if v.enforce_eager:
        args.append("--enforce-eager")
    if v.speculative:
        config = {"method": v.speculative.method, "num_speculative_tokens": v.speculative.num_speculative_tokens}
        if v.speculative.model:
            config["model"] = v.speculative.model
        for key in ("prompt_lookup_max", "prompt_lookup_min"):
            if getattr(v.speculative, key) is not None:
                config[key] = getattr(v.speculative, key)
        args += ["--speculative-config", json.dumps(config, separators=(",", ":"))]
    if v.reasoning_parser:
        args += ["--reasoning-parser", v.reasoning_parser]
    if v.tool_call_parser:
        args += ["--enable-auto-tool-choice", "--tool-call-parser", v.tool_call_parser]
    if strategy := load_strategy(model):
        args += ["--safetensors-load-strategy", strategy]
    if model.on_demand and model.on_demand.swap == "sleep":
        args.append("--enable-sleep-mode")
    args += [a for a in topology_args if a not in v.extra_args]
    return args + list(v.extra_args)


def comment_text(text: str) -> str:
    """`text` safe inside a one-line YAML comment: every control character and YAML line break
    (a catalog folder named with a newline would otherwise start a key) written as its escape."""
    return re.sub(r"[\x00-\x1f\x7f\x85\u2028\u2029]", lambda m: repr(m.group())[1:-1], text)


# vLLM's workers open torch.distributed's Gloo sockets (and, across GPUs, NCCL's bootstrap) on the address
# the host's name resolves to: with host networking, the rig's LAN address. A scan of a rig from the LAN
# found twelve such ports of one engine (VLLM::Worker, 10.199.8.2:33000-47000, tests/test_surface_scan.py),
# open to every host whatever the firewall said of the API port. A rig is one node: they belong on lo.
# The catalog's `env` may still set them (a model spread over rigs is not rigkit's).
NODE_LOCAL_ENV = {"GLOO_SOCKET_IFNAME": "lo", "NCCL_SOCKET_IFNAME": "lo", "VLLM_HOST_IP": "127.0.0.1"}


COMPILE_CACHE_PATH = "/var/cache/rigkit-vllm"  # VLLM_CACHE_ROOT in the container, whoever vLLM runs as

# vLLM wants a config file's name to end in .yaml; Compose copies the secret to /run/secrets/<target>.
ACCEPTED_KEYS_SECRET = "vllm-api-keys.yaml"


def render_compose(model: ModelConfig, with_api_key: bool, env_file: str = SECRETS_ENV_FILE,
                   host: str = "127.0.0.1", publish: bool = False, topology_args: tuple[str, ...] = (),
                   topology_env: dict[str, str] | None = None, accepted_keys: bool = False) -> str:
    """`env_file`: where the rig keeps the API key's env file (a Windows rig: under C:\\ProgramData\\rigkit).
    `host`: the address the API is reached on (the rig file's `serve_address`). `publish` (Windows rigs):
    the port published on `host` instead of host networking, vLLM listening inside on 0.0.0.0.
    `topology_args`/`topology_env`: what the topology preflight sets for a model spanning GPUs without
    usable P2P (--disable-custom-all-reduce, NCCL_P2P_DISABLE=1); the catalog's `env` wins where both
    name a variable (docs/topology.md).
    `accepted_keys`: during a key rotation, vLLM takes every accepted key from the rig's root-only config
    file (ACCEPTED_KEYS_FILE, through a Compose secret) instead of the one key of the env file. Which of them
    rigkit sends is not in it, so swapping them restarts nothing."""
    spec = model.spec
    # Published (Windows): the container has a network of its own, where nothing but the port is reached.
    node_local = {} if publish else NODE_LOCAL_ENV
    # Sleep mode's routes are vLLM's development routes; the engine listens on loopback, behind the front.
    sleep_mode = {"VLLM_SERVER_DEV_MODE": "1"} if model.on_demand and model.on_demand.swap == "sleep" else {}
    environment = {"VLLM_ENGINE_READY_TIMEOUT_S": str(spec.ready_timeout_s), "VLLM_CACHE_ROOT": COMPILE_CACHE_PATH,
                   **node_local, **(topology_env or {}), **spec.env, **sleep_mode}
    if spec.weights.storage == "volume":
        mount = {"type": "volume", "source": "weights", "target": container_model_path(model), "read_only": True}
        volumes = {"weights": {"external": True, "name": volume_name(model)}}
    else:
        mount = {"type": "bind", "source": spec.weights.source, "target": container_model_path(model), "read_only": True}
        volumes = {}
    # vLLM's cache (compiled graphs, keyed by vLLM itself) outlives the container: a redeploy, a rollback, a
    # reboot start warm where vLLM can load what it compiled (docs/serving.md, "Time to ready").
    volumes["compile_cache"] = {"name": compile_cache_volume(model)}
    cache = {"type": "volume", "source": "compile_cache", "target": COMPILE_CACHE_PATH}
    return render(
        "serving/compose.yml.j2",
        model_file=comment_text(str(model.file)),
        project=project_name(model),
        engine_service=ENGINE_SERVICE,
        image=spec.image,
        on_demand=bool(model.on_demand),
        command=vllm_args(model, "0.0.0.0" if publish else host, topology_args)
        + (["--config", f"/run/secrets/{ACCEPTED_KEYS_SECRET}"] if accepted_keys else []),
        # host:port:port, TCP; Compose's long syntax would need a separate `host_ip`.
        published=[f"{host}:{spec.port}:{spec.port}"] if publish else [],
        environment=environment,
        # raw: Compose neither interpolates `$` nor strips quotes or `#` in the key.
        env_files=[{"path": env_file, "format": "raw"}] if with_api_key and not accepted_keys else [],
        # Taken from the environment of the rig's compose commands (rigside.keyfile.compose_env) and copied into
        # the container, readable by root only: a file secret would be a bind mount of the rig's disk.
        secrets={"vllm_api_keys": {"environment": ACCEPTED_KEYS_ENV}} if accepted_keys else {},
        secret_mounts=[{"source": "vllm_api_keys", "target": ACCEPTED_KEYS_SECRET, "mode": 0o400}] if accepted_keys else [],
        mounts=[mount, cache],
        volumes=volumes,
        device_ids=[str(i) for i in spec.gpus],
        memory_limit=f"{spec.memory_limit_gb}g" if spec.memory_limit_gb else None,
        windows_mount=spec.weights.storage == "bind" and is_windows_path(spec.weights.source),
    )


def stack_settings(model: ModelConfig, with_api_key: bool) -> str:
    """What the rig-side helper needs to judge readiness (JSON)."""
    return json.dumps(
        {
            "project": project_name(model),
            "port": model.engine_port,
            "served_model_name": served_name(model),
            "ready_timeout_s": model.spec.ready_timeout_s,
            "api_key_env_file": SECRETS_ENV_FILE if with_api_key else None,
        },
        indent=2,
    ) + "\n"
