"""The decode speed the GPUs' memory allows one sequence: every decoded token reads the weights once (each tensor
rank its shard, at once; pipeline stages one after another), so tok/s <= bandwidth x tensor ranks / bytes read
per token. Far below it, the setup is suspect before the GPU (a dense 70B at 4 tok/s against 6.7 was a setup
question: NVIDIA/dgx-spark-playbooks#91; the seeds' arithmetic: 002_2222de799a2f45a0.txt). Pure.

Bytes per token: the catalog's `active_weight_bytes`, else, for a dense model, the weights' bytes the rig reports
(rigkit.fit.facts). A mixture of experts reads only its routed experts: without `active_weight_bytes` it has no
roofline here.
"""

from __future__ import annotations

from rigkit.config import gpu_models
from rigkit.config.schema import ModelConfig, RigConfig
from rigkit.fit.check import held_weights
from rigkit.sizing.shape import is_moe

# Below this share of the roofline, with weights large enough that reading them dominates a step (MEANINGFUL_BYTES:
# tiny models, the tests' and many drafts, are bound by launches, not bytes), verification names the likely causes.
FAR_BELOW_SHARE = 0.25
MEANINGFUL_BYTES = 1024**3


def bytes_per_token(model: ModelConfig, answer: dict) -> int | None:
    """`answer`: rigkit.fit.facts' for the model ({}: none)."""
    if model.spec.active_weight_bytes:
        return model.spec.active_weight_bytes
    config = answer.get("config") if isinstance(answer.get("config"), dict) else {}
    weights = answer.get("weights_bytes")
    if not isinstance(weights, int) or weights <= 0 or is_moe(config):
        return None
    held, sure = held_weights(model, weights, config)
    # Quantized as it loads: the bytes it reads are not its files. Under MEANINGFUL_BYTES, kernel launches bound a
    # step, not the bytes: a 48 MB model's "20,000 tok/s" would say nothing.
    return held if sure and held >= MEANINGFUL_BYTES else None


def roofline_tok_s(rig: RigConfig, model: ModelConfig, answer: dict | None = None) -> float | None:
    """Single-stream decode bound, tok/s; None where the bytes or a GPU's bandwidth are not known."""
    per_token = bytes_per_token(model, answer or {})
    by_index = {g.index: g for g in rig.spec.gpus}
    infos = [gpu_models.lookup(by_index[i].model) for i in model.spec.gpus if i in by_index]
    if not per_token or not infos or not all(infos):
        return None
    return min(i.memory_bandwidth_gb_s for i in infos) * 1e9 * model.spec.parallel.tensor / per_token


def far_below(model: ModelConfig, decode_tok_s: float | None, roof: float | None, answer: dict | None = None) -> str | None:
    """Why a single-stream decode far below the roofline is suspect, or None."""
    per_token = bytes_per_token(model, answer or {})
    if not decode_tok_s or not roof or not per_token or per_token < MEANINGFUL_BYTES or \
            decode_tok_s >= FAR_BELOW_SHARE * roof:
        return None
    causes = ["a power cap or clock lock far below the card's (rigkit status shows both)",
              "weights offloaded to the CPU (--cpu-offload-gb) or read over PCIe"]
    if model.spec.vllm.enforce_eager:
        causes.insert(0, "--enforce-eager (no CUDA graphs: a leftover once cost 7x)")
    if model.spec.vllm.dtype == "float32":
        causes.insert(0, "dtype float32 (twice the bytes of the checkpoint's 16-bit weights)")
    return (f"decode {decode_tok_s:,.1f} tok/s is {decode_tok_s / roof:.0%} of the {roof:,.0f} tok/s its GPUs' "
            f"memory allows one sequence ({per_token / 1e9:.1f} GB read per token); likely: " + "; ".join(causes))
