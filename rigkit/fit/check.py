"""Each model of a rig against its GPUs (rigkit.sizing.memory): from what the rig says (config.json and the weights'
bytes in the folder vLLM loads, each GPU's memory as nvidia-smi reports it) at deploy, from the catalog's
`weight_bytes` and the GPU table in `rigkit check`. Pure, but for the one read it names (`shapes_reads`)."""

from __future__ import annotations

from rigkit.config import gpu_models
from rigkit.config.schema import ModelConfig, RigConfig
from rigkit.fit.facts import ModelShapes
from rigkit.sizing.memory import GIB, Fit, fit
from rigkit.sizing.shape import loaded_dtype_bytes, model_shape
from rigkit.sizing.variant import variant_problems
from rigkit.rigside.names import volume_name

MIB = 1024**2


def model_files(model: ModelConfig) -> tuple[str, str]:
    """Where on the rig vLLM's weights come from: ("folder", the model's source folder, copied onto its volume or
    bind-mounted), or ("volume", its volume) for weights from another rig, whose folder is read once they are
    there (a first deploy reads nothing: the next one reckons them)."""
    if model.spec.weights.from_rig is not None:
        return "volume", volume_name(model)
    return "folder", model.spec.weights.source


def shapes_reads(rig: RigConfig) -> list:
    places = tuple((m.name, *model_files(m)) for m in rig.models)
    return [(ModelShapes, {"places": places})] if places and rig.spec.os == "linux" else []


def held_weights(model: ModelConfig, file_bytes: int, config: dict) -> tuple[int, bool]:
    """(the weights' bytes as vLLM holds them on the GPUs, whether that is sure): an unquantized checkpoint is cast
    to the dtype it is served in (a float32 one to 16 bits under dtype auto, half its files); one the catalog
    quantizes as it loads (a quantization its config.json does not name) holds an unknown share of them."""
    shape = model_shape(config) if config else None
    if shape is not None and not config.get("quant_method"):
        file_bytes = file_bytes * loaded_dtype_bytes(shape, model.spec.vllm.dtype) // shape.dtype_bytes
    asked = model.spec.vllm.quantization
    return file_bytes, not asked or asked == config.get("quant_method")


def model_fit(model: ModelConfig, rig: RigConfig, answer: dict, memory_mib: dict[int, int]) -> Fit | None:
    """`answer`: ModelShapes' for the model ({} offline); `memory_mib`: {GPU index: total memory} as the rig
    reports it ({} offline: the rig file's GPU models from the table). None where nothing is known."""
    spec = model.spec
    config = answer.get("config") if isinstance(answer.get("config"), dict) else {}
    if answer.get("weights_bytes"):
        weights, sure = held_weights(model, answer["weights_bytes"], config)
    else:
        weights, sure = spec.weight_bytes, True  # the catalog's: as the GPU holds them
    by_index = {g.index: g for g in rig.spec.gpus}
    sizes = []
    for index in spec.gpus:
        if memory_mib.get(index):
            sizes.append((memory_mib[index] * MIB, by_index[index].model if index in by_index else f"GPU {index}"))
        elif index in by_index and (info := gpu_models.lookup(by_index[index].model)):
            sizes.append((info.memory_gib * GIB, info.name))
    if not weights or len(sizes) != len(spec.gpus):
        return None
    memory, name = min(sizes)
    allowed = spec.env.get("VLLM_ALLOW_LONG_MAX_MODEL_LEN", "0").strip().lower() not in ("", "0", "false")
    return fit(model.name, weights, name, memory, spec.vllm.gpu_memory_utilization, spec.parallel.tensor,
               spec.parallel.pipeline, model_shape(config) if config else None, spec.vllm.max_model_len,
               spec.vllm.dtype, spec.vllm.kv_cache_dtype, sure=sure, long_context_allowed=allowed)


def rig_fits(rig: RigConfig, answers: dict, memory_mib: dict[int, int]) -> list[Fit]:
    """Every model's fit that can be reckoned, in the rig's order."""
    return [found for m in rig.models if (found := model_fit(m, rig, answers.get(m.name) or {}, memory_mib))]


def shared_gpu_problems(rig: RigConfig) -> list[str]:
    """Models sharing a GPU (shared_gpus) each take their gpu_memory_utilization of all of it: together at most 1.
    On-demand models take turns (docs/on-demand.md): the models always loaded with each one of them at most 1."""
    problems = []
    for index in sorted({i for m in rig.models for i in m.spec.gpus}):
        resident = [m for m in rig.models if index in m.spec.gpus and not m.on_demand]
        turns = [[m] for m in rig.models if index in m.spec.gpus and m.on_demand] or [[]]
        for on in ([*resident, *turn] for turn in turns):
            total = sum(m.spec.vllm.gpu_memory_utilization for m in on)
            if len(on) > 1 and total > 1.0:
                shares = " + ".join(f"{m.name} {m.spec.vllm.gpu_memory_utilization:g}" for m in on)
                problems.append(f"GPU {index}: {shares} = {total:g} of its memory; models sharing a GPU must ask for "
                                "at most 1 together (the second would not start); lower their gpu_memory_utilization")
    return problems


def variant_findings(rig: RigConfig, answers: dict, caps: dict[int, tuple[int, int] | None]) -> list[str]:
    """Each model whose quantization its GPUs cannot run: the catalog's vllm.quantization, else what config.json
    says (vLLM's own choice then); `caps`: {GPU index: compute capability} as the rig reports it ({} offline: the
    rig file's GPU models from the table)."""
    by_index = {g.index: g for g in rig.spec.gpus}
    problems = []
    for model in rig.models:
        config = (answers.get(model.name) or {}).get("config") or {}
        method = model.spec.vllm.quantization or config.get("quant_method")
        gpus = []
        for index in model.spec.gpus:
            name = by_index[index].model if index in by_index else f"GPU {index}"
            info = gpu_models.lookup(name)
            gpus.append((index, name, caps.get(index) or (info.compute_capability if info else None)))
        problems += variant_problems(model.name, method, gpus)
    return problems
