"""Checks on a rig's serving config before anything is rendered. Pure functions.

Errors stop the deploy before any rig is touched; warnings are printed and the
deploy goes on. Every message says why, with the field notes' numbers.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING

from rigkit.config import gpu_models as gpu_table
from rigkit.config.errors import Problem
from rigkit.config.paths import is_windows_path

if TYPE_CHECKING:
    from rigkit.config.schema import ModelConfig, RigSpec

GIB = 1024**3
WEIGHTS_FIT_SHARE = 0.70  # weights this share of one card's memory leave room for the KV cache

# Flags rigkit renders from first-class catalog fields: never in extra_args.
FIRST_CLASS_FLAGS = {
    "--dtype": "vllm.dtype",
    "--quantization": "vllm.quantization", "-q": "vllm.quantization",
    "--kv-cache-dtype": "vllm.kv_cache_dtype",
    "--max-model-len": "vllm.max_model_len",
    "--gpu-memory-utilization": "vllm.gpu_memory_utilization",
    "--enable-prefix-caching": "vllm.enable_prefix_caching",
    "--no-enable-prefix-caching": "vllm.enable_prefix_caching",
    "--enforce-eager": "vllm.enforce_eager",
    "--speculative-config": "vllm.speculative",
    "--served-model-name": "vllm.served_model_name",
    "--reasoning-parser": "vllm.reasoning_parser",
    "--tool-call-parser": "vllm.tool_call_parser",
    "--safetensors-load-strategy": "vllm.safetensors_load_strategy",
    "--tensor-parallel-size": "parallel.tensor", "-tp": "parallel.tensor",
    "--pipeline-parallel-size": "parallel.pipeline", "-pp": "parallel.pipeline",
    "--data-parallel-size": "parallel.data", "-dp": "parallel.data",
    "--port": "port",
    "--host": "serve_address in the rig file",
    "--api-key": "the rig's api_key_file (a key on a command line leaks into logs)",
}

# Other `vllm serve` options rigkit passes through from extra_args.
KNOWN_EXTRA_FLAGS = frozenset("""
--max-num-seqs --max-num-batched-tokens --enable-chunked-prefill --no-enable-chunked-prefill
--trust-remote-code --enable-auto-tool-choice --chat-template --chat-template-content-format
--limit-mm-per-prompt --mm-processor-kwargs --swap-space --cpu-offload-gb --block-size --seed
--disable-log-requests --enable-log-requests --disable-log-stats --max-logprobs --tokenizer
--tokenizer-mode --revision --load-format --hf-overrides --rope-scaling --generation-config
--override-generation-config --compilation-config -O --async-scheduling --enable-expert-parallel
--max-seq-len-to-capture --cuda-graph-sizes --max-cudagraph-capture-size --disable-custom-all-reduce
--distributed-executor-backend --uvicorn-log-level --kv-transfer-config --scheduling-policy
--mm-encoder-tp-mode --disable-cascade-attn --enable-sleep-mode --calculate-kv-scales
--default-chat-template-kwargs --enable-prompt-tokens-details --allowed-local-media-path
--max-num-partial-prefills --long-prefill-token-threshold --kv-cache-memory-bytes
""".split())

def serving_findings(rig: RigSpec, rig_file: Path, models: list[ModelConfig]) -> tuple[list[Problem], list[str]]:
    errors: list[Problem] = []
    warnings: list[str] = []
    for model in models:
        _check_model(rig, rig_file, model, errors, warnings)
    _check_shared(models, errors)
    return errors, warnings


def _check_model(rig, rig_file, model, errors, warnings) -> None:
    spec, vllm = model.spec, model.spec.vllm

    def error(field, value, message):
        errors.append(Problem(model.file, field, value, message))

    def warn(message):
        warnings.append(f"{model.name}: {message}")

    if vllm.speculative and vllm.dtype in ("half", "float16"):
        error("vllm.dtype", vllm.dtype,
              "half precision with speculative decoding: a bfloat16 drafter then accepts nothing, silently "
              "(mean acceptance length 1.00, about 3x slower). Use bfloat16 or auto")
    if spec.weights.from_rig is not None:
        if rig.os == "windows":
            error("weights.source", str(spec.weights.source), "weights from another rig are copied only onto Linux "
                  "rigs (the relay runs `docker run -i` in the rig's shell); give the folder on this rig")
    elif spec.weights.hub is not None and (rig.os == "windows" or spec.weights.storage != "volume"):
        why = ("Windows rigs keep volumes in Docker Desktop's VM; give the snapshot folder on this rig" if rig.os ==
               "windows" else "weights from the hub are proven by their copy onto a volume; use storage: volume")
        error("weights.hub", str(spec.weights.hub), f"downloaded on Linux rigs onto volumes only: {why}")
    elif spec.weights.hub is not None and rig.hub_token_file and not re.match(
            r"^https://|^http://(127\.\d+\.\d+\.\d+|localhost|\[::1\])(:\d+)?$", spec.weights.hub.endpoint):
        error("weights.hub.endpoint", spec.weights.hub.endpoint, "the rig's hub token (hub_token_file) would cross "
              "the network unencrypted: use https (plain http only on the rig's own loopback)")
    elif rig.os == "windows" and spec.weights.storage == "volume" and re.search(r'[,"\x00-\x1f]', spec.weights.source):
        # The copy's check passes the source to `docker.exe run --mount source=...`, a comma-separated
        # field; Windows PowerShell 5.1 does not escape a double quote in a native argument.
        error("weights.source", spec.weights.source,
              "a Windows source copied onto a volume may not contain a comma, a double quote or a control character")
    source = spec.weights.source if spec.weights.from_rig is None else "/"
    windows_style = re.match(r"^([A-Za-z]:|\\\\|//)", source)
    if rig.os == "linux" and (windows_style or not source.startswith("/")):
        why = "a Windows path" if windows_style else "a relative path"
        error("weights.source", source, f"{why} on a Linux rig; give the folder's absolute path on the rig, "
                                        "e.g. /srv/models/qwen3-8b")
    rig_gpus = {g.index: g for g in rig.gpus}
    missing = [i for i in spec.gpus if i not in rig_gpus]
    if missing:
        error("gpus", spec.gpus, f"GPU(s) {missing} are not in {rig_file}, which has GPUs {sorted(rig_gpus)}")
    if len(set(spec.gpus)) != len(spec.gpus):
        error("gpus", spec.gpus, "a GPU is listed more than once")
    par = spec.parallel
    product = par.tensor * par.pipeline * par.data
    if product != len(spec.gpus):
        error("parallel", None,
              f"tensor {par.tensor} x pipeline {par.pipeline} x data {par.data} = {product}, "
              f"but the service has {len(spec.gpus)} GPU(s); the product must equal the GPU count")
    for position, arg in enumerate(vllm.extra_args):
        flag = arg.split("=", 1)[0]
        if not flag.startswith("-") or flag.lstrip("-").replace(".", "").isdigit():
            continue  # a value, not an option
        if flag in FIRST_CLASS_FLAGS:
            error(f"vllm.extra_args[{position}]", arg, f"rigkit renders {flag} itself: set {FIRST_CLASS_FLAGS[flag]} instead")
        elif flag not in KNOWN_EXTRA_FLAGS:
            error(f"vllm.extra_args[{position}]", arg,
                  "not a `vllm serve` option rigkit knows (a typo?); an unknown option stops vLLM at start")

    service_gpus = [rig_gpus[i] for i in spec.gpus if i in rig_gpus]
    if vllm.enforce_eager or "--enforce-eager" in vllm.extra_args:
        warn("--enforce-eager disables CUDA graphs; a leftover --enforce-eager once cost 7x decode speed")
    if spec.weights.storage == "bind" and spec.weights.from_rig is None and is_windows_path(spec.weights.source):
        if vllm.safetensors_load_strategy not in (None, "prefetch"):
            warn(f"weights are bind-mounted from Windows path {spec.weights.source} with "
                 f"safetensors_load_strategy {vllm.safetensors_load_strategy}: use prefetch (1028 s -> 756 s) "
                 "or better weights.storage: volume (763 s -> 203 s)")
        else:
            warn(f"weights are bind-mounted from Windows path {spec.weights.source}: loading through 9P took "
                 "763 s where a Docker volume took 203 s; consider weights.storage: volume")
    infos = [gpu_table.lookup(g.model) for g in service_gpus]
    if par.tensor > 1 and spec.weight_bytes and infos and all(infos):
        smallest = min(i.memory_gib for i in infos)
        if spec.weight_bytes <= WEIGHTS_FIT_SHARE * smallest * GIB:
            warn(f"tensor parallel {par.tensor} for {spec.weight_bytes / GIB:.1f} GiB of weights that fit on one "
                 f"{smallest} GiB card: replicas or data parallel give more throughput (4 replicas 3425 tok/s vs "
                 "TP4 1007); tensor parallel only wins single-stream latency")
    is_fp8 = (vllm.quantization or "").lower() in ("fp8", "fbgemm_fp8") or "fp8" in str(spec.weights.source).lower()
    if is_fp8 and any(gpu_table.has_native_fp8(g.model) is False for g in service_gpus):
        warn("FP8 weights on Ampere run as W8A16 through Marlin: no faster math and twice the bytes of 4-bit; "
             "an AWQ/GPTQ 4-bit checkpoint decodes faster")
    if vllm.gpu_memory_utilization > 0.95:
        warn(f"gpu_memory_utilization {vllm.gpu_memory_utilization} leaves under 5% for the CUDA context and "
             "activations; out-of-memory at start or under load is likely")


def _check_shared(models, errors) -> None:
    for n, model in enumerate(models):
        for other in models[:n]:
            if model.spec.port == other.spec.port:
                errors.append(Problem(model.file, "port", model.spec.port, f"port {model.spec.port} is also used by {other.name}"))
            shared = sorted(set(model.spec.gpus) & set(other.spec.gpus))
            # Two on-demand models share GPUs by taking turns (rigkit-ondemand loads one at a time where both do
            # not fit: rigkit.ondemand.plan.conflicts).
            if shared and not (model.spec.shared_gpus and other.spec.shared_gpus) and not (model.on_demand and other.on_demand):
                errors.append(Problem(
                    model.file, "gpus", model.spec.gpus,
                    f"GPU(s) {shared} are also used by {other.name}; two servers on one GPU fight over its memory. "
                    "If that is intended, set shared_gpus: true in both",
                ))
