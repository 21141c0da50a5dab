"""GPU power policy: the checks before touching a rig, and drift against what it reports.

Pure functions. The policy is declarative: a GPU without `power_limit_w` gets
its driver's default limit, one without `clock_lock_mhz` is unlocked.
"""

from __future__ import annotations

from dataclasses import dataclass

from rigkit.config import gpu_models
from rigkit.config.schema import RigSpec
from rigkit.gpu.nvsmi import GpuReport


@dataclass(frozen=True)
class PsuBudget:
    gpu_w: tuple[tuple[int, float], ...]  # (index, watts) of each GPU's cap, or its default limit
    system_w: int
    psu_w: int
    headroom_share: float

    @property
    def total_w(self) -> float:
        return sum(w for _, w in self.gpu_w) + self.system_w

    @property
    def free_w(self) -> float:
        return self.psu_w - self.total_w

    @property
    def required_free_w(self) -> float:
        return self.psu_w * self.headroom_share

    @property
    def ok(self) -> bool:
        return self.free_w >= self.required_free_w

    def arithmetic(self) -> str:
        caps = " + ".join(f"{w:.0f}" for _, w in self.gpu_w)
        return (
            f"GPU caps {caps} W + {self.system_w} W system = {self.total_w:.0f} W on a {self.psu_w} W PSU "
            f"leaves {self.free_w:.0f} W ({self.free_w / self.psu_w:.0%}) free; "
            f"{self.headroom_share:.0%} ({self.required_free_w:.0f} W) must stay free for transient spikes"
        )


def psu_budget(spec: RigSpec, default_limits_w: dict[int, float]) -> PsuBudget:
    """Sum of caps (a GPU without one counts at its default limit) plus system draw, against the PSU."""
    watts = tuple(
        (g.index, float(g.power_limit_w) if g.power_limit_w is not None else default_limits_w[g.index])
        for g in spec.gpus
    )
    return PsuBudget(watts, spec.system_w, spec.psu_w, spec.psu_headroom_share)


def range_problems(spec: RigSpec, report: GpuReport) -> list[str]:
    """Caps outside the range the rig's own driver allows for that GPU."""
    reported = {g.index: g for g in report.gpus}
    problems = []
    for gpu in spec.gpus:
        found = reported.get(gpu.index)
        if gpu.power_limit_w is None or found is None:
            continue
        if not found.power_min_w <= gpu.power_limit_w <= found.power_max_w:
            problems.append(
                f"GPU {gpu.index}: power_limit_w {gpu.power_limit_w} W is outside "
                f"{found.power_min_w:.0f}-{found.power_max_w:.0f} W, the range this {found.name} reports"
            )
    return problems


def wanted_limits_w(spec: RigSpec, report: GpuReport) -> dict[int, float]:
    defaults = {g.index: g.power_default_w for g in report.gpus}
    return {g.index: float(g.power_limit_w) if g.power_limit_w is not None else defaults[g.index] for g in spec.gpus}


def power_drift(spec: RigSpec, report: GpuReport) -> list[str]:
    """GPUs whose current power limit is not the policy's, as lines for the deploy log."""
    return drift_lines(report, wanted_limits_w(spec, report))


def drift_lines(report: GpuReport, wanted_w: dict[int, float]) -> list[str]:
    """Lines for the GPUs whose current power limit is not `wanted_w` ({index: watts})."""
    current = {g.index: g.power_limit_w for g in report.gpus}
    return [
        f"GPU {index}: power limit is {current[index]:.0f} W, policy says {want:.0f} W"
        for index, want in wanted_w.items()
        if abs(current[index] - want) >= 0.5
    ]


def policy_problems(spec: RigSpec, report: GpuReport) -> tuple[list[str], str | None]:
    """Why the policy must not be applied (caps outside the driver's range, PSU budget), and the
    warning to log when the rig file overrides the PSU check."""
    problems = range_problems(spec, report)
    budget = psu_budget(spec, {g.index: g.power_default_w for g in report.gpus})
    if budget.ok:
        return problems, None
    if spec.psu_budget_override:
        return problems, f"PSU budget override in the rig file: {budget.arithmetic()}"
    problems.append(
        f"PSU budget: {budget.arithmetic()}. Lower the caps, or set psu_budget_override: true "
        "in the rig file to accept the risk of over-current trips"
    )
    return problems, None


def reference_budget_problems(spec: RigSpec) -> tuple[list[str], list[str]]:
    """The PSU budget checked before reaching the rig (`rigkit check`): each GPU without a cap
    counts at its reference board's default limit. Returns (problems, notes); the deploy checks
    again with the defaults the rig's own driver reports."""
    defaults, unknown = {}, []
    for gpu in spec.gpus:
        info = gpu_models.lookup(gpu.model)
        if info:
            defaults[gpu.index] = float(info.power_default_w)
        elif gpu.power_limit_w is None:
            unknown.append(f"GPU {gpu.index} ({gpu.model})")
    if unknown:
        return [], [f"PSU budget not checked offline: no reference default limit for {', '.join(unknown)}; "
                    "the deploy checks it with the rig's own numbers"]
    budget = psu_budget(spec, defaults)
    if budget.ok:
        return [], []
    if spec.psu_budget_override:
        return [], [f"PSU budget override in the rig file: {budget.arithmetic()}"]
    return [f"PSU budget: {budget.arithmetic()}. Lower the caps, or set psu_budget_override: true "
            "in the rig file to accept the risk of over-current trips"], []

