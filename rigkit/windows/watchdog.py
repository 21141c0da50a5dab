"""The Windows rig's watchdog: the scheduled task LocalLLM-Watchdog (as SYSTEM, on a repetition
trigger) and the PowerShell script it runs (templates/windows/rigkit-watchdog.ps1.j2). Its settings
are the Linux watchdog's, rendered by the same function (rigkit.serving.watchdog.watchdog_config)
with Windows paths; its decisions are the same too (docs/serving.md#watchdog). Pure rendering.

Task Scheduler repeats a task at 1 min at the shortest, so a run makes a pass every
`pass_interval_s` (the shortest interval_s of the watched models, as the Linux timer) for
`repeat_s`, then exits; the next repetition starts the next run. Its time limit covers a run's
length plus one pass's worst case (every probe, /metrics read and docker call at its deadline).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from rigkit.config.schema import RigConfig
from rigkit.plumbing.render import render
from rigkit.serving.watchdog import timer_interval_s, watched, watchdog_config
from rigkit.windows.names import (
    LOGS_DIR,
    ROLLOUT_LOCK,
    TASK_WATCHDOG,
    WATCHDOG_CONFIG,
    WATCHDOG_LOG_PATH,
    WATCHDOG_SCRIPT,
    WATCHDOG_STATE_DIR,
)
from rigkit.windows.timing import bootstrap_budget

# The Linux watchdog's signals (templates/serving/rigkit-watchdog: PROGRESS, LOAD; a test keeps them equal).
PROGRESS_NAMES = ("vllm:generation_tokens_total", "vllm:prompt_tokens_total", "vllm:iteration_tokens_total_count")
LOAD_NAMES = ("vllm:num_requests_running", "vllm:num_requests_waiting")
METRICS_TIMEOUT_S = 5
DOCKER_TIMEOUT_S = 60  # each docker.exe call (ps, restart) is killed after this
STOP_GRACE_S = 10  # docker restart -t: a wedged engine seldom stops cleanly
REPEAT_MIN_S = 60  # Task Scheduler's shortest repetition interval
MARGIN_S = 60  # powershell.exe starting, reading the settings, writing state
# A rollout lock that cannot be opened at all (not held: its folder's ACL, a path that is no file) is
# waited on this long before a wedged model is restarted without it; one held by another process as
# long as LocalLLM-Bootstrap may run (its time limit and Task Scheduler's stop), since no rollout is longer.
LOCK_UNREADABLE_LIMIT_S = 600


@dataclass(frozen=True)
class WatchdogSchedule:
    pass_interval_s: int  # a pass this often inside a run
    repeat_s: int  # the task's repetition interval, and how long a run makes passes
    limit_s: int  # the task's ExecutionTimeLimit

    @property
    def repeat(self) -> str:
        return _duration(self.repeat_s)

    @property
    def limit(self) -> str:
        return _duration(self.limit_s)


def _duration(seconds: int) -> str:
    """Whole minutes, as Task Scheduler writes a duration (PT3M, PT1H5M)."""
    hours, minutes = divmod(math.ceil(seconds / 60), 60)
    return "PT" + (f"{hours}H" if hours else "") + (f"{minutes}M" if minutes or not hours else "")


def schedule(rig: RigConfig) -> WatchdogSchedule:
    pass_interval_s = timer_interval_s(rig)
    repeat_s = max(REPEAT_MIN_S, math.ceil(pass_interval_s / 60) * 60)
    worst_pass_s = sum(m.spec.watchdog.probe_timeout_s + METRICS_TIMEOUT_S + 2 * DOCKER_TIMEOUT_S
                       for m in watched(rig))
    return WatchdogSchedule(pass_interval_s, repeat_s, math.ceil((repeat_s + worst_pass_s + MARGIN_S) / 60) * 60)


def watchdog_script(rig: RigConfig) -> str:
    """The script LocalLLM-Watchdog runs (WATCHDOG_SCRIPT)."""
    plan = schedule(rig)
    return render(
        "windows/rigkit-watchdog.ps1.j2", rig_name=rig.name, task_name=TASK_WATCHDOG, config_path=str(WATCHDOG_CONFIG),
        lock_path=str(ROLLOUT_LOCK), log_path=str(WATCHDOG_LOG_PATH), log_dir=str(LOGS_DIR),
        run_for_s=plan.repeat_s, pass_interval_s=plan.pass_interval_s, metrics_timeout_s=METRICS_TIMEOUT_S,
        docker_timeout_s=DOCKER_TIMEOUT_S, stop_grace_s=STOP_GRACE_S, progress_names=PROGRESS_NAMES,
        load_names=LOAD_NAMES, rollout_max_s=bootstrap_budget(rig).deploy_wait_s,
        lock_unreadable_limit_s=LOCK_UNREADABLE_LIMIT_S,
    )


def watchdog_settings(rig: RigConfig, api_key_file: str | None) -> str:
    """Its settings (WATCHDOG_CONFIG): the Linux watchdog's, with the Windows rig's paths."""
    return watchdog_config(rig, with_api_key=api_key_file is not None, api_key_env_file=api_key_file or "",
                           state_dir=str(WATCHDOG_STATE_DIR))


def watchdog_task_xml(rig: RigConfig) -> str:
    """The task's XML: as SYSTEM, repeated at `schedule`'s interval, disabled when no model is watched."""
    plan = schedule(rig)
    return render(
        "windows/task-watchdog.xml.j2", rig_name=rig.name, task_name=TASK_WATCHDOG, repeat=plan.repeat,
        execution_time_limit=plan.limit, enabled=bool(watched(rig)), script_path=str(WATCHDOG_SCRIPT),
    )
