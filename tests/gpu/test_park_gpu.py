"""Parking a GPU process by checkpoint on a real NVIDIA GPU (issue #51): a process holding at least 5 GiB is
checkpointed with NVIDIA's `cuda-checkpoint` (its memory copied to the host, its context released), the GPU's draw
read against the draw with no context at all, then restored and timed to its first GPU work, its data compared.

Nothing is simulated. It ONLY READS the GPU's settings (checked equal before and after): no power limit, clock
lock, offset, persistence mode or application clocks are changed; `cuda-checkpoint` changes none of them (it
moves one process's CUDA state). Needs a driver of 570 or later, PyTorch and `cuda-checkpoint`
(github.com/NVIDIA/cuda-checkpoint, bin/x86_64_Linux/) on PATH or at $RIGKIT_CUDA_CHECKPOINT; skipped otherwise.

Runs on the lent H200 with: python3 -m pytest --noconftest -s tests/gpu (docs/verification.md). The figures it
prints (and writes to $RIGKIT_GPU_OUT/park.json where that is set) go in the closing note.
"""

from __future__ import annotations

import json
import os
import select
import shutil
import statistics
import subprocess
import sys
import time

import pytest

pynvml = pytest.importorskip("pynvml")
pytest.importorskip("torch")

from tests.gpu.gpu import have_gpu, settings  # noqa: E402

HOLD_GIB = 6  # at least 5 GiB, as the issue asks
WINDOW_S = 6.0  # a draw is read as the median of this long a window once it has settled
SETTLE_MAX_S = 120.0  # clocks step down over tens of seconds after work; past this the last window is taken
SETTLED_SPREAD_W = 3.0
PARKED_WITHIN_W = 5.0  # of the no-context idle draw
FIRST_WORK_WITHIN_S = 3.0  # from the restore's start
CHECKPOINT_TIMEOUT_S = 120

HOLDER = f"""
import sys, time, torch
x = torch.rand({HOLD_GIB} * 2**28, device="cuda")  # float32: {HOLD_GIB} GiB
total = float(x.sum()); torch.cuda.synchronize()
print("ready", repr(total), flush=True)
for line in sys.stdin:
    started = time.monotonic()
    total = float(x.sum()); torch.cuda.synchronize()
    print("work", repr(total), f"{{time.monotonic() - started:.3f}}", flush=True)
"""

pytestmark = pytest.mark.skipif(not have_gpu(), reason="no NVIDIA GPU with NVML and CUDA here")


def cuda_checkpoint() -> str | None:
    found = os.environ.get("RIGKIT_CUDA_CHECKPOINT") or shutil.which("cuda-checkpoint")
    return found if found and os.access(found, os.X_OK) else None


def settled_draw_w(handle) -> tuple[float, float]:
    """(median draw over the first WINDOW_S window whose spread is within SETTLED_SPREAD_W, seconds waited), reading
    every 0.2 s for at most SETTLE_MAX_S (then the last window)."""
    started, readings = time.monotonic(), []
    while time.monotonic() - started < SETTLE_MAX_S:
        readings.append((time.monotonic(), pynvml.nvmlDeviceGetPowerUsage(handle) / 1000))
        window = [w for t, w in readings if t >= readings[-1][0] - WINDOW_S]
        if readings[-1][0] - readings[0][0] >= WINDOW_S and max(window) - min(window) <= SETTLED_SPREAD_W:
            return statistics.median(window), time.monotonic() - started
        time.sleep(0.2)
    return statistics.median([w for t, w in readings if t >= readings[-1][0] - WINDOW_S]), SETTLE_MAX_S


def held_mib(handle, pid: int) -> int:
    """The GPU memory `pid` holds as NVML lists it (0 where it lists the process not at all)."""
    for proc in pynvml.nvmlDeviceGetComputeRunningProcesses(handle):
        if proc.pid == pid:
            return (proc.usedGpuMemory or 0) // 2**20
    return 0


def line_from(proc: subprocess.Popen, timeout_s: float) -> str:
    ready, _, _ = select.select([proc.stdout], [], [], timeout_s)
    assert ready, f"the holder said nothing within {timeout_s} s"
    return proc.stdout.readline().strip()


def toggle(tool: str, pid: int) -> float:
    started = time.monotonic()
    done = subprocess.run([tool, "--toggle", "--pid", str(pid)], capture_output=True, text=True,
                          timeout=CHECKPOINT_TIMEOUT_S)
    assert done.returncode == 0, done.stdout + done.stderr
    return time.monotonic() - started


def state(tool: str, pid: int) -> str:
    done = subprocess.run([tool, "--get-state", "--pid", str(pid)], capture_output=True, text=True, timeout=30)
    return (done.stdout + done.stderr).strip()


@pytest.mark.skipif(cuda_checkpoint() is None, reason="no cuda-checkpoint (set RIGKIT_CUDA_CHECKPOINT)")
def test_a_parked_process_draws_what_an_empty_gpu_does_and_works_again_within_seconds():
    tool = cuda_checkpoint()
    pynvml.nvmlInit()
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    name = pynvml.nvmlDeviceGetName(handle)
    before = settings(handle)
    empty_w, empty_wait = settled_draw_w(handle)
    holder = subprocess.Popen([sys.executable, "-u", "-c", HOLDER], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              text=True)
    try:
        word, total = line_from(holder, 300).split()[:2]
        assert word == "ready"
        holding = held_mib(handle, holder.pid)
        context_w, context_wait = settled_draw_w(handle)
        checkpoint_s = toggle(tool, holder.pid)
        parked_state, parked_mib = state(tool, holder.pid), held_mib(handle, holder.pid)
        parked_w, parked_wait = settled_draw_w(handle)
        restore_started = time.monotonic()
        restore_s = toggle(tool, holder.pid)
        holder.stdin.write("work\n")
        holder.stdin.flush()
        answer = line_from(holder, 60).split()
        first_work_s = time.monotonic() - restore_started
    finally:
        holder.kill()
        holder.wait(timeout=30)
    after = settings(handle)
    pynvml.nvmlShutdown()
    figures = {"gpu": name, "held_mib": holding,
               "empty_idle_w": round(empty_w, 1), "idle_with_context_w": round(context_w, 1),
               "parked_w": round(parked_w, 1), "parked_state": parked_state, "parked_mib": parked_mib,
               "checkpoint_s": round(checkpoint_s, 2), "restore_s": round(restore_s, 2),
               "first_work_after_restore_s": round(first_work_s, 2),
               "settle_waits_s": [round(empty_wait, 1), round(context_wait, 1), round(parked_wait, 1)]}
    print("\npark by checkpoint:", json.dumps(figures))
    if os.environ.get("RIGKIT_GPU_OUT"):
        with open(os.path.join(os.environ["RIGKIT_GPU_OUT"], "park.json"), "w") as f:
            json.dump(figures, f, indent=1)
    assert after == before, f"a GPU setting changed: {before} -> {after}"
    assert holding >= 5 * 1024, figures
    assert "checkpointed" in parked_state and parked_mib == 0, figures
    assert answer[0] == "work" and answer[1] == total, f"the data came back changed: {total} -> {answer}"
    assert parked_w - empty_w <= PARKED_WITHIN_W, figures
    assert first_work_s <= FIRST_WORK_WITHIN_S, figures
