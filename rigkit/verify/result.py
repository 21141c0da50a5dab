"""One model's verification result: benchmark + telemetry + policy -> figures, checks, regressions.

Pure functions; the JSON document they build is described in docs/verification.md.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from rigkit.config import gpu_models as gpu_table
from rigkit.config.schema import ModelConfig, RigConfig
from rigkit.verify.checks import (
    Check,
    GpuLoad,
    check_clock_ceiling,
    check_enforced_limit,
    check_power_under_load,
    check_sample_rate,
    gpu_load,
)
from rigkit.verify.client import BenchResult

REGRESSION_SHARE = 0.10
# figure -> True when higher is better
COMPARED = {"decode_tok_s": True, "prefill_tok_s": True, "ttft_s": False, "joules_per_token": False,
            "decode_tok_s_per_watt": True}


def roofline_tok_s(rig: RigConfig, model: ModelConfig) -> float | None:
    """Single-stream decode bound: bandwidth of the cards reading weights at once / bytes per token.
    Tensor-parallel ranks read their shards together; pipeline stages and data-parallel replicas don't."""
    if not model.spec.active_weight_bytes:
        return None
    by_index = {g.index: g for g in rig.spec.gpus}
    infos = [gpu_table.lookup(by_index[i].model) for i in model.spec.gpus if i in by_index]
    if not infos or not all(infos):
        return None
    bandwidth_bytes = min(i.memory_bandwidth_gb_s for i in infos) * 1e9 * model.spec.parallel.tensor
    return bandwidth_bytes / model.spec.active_weight_bytes


@dataclass(frozen=True)
class Regression:
    figure: str
    previous: float
    now: float
    change: float  # (now - previous) / previous


@dataclass(frozen=True)
class VerificationResult:
    """One model's verification on one rig; written out only by `save_result`."""

    rig: str
    model: str
    time: str  # ISO 8601, UTC
    telemetry_simulated: bool
    workload: dict
    figures: dict[str, float | None]
    gpus: list[GpuLoad]
    bench: BenchResult
    checks: list[Check]
    previous: dict | None = None  # the earlier run's time, figures and whether it is comparable
    regressions: list[Regression] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return all(c.passed for c in self.checks)

    @property
    def failed_checks(self) -> list[Check]:
        return [c for c in self.checks if not c.passed]

    def to_json(self) -> dict:
        document = asdict(self)
        document["bench"] = self.bench.to_json()
        document["passed"] = self.passed
        return document


def build_result(rig: RigConfig, model: ModelConfig, bench: BenchResult, telemetry: dict,
                 previous: dict | None, now: datetime | None = None) -> VerificationResult:
    """`previous`: the JSON document of the latest earlier run, as `latest_result` reads it."""
    policy = {g.index: g for g in rig.spec.gpus}
    loads = [gpu_load(g, telemetry["t_start"], telemetry["t_end"]) for g in telemetry["gpus"]]
    checks: list[Check] = []
    for load, gpu in zip(loads, telemetry["gpus"]):
        spec = policy.get(load.index)
        cap = spec.power_limit_w if spec else None
        wanted = cap if cap is not None else gpu.get("default_limit_w")
        ceiling = spec.clock_lock_mhz.ceiling_mhz if spec and spec.clock_lock_mhz else None
        checks += [check_sample_rate(load), check_enforced_limit(load, wanted),
                   check_clock_ceiling(load, ceiling), check_power_under_load(load, cap)]
    checks += bench.checks

    energy = [load.energy_counter_j for load in loads]
    energy_j = sum(energy) if energy and all(e is not None for e in energy) else None
    seconds = telemetry["t_end"] - telemetry["t_start"]
    tokens = bench.completion_tokens or 0
    joules_per_token = energy_j / tokens if energy_j and tokens else None
    mean_power_w = energy_j / seconds if energy_j and seconds > 0 else None
    decode = bench.decode_tok_s
    roof = roofline_tok_s(rig, model)
    figures = {
        "prefill_tok_s": bench.prefill_tok_s,
        "decode_tok_s": decode,
        "ttft_s": bench.ttft_s,
        "joules_per_token": joules_per_token,
        "mean_power_w": mean_power_w,
        "decode_tok_s_per_watt": decode / mean_power_w if decode and mean_power_w else None,
        "roofline_tok_s": roof,
        "roofline_share": decode / roof if decode and roof else None,
    }
    workload = {"prompt_tokens": bench.requested_prompt_tokens, "output_tokens": bench.requested_output_tokens}
    earlier, found = None, []
    if previous:
        comparable = previous.get("workload") == workload
        earlier = {"time": previous.get("time"), "figures": previous.get("figures", {}), "comparable": comparable}
        # A run with another prompt or output length is a different workload: shown, never called a regression.
        found = regressions(figures, previous.get("figures", {})) if comparable else []
    return VerificationResult(
        rig=rig.name,
        model=model.name,
        time=(now or datetime.now(timezone.utc)).isoformat(timespec="seconds"),
        telemetry_simulated=telemetry.get("simulated", False),
        workload=workload,
        figures=figures,
        gpus=loads,
        bench=bench,
        checks=checks,
        previous=earlier,
        regressions=found,
    )


def regressions(now: dict, before: dict) -> list[Regression]:
    found = []
    for name, higher_is_better in COMPARED.items():
        new, old = now.get(name), before.get(name)
        if not new or not old:
            continue
        change = (new - old) / old
        worse = -change if higher_is_better else change
        if worse > REGRESSION_SHARE:
            found.append(Regression(name, old, new, change))
    return found


def results_folder(results_dir: Path, rig: str, model: str) -> Path:
    return Path(results_dir) / rig / model


def latest_result(folder: Path) -> dict | None:
    runs = sorted(folder.glob("*.json"))
    return json.loads(runs[-1].read_text()) if runs else None


def save_result(folder: Path, result: VerificationResult) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    stamp = result.time.replace(":", "").replace("+0000", "Z").replace("+00:00", "Z")
    path = folder / f"{stamp}.json"
    path.write_text(json.dumps(result.to_json(), indent=2) + "\n")
    return path
