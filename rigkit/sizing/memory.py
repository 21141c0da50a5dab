"""The arithmetic of a fit, per GPU, and what would fit instead. Pure.

vLLM takes `gpu_memory_utilization` of each GPU's total memory for one instance: its weights, the peak of
its activations and what is not torch's (the CUDA context, NCCL's buffers), measured at start, and the KV
cache in what is left. It refuses to start where that KV cache cannot hold one sequence of max_model_len
("To serve at least one request with the models's max seq len ..."), after minutes of loading. So a deploy
asks first: the weights' share on each GPU, plus RESERVE_GIB for the rest, plus one sequence's KV cache.
"""

from __future__ import annotations

from dataclasses import dataclass

from rigkit.sizing.shape import ModelShape, kv_bytes_per_token

GIB = 1024**3
# The CUDA context, activations' peak and NCCL's buffers, which vLLM measures at start: an estimate that
# errs low, so a refusal is sure (an 8B model at its default batch takes about 1-2 GiB there).
RESERVE_GIB = 1.0
BLOCK_TOKENS = 16  # vLLM's KV block: a context that fits is said as a multiple of it


@dataclass(frozen=True)
class Fit:
    """One model on its GPUs: `problems` (it would not start), `warnings`, and `summary` (one line)."""

    problems: list[str]
    warnings: list[str]
    summary: str


def _gib(count: float) -> str:
    return f"{count / GIB:.1f} GiB"


def _per_token(count: int) -> str:
    return f"{count // 1024} KiB" if count >= 10 * 1024 else f"{count} bytes"


def fit(name: str, weights_bytes: int, gpu_name: str, gpu_memory_bytes: int, utilization: float, tensor: int,
        pipeline: int, shape: ModelShape | None, max_model_len: int | None, dtype: str = "auto",
        kv_cache_dtype: str = "auto", sure: bool = True, long_context_allowed: bool = False) -> Fit:
    """`weights_bytes`: as vLLM holds them (rigkit.fit.check.held_weights); `gpu_memory_bytes`: the smallest of the
    model's GPUs; `max_model_len`: the catalog's (None: the model's own, from its shape); `dtype`,
    `kv_cache_dtype`: the catalog's vllm fields. `sure`: False where the weights' bytes are a guess (quantized
    at load): what would be refused is then a warning. `long_context_allowed`: VLLM_ALLOW_LONG_MAX_MODEL_LEN set."""
    gpus = tensor * pipeline
    budget = gpu_memory_bytes * utilization
    usable = budget - RESERVE_GIB * GIB
    weights = weights_bytes / gpus
    given = (f"each {gpu_name} gives vLLM {_gib(budget)} ({_gib(gpu_memory_bytes)} x gpu_memory_utilization "
             f"{utilization:g}), less ~{RESERVE_GIB:g} GiB for its CUDA context and activations")
    problems, warnings = [], []

    def refuse(line: str, unsure: bool, why: str) -> None:
        if unsure:
            warnings.append(line.replace(": ", ": perhaps; ", 1) + f" ({why})")
        else:
            problems.append(line)

    guess = "its weights are quantized as it loads them, so their size on the GPU is a guess"
    if weights > usable:
        need = next((n for n in (1, 2, 4, 8) if weights_bytes / n <= usable * 0.8), None)
        instead = (f"tensor parallel over {need} GPUs" if need and need > gpus else "more GPUs") + \
            ", or a smaller variant (a 4-bit one is about a quarter of 16-bit weights)"
        refuse(f"{name}: its weights are {_gib(weights_bytes)}, {_gib(weights)} per GPU over {gpus}; {given}: "
               f"they do not fit. Use {instead}", not sure, guess)
        return Fit(problems, warnings, f"{name}: does not fit" if problems else
                   f"{name}: weights {_gib(weights)} per GPU, perhaps more than fits")
    room = usable - weights
    if shape is None:
        return Fit([], [], f"{name}: weights {_gib(weights)} per GPU, {_gib(room)} left for the KV cache "
                           "(config.json gives no layer counts: its KV cache is not reckoned)")
    context = max_model_len or shape.max_position
    per_token = kv_bytes_per_token(shape, dtype, kv_cache_dtype, tensor, pipeline)
    if max_model_len and shape.max_position and max_model_len > shape.max_position and not long_context_allowed:
        line = (f"{name}: max_model_len {max_model_len} is longer than the model's own context ({shape.max_position}, "
                "from config.json's max_position_embeddings" + (" and RoPE scaling" if shape.scaled_context else "")
                + "); vLLM refuses it at start unless VLLM_ALLOW_LONG_MAX_MODEL_LEN=1 is in the model's env")
        refuse(line, shape.scaled_context, "vLLM's rule for RoPE scaling changes between versions; this is 0.32's")
    tokens = int(room // per_token)
    if context is None:
        return Fit(problems, warnings, f"{name}: weights {_gib(weights)} per GPU, KV cache room for {tokens} tokens")
    one_sequence = per_token * context
    if one_sequence > room:
        fits = tokens // BLOCK_TOKENS * BLOCK_TOKENS
        which = "max_model_len" if max_model_len else "its own context (max_model_len unset)"
        fp8 = "" if kv_cache_dtype.startswith("fp8") else ", kv_cache_dtype fp8 (half the KV cache)"
        shorter = f"max_model_len {fits} or less{fp8}, or more GPUs" if fits else "more GPUs or a smaller variant"
        line = (f"{name}: one sequence of {which} {context} needs {_gib(one_sequence)} of KV cache per GPU "
                f"({_per_token(per_token)} a token); {given}, and the weights take {_gib(weights)}: {_gib(room)} is "
                f"left. Use {shorter}")
        # The estimate keeps the whole context in every layer: an upper bound for windowed or linear layers.
        refuse(line, shape.upper_bound or not sure,
               "some of its layers keep a window or no KV cache at all, so vLLM may need less" if shape.upper_bound
               else guess)
    summary = (f"{name}: weights {_gib(weights)} per GPU, KV cache room {_gib(room)}: {tokens} tokens, "
               f"{tokens / context:.1f} sequences of {context}")
    return Fit(problems, warnings, summary)
