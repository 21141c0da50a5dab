"""The topology verdicts of a validated rig: one per model whose tensor x pipeline size is
above 1, from its catalog entry's `gpus` and `parallel`. Pure (config objects in, text out)."""

from __future__ import annotations

from rigkit.config.schema import RigConfig
from rigkit.topology.decide import RigTopology, Verdict, decide
from rigkit.topology.report import read_report


def spans_gpus(model) -> bool:
    """The model's engine spans GPUs (tensor x pipeline above 1): its links matter."""
    return model.spec.parallel.tensor * model.spec.parallel.pipeline > 1


def needs_topology(rig: RigConfig) -> bool:
    """Some model of the rig spans GPUs: the deploy reads the topology."""
    return any(spans_gpus(m) for m in rig.models)


def compose_additions(verdict: Verdict | None) -> dict:
    """What a model's verdict adds to its compose file: render_compose's topology_args and
    topology_env (the serving role writes them, `rigkit status` judges the file with them)."""
    if verdict is None:
        return {}
    return {"topology_args": tuple(verdict.vllm_args), "topology_env": verdict.env}


def verdicts_from_fact(rig: RigConfig, lines: list[str]) -> tuple[dict[str, Verdict], list[str]]:
    """{model: verdict} from the GpuTopology fact's output, and what could not be read. No verdicts
    when the matrix itself could not be read (the notes say why)."""
    topo, notes = read_report(lines, windows=rig.spec.os == "windows")
    if topo is None:
        return {}, notes
    return {v.model: v for v in rig_verdicts(rig, topo)}, notes


def rig_verdicts(rig: RigConfig, topo: RigTopology) -> list[Verdict]:
    """The override is the rig file's `topology_override`."""
    override = rig.spec.topology_override
    verdicts = []
    for model in rig.models:
        parallel = model.spec.parallel
        if spans_gpus(model):
            verdicts.append(decide(topo, model.name, list(model.spec.gpus), parallel.tensor, parallel.pipeline, override))
    return verdicts


def render_verdict(verdict: Verdict) -> str:
    lines = [f"{verdict.model}: GPUs {', '.join(map(str, verdict.gpus))}, worst link {verdict.worst_link or '-'}"]
    if verdict.pairs:
        lines += ["  " + row for row in verdict.table().splitlines()]
    if verdict.vllm_args or verdict.env:
        env = " ".join(f"{k}={v}" for k, v in sorted(verdict.env.items()))
        lines.append(f"  vLLM: {' '.join(verdict.vllm_args)} {env}".rstrip())
    lines += [f"  error: {e}" for e in verdict.errors]
    lines += [f"  warning: {w}" for w in verdict.warnings]
    return "\n".join(lines)
