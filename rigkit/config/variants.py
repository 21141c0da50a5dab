"""Which of a catalog's variants of a model a rig serves (docs/serving.md, "Variants"): the first, in the
catalog's order, whose quantization the rig's GPUs can run (rigkit.sizing.variant's floors) and whose weights fit
them (rigkit.sizing.memory), reckoned from the rig file alone (its GPU models from the table, the variant's
weight_bytes), so every command that reads the rig file serves the same one. The deploy's preflight then judges
the chosen one again from what the rig reports (rigkit.fit: its GPUs, the files' config.json)."""

from __future__ import annotations

from dataclasses import replace

from rigkit.config import gpu_models
from rigkit.config.schema import ModelConfig, RigSpec
from rigkit.sizing.memory import GIB, fit
from rigkit.sizing.variant import variant_problems


def offline_problems(rig_spec: RigSpec, model: ModelConfig) -> list[str]:
    """Why the rig file's GPUs could not serve `model` as its catalog gives it: its quantization below their
    floor, or its weight_bytes more than they hold (none where the table does not know a GPU)."""
    spec, by_index = model.spec, {g.index: g for g in rig_spec.gpus}
    gpus = []
    for index in spec.gpus:
        name = by_index[index].model if index in by_index else f"GPU {index}"
        gpus.append((index, name, gpu_models.lookup(name)))
    problems = variant_problems(model.name, spec.vllm.quantization,
                                [(i, name, info.compute_capability if info else None) for i, name, info in gpus])
    known = [(info.memory_gib * GIB, info.name) for _, _, info in gpus if info]
    if spec.weight_bytes and known and len(known) == len(gpus):
        memory, name = min(known)
        problems += fit(model.name, spec.weight_bytes, name, memory, spec.vllm.gpu_memory_utilization,
                        spec.parallel.tensor, spec.parallel.pipeline, None, spec.vllm.max_model_len,
                        spec.vllm.dtype, spec.vllm.kv_cache_dtype).problems
    return problems


def choose_variant(rig_spec: RigSpec, model: ModelConfig) -> tuple[ModelConfig | None, str]:
    """(the variant chosen, as the model; what was chosen and why not each one before it), or (None, why none)."""
    refused = []
    for name, spec in model.variants:
        candidate = replace(model, spec=spec, variant=name)
        problems = offline_problems(rig_spec, candidate)
        if not problems:
            why = f"; not {'; not '.join(refused)}" if refused else ""
            return candidate, (f"{model.name}: variant {name}, the first of {len(model.variants)} in its catalog "
                               f"that this rig's GPUs run and hold{why}")
        refused.append(f"{name}: {problems[0].removeprefix(f'{model.name}: ')}")
    return None, f"no variant of {model.name} runs on and fits this rig's GPUs: {'; '.join(refused)}"
