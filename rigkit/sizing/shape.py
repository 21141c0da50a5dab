"""What a model's config.json says of its KV cache: layers, KV heads and head size (or DeepSeek's latent
attention), its dtype and its longest context. Pure."""

from __future__ import annotations

from dataclasses import dataclass

DTYPE_BYTES = {"float32": 4, "float": 4, "bfloat16": 2, "float16": 2, "half": 2}
# The keys of a config.json (and of its text_config) the arithmetic reads: all a rig sends back (rigkit.fit.facts).
KEYS = ("num_hidden_layers", "num_attention_heads", "num_key_value_heads", "hidden_size", "head_dim", "torch_dtype",
        "dtype", "max_position_embeddings", "kv_lora_rank", "qk_rope_head_dim", "sliding_window", "layer_types",
        "use_sliding_window", "rope_scaling", "rope_parameters", "model_type", "layers_block_type",
        "hybrid_override_pattern", "num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts")
# RoPE types whose factor vLLM 0.32 does not apply to max_position_embeddings (config/model.py,
# _get_and_verify_max_len: YaRN's is already scaled, llama3's and longrope's are the model's own).
UNSCALED_ROPE = ("su", "longrope", "llama3", "yarn", "deepseek_yarn", "deepseek_llama_scaling")


@dataclass(frozen=True)
class ModelShape:
    layers: int
    kv_heads: int
    head_dim: int
    dtype_bytes: int  # of the checkpoint's dtype: vLLM's "auto" keeps it
    max_position: int | None  # the longest context the model was made for (vLLM's derived max_model_len)
    latent_dim: int | None = None  # latent attention (MLA): one latent of this size per layer and token
    # Some layers keep a window only (sliding attention) or no KV cache at all (linear attention, Mamba): the KV
    # figure here, every layer keeping the whole context, is an upper bound.
    upper_bound: bool = False
    scaled_context: bool = False  # RoPE scaling: max_position follows vLLM 0.32's rule, which versions change


def _int(value) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def model_shape(config: dict) -> ModelShape | None:
    """The shape, or None where config.json does not give the layer and head counts (then only weights count)."""
    text = config.get("text_config") if isinstance(config.get("text_config"), dict) else config
    layers, heads = _int(text.get("num_hidden_layers")), _int(text.get("num_attention_heads"))
    if layers is None or heads is None:
        return None
    kv_heads = _int(text.get("num_key_value_heads")) or heads
    head_dim = _int(text.get("head_dim")) or ((_int(text.get("hidden_size")) or 0) // heads)
    if not head_dim:
        return None
    dtype = text.get("torch_dtype") or text.get("dtype") or config.get("torch_dtype") or "bfloat16"
    latent = None
    if _int(text.get("kv_lora_rank")):
        latent = text["kv_lora_rank"] + (_int(text.get("qk_rope_head_dim")) or 0)
    kinds = " ".join(str(t) for t in text.get("layer_types") or []) + " " + \
        " ".join(str(t) for t in text.get("layers_block_type") or [])
    upper = bool(text.get("use_sliding_window")) or any(k in kinds for k in ("sliding", "linear", "mamba")) or \
        bool(text.get("hybrid_override_pattern"))
    upper = upper or (bool(_int(text.get("sliding_window"))) and "use_sliding_window" not in text)
    context, scaled = max_context(text, config)
    return ModelShape(layers, kv_heads, head_dim, DTYPE_BYTES.get(str(dtype), 2), context, latent, upper, scaled)


def max_context(text: dict, config: dict) -> tuple[int | None, bool]:
    """(vLLM 0.32's derived max_model_len from max_position_embeddings and RoPE scaling, whether RoPE scaling was
    in it). A factor applies except for the RoPE types of UNSCALED_ROPE, and never for Gemma 3."""
    base = _int(text.get("max_position_embeddings")) or _int(config.get("max_position_embeddings"))
    rope = text.get("rope_scaling") or text.get("rope_parameters") or config.get("rope_scaling")
    if base is None or not isinstance(rope, dict):
        return base, False
    kind = rope.get("rope_type") or rope.get("type")
    factor = rope.get("factor")
    model_type = str(text.get("model_type") or config.get("model_type") or "")
    if kind not in UNSCALED_ROPE and "gemma3" not in model_type and isinstance(factor, (int, float)) and factor > 0:
        return int(base * factor), True
    return base, True


def is_moe(config: dict) -> bool:
    """A mixture of experts: each token reads only its routed experts, not the whole checkpoint."""
    text = config.get("text_config") if isinstance(config.get("text_config"), dict) else config
    keys = ("num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts")
    return any(_int(side.get(k)) and side.get(k) > 1 for side in (text, config) for k in keys)


def loaded_dtype_bytes(shape: ModelShape, dtype: str) -> int:
    """Bytes of one weight or KV element as vLLM holds it: the catalog's dtype, else ("auto") the checkpoint's, but
    16-bit for a float32 checkpoint (vLLM's auto loads those as float16)."""
    if dtype != "auto":
        return DTYPE_BYTES.get(dtype, 2)
    return min(shape.dtype_bytes, 2)


def kv_bytes_per_token(shape: ModelShape, dtype: str, kv_cache_dtype: str, tensor: int, pipeline: int) -> int:
    """KV cache bytes one token takes on one GPU: K and V of each layer this GPU holds (pipeline stages split the
    layers, tensor ranks the KV heads, a head never split: fewer heads than ranks are copied), or MLA's one latent
    (every rank keeps it whole). `dtype`, `kv_cache_dtype`: the catalog's vllm fields (loaded_dtype_bytes)."""
    element = 1 if kv_cache_dtype.startswith("fp8") else loaded_dtype_bytes(shape, dtype)
    layers = -(-shape.layers // pipeline)
    if shape.latent_dim:
        return layers * shape.latent_dim * element
    return 2 * layers * max(1, shape.kv_heads // tensor) * shape.head_dim * element
