"""How long LocalLLM-Bootstrap may run, derived from the rig's own numbers, and whether they
fit. Pure functions.

The bootstrap waits for Docker (at most `DOCKER_WAIT_S`), then for each model in turn up to its
`ready_timeout_s`; so in the worst case it runs for their sum. Its scheduled task's limit
(ExecutionTimeLimit) is that sum plus a margin, so the script always fails on its own, with a
line in the log, before Task Scheduler would kill it silently; a deploy waits for the task
that long plus the time Task Scheduler takes to stop it. (A fixed 15 min did not fit one
model's default 900 s plus the Docker wait; a 9P load alone took over 1000 s.)
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from rigkit.config.errors import Problem
from rigkit.config.schema import RigConfig
from rigkit.windows.names import TASK_BOOTSTRAP

DOCKER_WAIT_S = 180  # Docker Desktop starting at logon
# The GPU policy's nvidia-smi calls, powershell.exe starting, logging; the rollout lock (30 s at most).
BASE_MARGIN_S = 120
PER_MODEL_MARGIN_S = 60  # `docker compose up -d` of a pulled image; the last 30 s warm-up request past its deadline
TASK_STOP_S = 60  # Task Scheduler stopping a task at its limit and recording the result
POWER_TASK_LIMIT = "PT5M"  # GPU-PowerPolicy: a few nvidia-smi calls per GPU
POWER_TASK_WAIT_S = 5 * 60 + TASK_STOP_S  # how long a deploy waits for a GPU-PowerPolicy run
TASK_LIMIT_MAX_S = 72 * 3600  # Task Scheduler's default and longest offered limit (3 days)
LONG_WAIT_S = 3600  # above this a logon (and a deploy) waits a long time for a model that never answers


@dataclass(frozen=True)
class BootstrapBudget:
    docker_wait_s: int
    ready_timeouts_s: tuple[tuple[str, int], ...]  # (model, ready_timeout_s), in the order they are waited for
    margin_s: int

    @property
    def total_s(self) -> int:
        return self.docker_wait_s + sum(s for _, s in self.ready_timeouts_s) + self.margin_s

    @property
    def limit_s(self) -> int:
        """The task's limit: the total, rounded up to whole minutes."""
        return math.ceil(self.total_s / 60) * 60

    @property
    def deploy_wait_s(self) -> int:
        """How long a deploy waits for a bootstrap run it started."""
        return self.limit_s + TASK_STOP_S

    def task_duration(self) -> str:
        """The limit as Task Scheduler writes a duration (PT21M, PT1H30M): exported tasks are
        compared with the rendered XML, so it is written the way Windows writes it."""
        hours, minutes = divmod(self.limit_s // 60, 60)
        return "PT" + (f"{hours}H" if hours else "") + (f"{minutes}M" if minutes or not hours else "")

    def arithmetic(self) -> str:
        models = " + ".join(f"{s} s ({name})" for name, s in self.ready_timeouts_s) or "no models"
        return (f"Docker wait {self.docker_wait_s} s + ready_timeout_s {models} + margin {self.margin_s} s "
                f"= {self.total_s} s, a task limit of {self.task_duration()}")


def bootstrap_budget(rig: RigConfig) -> BootstrapBudget:
    return BootstrapBudget(
        DOCKER_WAIT_S,
        tuple((m.name, m.spec.ready_timeout_s) for m in rig.models),
        BASE_MARGIN_S + PER_MODEL_MARGIN_S * len(rig.models),
    )


def timing_findings(rig: RigConfig) -> tuple[list[Problem], list[str]]:
    """(errors, warnings) about the bootstrap's time on a Windows rig."""
    budget = bootstrap_budget(rig)
    if budget.limit_s > TASK_LIMIT_MAX_S:
        return [Problem(rig.file, "models", None,
                        f"{TASK_BOOTSTRAP} would need {budget.arithmetic()}, above Task Scheduler's "
                        f"{TASK_LIMIT_MAX_S // 3600} h limit; lower ready_timeout_s in the models' catalog entries "
                        "or serve fewer models from this rig")], []
    if budget.limit_s > LONG_WAIT_S:
        return [], [f"{rig.file}: {TASK_BOOTSTRAP} may run {budget.arithmetic()}: at logon, and in a deploy "
                    f"that runs it, a model that never answers is reported only after {budget.deploy_wait_s} s"]
    return [], []
