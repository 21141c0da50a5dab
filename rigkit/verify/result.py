"""One model's verification result: benchmark + telemetry + policy -> figures, checks, regressions.

Energy is split at the request's first token (rigkit.verify.energy): prefill and decode
each from integrated instant power, the energy counter over the whole run as a
cross-check. Regressions are flagged only against a result with the same provenance
(rigkit.verify.provenance). Pure functions; the JSON is described in docs/verification.md.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path

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
from rigkit.fit.roofline import far_below, roofline_tok_s
from rigkit.verify.client import BenchResult
from rigkit.verify.energy import PhaseEnergy, phase
from rigkit.verify.history import Warn, read_history, stderr_warning, write_document
from rigkit.verify.provenance import changes, provenance

REGRESSION_SHARE = 0.10
# figure -> True when higher is better
COMPARED = {"decode_tok_s": True, "prefill_tok_s": True, "ttft_s": False, "joules_per_token": False,
            "joules_per_output_token": False, "decode_tok_s_per_watt": True}


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
    previous: dict | None = None  # the earlier run's time, figures, whether it is comparable and what changed
    regressions: list[Regression] = field(default_factory=list)
    provenance: dict = field(default_factory=dict)
    phases: list[PhaseEnergy] = field(default_factory=list)  # prefill, decode
    telemetry_sampler: str | None = None  # which ran: nvml-host (Linux) or nvml-container (Windows)
    # Saved for a config the gate measured GATE_RUNS times (the promoted candidate, the restored config): those
    # runs' mean, CV and each (rigkit.verify.gate_record.run_summary), so the next gate knows this result's noise.
    runs: dict | None = None
    # The start this verification followed (rigkit.rigside.startup's table, as rigkit-stack kept it), if any.
    startup: dict | None = None

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
        document["kind"] = "verification"
        return document


def build_result(rig: RigConfig, model: ModelConfig, bench: BenchResult, telemetry: dict,
                 previous: list[dict] | dict | None, now: datetime | None = None, serving: dict | None = None,
                 shape: dict | None = None) -> VerificationResult:
    """`previous`: earlier runs' JSON documents, newest first (`earlier_results`), or the latest one.
    `serving`: what the caller knows of the server ({image, image_digest, vllm_args}), for provenance.
    `shape`: what the rig says of the model's files (rigkit.fit.facts), for its roofline."""
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
    integrated = [load.integrated_energy_j for load in loads]
    seconds = telemetry["t_end"] - telemetry["t_start"]
    tokens = bench.completion_tokens or 0
    prefill = phase(telemetry, "prefill", bench.wall_send_s, bench.wall_first_token_s)
    decode_phase = phase(telemetry, "decode", bench.wall_first_token_s, bench.wall_last_token_s)
    request_j = prefill.energy_j + decode_phase.energy_j if prefill.energy_j is not None and \
        decode_phase.energy_j is not None else None
    decode = bench.decode_tok_s
    roof = roofline_tok_s(rig, model, shape)
    suspect = far_below(model, decode, roof, shape)
    if suspect:  # a warning: the speed is the gate's to judge, the cause the person's to find
        bench = replace(bench, warnings=[*bench.warnings, suspect])
    workload = {"prompt_tokens": bench.requested_prompt_tokens, "output_tokens": bench.requested_output_tokens}
    figures = {
        "prefill_tok_s": bench.prefill_tok_s,
        "decode_tok_s": decode,
        "ttft_s": bench.ttft_s,
        "queue_s": bench.queue_s,
        "prefill_energy_j": prefill.energy_j,
        "decode_energy_j": decode_phase.energy_j,
        "prefill_mean_power_w": prefill.mean_power_w,
        "decode_mean_power_w": decode_phase.mean_power_w,
        "prefill_samples": prefill.samples,
        "decode_samples": decode_phase.samples,
        "joules_per_output_token": request_j / tokens if request_j is not None and tokens else None,
        "decode_tok_s_per_watt": decode / decode_phase.mean_power_w if decode and decode_phase.mean_power_w else None,
        "response_time_estimate_s": (workload["prompt_tokens"] / bench.prefill_tok_s
                                     + workload["output_tokens"] / decode) if bench.prefill_tok_s and decode else None,
        "run_energy_counter_j": energy_j,
        "run_integrated_energy_j": sum(integrated) if integrated and all(e is not None for e in integrated) else None,
        "joules_per_token": energy_j / tokens if energy_j and tokens else None,
        "mean_power_w": energy_j / seconds if energy_j and seconds > 0 else None,
        "roofline_tok_s": roof,
        "roofline_share": decode / roof if decode and roof else None,
    }
    made_with = provenance(rig, {**bench.provenance, **workload}, telemetry, loads, serving)
    earlier, found = None, []
    history = previous if isinstance(previous, list) else [previous] if previous else []
    if history:
        # Compared with the newest earlier run measured the same way (driver, image, limits, workload);
        # if there is none, the newest run is shown with what changed, never called a regression.
        match = next((p for p in history if not changes(p.get("provenance"), made_with)), None)
        base = match or history[0]
        changed = [] if match else changes(history[0].get("provenance"), made_with)
        earlier = {"time": base.get("time"), "figures": base.get("figures", {}), "comparable": match is not None,
                   "changed": changed}
        found = regressions(figures, base.get("figures", {})) if match else []
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
        provenance=made_with,
        phases=[prefill, decode_phase],
        telemetry_sampler=telemetry.get("sampler"),
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


def latest_result(folder: Path, warn: Warn | None = stderr_warning) -> dict | None:
    """The newest verification in `folder` by the time inside it (tune and gate documents are not
    verifications); unreadable files are skipped and named through `warn`."""
    found = earlier_results(folder, 1, warn)
    return found[0] if found else None


def earlier_results(folder: Path, most: int = 50, warn: Warn | None = stderr_warning) -> list[dict]:
    """The newest `most` verifications in `folder`, newest first (rigkit.verify.history)."""
    history = read_history(folder, "verification")
    for text in history.warnings if warn else ():
        warn(text)
    return history.documents[:most]


def save_result(folder: Path, result: VerificationResult) -> Path:
    stamp = result.time.replace(":", "").replace("+0000", "Z").replace("+00:00", "Z")
    return write_document(Path(folder) / f"{stamp}.json", result.to_json())
