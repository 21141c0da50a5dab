"""Can the GPU run the checkpoint's quantization at all? vLLM refuses a method below its floor at start ("The
quantization method ... is not supported for the current GPU. Minimum capability: 80. Current capability: 75",
vllm#25022), after the image was pulled and the weights copied. Pure.

The floors are vLLM 0.32.0's: each method's `get_min_capability()` (vllm/model_executor/layers/quantization/,
read in the engine image rigkit's tests build; vllm/config/vllm.py compares it). They move between vLLM
versions, mostly down (fp8 and modelopt_fp4 run through Marlin's weight-only kernels from 7.5); a method not
here is left to vLLM. Above the floor a method may still run slower than its name suggests (fp8 below 8.9 is
W8A16: rigkit.config.lint warns).
"""

from __future__ import annotations

MIN_CAPABILITY = {
    "awq": (7, 5), "auto_awq": (7, 5), "awq_marlin": (7, 5),
    "gptq": (6, 0), "auto_gptq": (6, 0), "gptq_marlin": (6, 0), "inc": (6, 0),
    "fp8": (7, 5), "fbgemm_fp8": (8, 0), "modelopt": (8, 0), "modelopt_fp4": (7, 5), "modelopt_mxfp8": (8, 0),
    "modelopt_mixed": (7, 5), "mxfp4": (8, 0), "gpt_oss_mxfp4": (8, 0), "fp_quant": (10, 0),
    "compressed-tensors": (7, 0), "quark": (7, 0), "moe_wna16": (7, 0), "experts_int8": (8, 0),
    "torchao": (7, 5), "humming": (7, 5),
}
COMMON = ("gptq", "awq", "fp8", "compressed-tensors", "mxfp4")  # what a published variant is most often quantized as


def _cc(cc: tuple[int, int]) -> str:
    return f"{cc[0]}.{cc[1]}"


def variant_problems(name: str, method: str | None, gpus: list[tuple[int, str, tuple[int, int] | None]]) -> list[str]:
    """`method`: the catalog's vllm.quantization, else config.json's quantization_config.quant_method (what vLLM
    uses); `gpus`: (index, name, compute capability or None) of the model's GPUs."""
    floor = MIN_CAPABILITY.get((method or "").lower())
    known = [(i, g, cc) for i, g, cc in gpus if cc is not None]
    if floor is None or not known:
        return []
    index, gpu, cc = min(known, key=lambda g: g[2])
    if cc >= floor:
        return []
    runs = [m for m in COMMON if MIN_CAPABILITY[m] <= cc]
    return [f"{name}: quantization {method} needs compute capability {_cc(floor)} or newer (vLLM 0.32's floor for "
            f"it); GPU {index} ({gpu}) is {_cc(cc)}, so vLLM would refuse it at start. Use a 16-bit variant"
            + (f" or one quantized as {', '.join(runs)}" if runs else "")]
