"""Parking a model's GPU processes with NVIDIA's cuda-checkpoint (github.com/NVIDIA/cuda-checkpoint, driver 570
or later): each CUDA process of the model's container has its GPU memory copied to host memory and its CUDA
context released, so its GPUs draw what they draw empty, and it is restored in about a second. Measured on an
H200 (tests/gpu/test_park_gpu.py): an idle context 121.5 W, parked 78.9 W against 78.8 W empty, with 0 MiB
used; checkpoint 3.81 s and restore 1.17 s for 6.6 GiB. It changes no GPU setting. Standard library only (it
runs in rigkit-ondemand on the rig). docs/on-demand.md.

The tool's verbs, as rigkit uses them: `cuda-checkpoint --get-state --pid PID` prints the process's state
(running, locked, checkpointed, failed) and fails for a process without CUDA; `cuda-checkpoint --toggle --pid
PID` checkpoints a running process (lock, then checkpoint) or restores a checkpointed one (restore, then
unlock). While checkpointed, the process's CUDA calls wait: its engine answers nothing that needs the GPU
until it is restored. It does not move memory shared between processes (NCCL's IPC), so a model spanning GPUs
is not parked this way (the rig file refuses it).
"""

from __future__ import annotations

import subprocess

STATE_TIMEOUT_S = 10
TOGGLE_TIMEOUT_S = 300  # a checkpoint copies the process's GPU memory to host memory: 3.8 s for 6.6 GiB on an H200
STATES = ("running", "locked", "checkpointed", "failed")


class CheckpointError(Exception):
    """cuda-checkpoint did not do what was asked; str() says which process, what and what it printed."""


def _run(tool: str, args: list[str], timeout_s: float) -> subprocess.CompletedProcess:
    try:
        return subprocess.run([tool, *args], capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        raise CheckpointError(f"`{tool} {' '.join(args)}` still running after {timeout_s:g} s") from None
    except OSError as error:
        raise CheckpointError(f"{tool}: {error}") from None


def state(tool: str, pid: int) -> str | None:
    """The CUDA state of `pid`, or None where it is no CUDA process (the tool refuses it) or no longer runs."""
    done = _run(tool, ["--get-state", "--pid", str(int(pid))], STATE_TIMEOUT_S)
    found = done.stdout.strip().lower()
    return found if done.returncode == 0 and found in STATES else None


def cuda_states(tool: str, pids: list[int]) -> dict[int, str]:
    """{pid: state} of the processes among `pids` that are CUDA processes."""
    found = {}
    for pid in pids:
        value = state(tool, pid)
        if value is not None:
            found[pid] = value
    return found


def _toggle_to(tool: str, pid: int, wanted: str) -> None:
    done = _run(tool, ["--toggle", "--pid", str(int(pid))], TOGGLE_TIMEOUT_S)
    now = state(tool, pid)
    if done.returncode or now != wanted:
        printed = (done.stderr or done.stdout).strip()[-300:]
        raise CheckpointError(f"process {pid}: --toggle exit {done.returncode}{f' ({printed})' if printed else ''}; "
                              f"its state is now {now or 'unknown'}, not {wanted}")


def checkpoint(tool: str, states: dict[int, str]) -> list[int]:
    """Checkpoint every running CUDA process of `states` (cuda_states, as the caller just read them: one
    --get-state per process, not two); the ones checkpointed. Raises CheckpointError where there is none, or one
    does not end checkpointed (the caller stops the container then)."""
    running = [pid for pid, value in states.items() if value == "running"]
    if not running:
        raise CheckpointError(f"no running CUDA process among the container's: {dict(sorted(states.items())[:16])}")
    for pid in running:
        _toggle_to(tool, pid, "checkpointed")
    return running


PARKED_STATES = ("checkpointed", "locked", "failed")  # not running: a toggle done, or cut off between its steps


def is_parked(states: dict[int, str]) -> bool:
    """Whether a CUDA process of `states` is not running: its engine cannot serve from any of PARKED_STATES."""
    return any(value in PARKED_STATES for value in states.values())


def restore(tool: str, states: dict[int, str]) -> list[int]:
    """Restore every checkpointed CUDA process of `states` (cuda_states, as the caller just read them); the ones
    restored. Raises CheckpointError where one does not end running, or one is locked or failed (a toggle cut
    off between its steps, e.g. by a restart of rigkit-ondemand, or a restore the driver could not finish): the
    caller restarts the container cold then."""
    stuck = {pid: value for pid, value in states.items() if value in ("locked", "failed")}
    if stuck:
        raise CheckpointError(f"processes {stuck} are neither running nor checkpointed")
    parked = [pid for pid, value in states.items() if value == "checkpointed"]
    if not parked:
        raise CheckpointError(f"no checkpointed CUDA process among the container's: {dict(sorted(states.items())[:16])}")
    for pid in parked:
        _toggle_to(tool, pid, "running")
    return parked
