"""What a model's config.json says of its KV cache: layers, KV heads and head size (or DeepSeek's latent
attention), its dtype and its longest context. Pure."""

from __future__ import annotations

from dataclasses import dataclass

DTYPE_BYTES = {"float32": 4, "float": 4, "bfloat16": 2, "float16": 2, "half": 2}
# The keys of a config.json (and of its text_config) the arithmetic reads: all a rig sends back (rigkit.fit.facts).
KEYS = ("num_hidden_layers", "num_attention_heads", "num_key_value_heads", "hidden_size", "head_dim", "torch_dtype",
        "dtype", "max_position_embeddings", "kv_lora_rank", "qk_rope_head_dim", "sliding_window", "layer_types",
        "use_sliding_window")


@dataclass(frozen=True)
class ModelShape:
    layers: int
    kv_heads: int
    head_dim: int
    dtype_bytes: int  # of the checkpoint's dtype: vLLM's "auto" keeps it
    max_position: int | None  # the longest context the model was made for (vLLM's derived max_model_len)
    latent_dim: int | None = None  # latent attention (MLA): one latent of this size per layer and token
    windowed: bool = False  # some layers keep a window only: the KV figure here is an upper bound


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
    windowed = bool(text.get("use_sliding_window")) or any("sliding" in str(t) for t in text.get("layer_types") or [])
    windowed = windowed or (bool(_int(text.get("sliding_window"))) and "use_sliding_window" not in text)
    return ModelShape(layers, kv_heads, head_dim, DTYPE_BYTES.get(str(dtype), 2),
                      _int(text.get("max_position_embeddings")) or _int(config.get("max_position_embeddings")),
                      latent, windowed)


def kv_bytes_per_token(shape: ModelShape, dtype: str, kv_cache_dtype: str, tensor: int, pipeline: int) -> int:
    """KV cache bytes one token takes on one GPU: K and V of each layer this GPU holds (pipeline stages split the
    layers, tensor ranks the KV heads, a head never split: fewer heads than ranks are copied), or MLA's one latent
    (every rank keeps it whole). `dtype`, `kv_cache_dtype`: the catalog's vllm fields ("auto": the checkpoint's)."""
    element = 1 if kv_cache_dtype.startswith("fp8") else DTYPE_BYTES.get(dtype, shape.dtype_bytes)
    layers = -(-shape.layers // pipeline)
    if shape.latent_dim:
        return layers * shape.latent_dim * element
    return 2 * layers * max(1, shape.kv_heads // tensor) * shape.head_dim * element
