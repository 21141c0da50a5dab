"""rigkit-ondemand's checkpoint swap (rigkit/rigside/gpu_checkpoint.py) on a real NVIDIA GPU with NVIDIA's
cuda-checkpoint: of a CUDA process (2 GiB held) and a process without CUDA, only the first is a CUDA process;
checkpoint() parks it (state read back, 0 MiB left on the GPU as NVML lists it), restore() brings it back, and its
data is intact. Also captures what the real tool prints for each verb and for a process without CUDA, so the
stand-in (tests/simrig/cuda-checkpoint) can be held to it ($RIGKIT_GPU_OUT/cuda-checkpoint-capture.json).

Nothing is simulated. It ONLY READS the GPU's settings: cuda-checkpoint changes none (it moves one process's CUDA
state). Needs a driver of 570 or later, PyTorch and cuda-checkpoint on PATH or at $RIGKIT_CUDA_CHECKPOINT.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pynvml = pytest.importorskip("pynvml")
pytest.importorskip("torch")

from rigkit.rigside import gpu_checkpoint  # noqa: E402
from tests.gpu.gpu import have_gpu  # noqa: E402
from tests.gpu.test_park_gpu import cuda_checkpoint, held_mib, line_from  # noqa: E402

HOLDER = """
import sys, torch
x = torch.full((2 * 2**28,), 3.0, device="cuda")  # float32: 2 GiB
torch.cuda.synchronize()
print("ready", float(x.sum()), flush=True)
for line in sys.stdin:
    print("sum", float(x.sum()), flush=True)
"""

pytestmark = [pytest.mark.skipif(not have_gpu(), reason="no NVIDIA GPU with NVML and CUDA here"),
              pytest.mark.skipif(cuda_checkpoint() is None, reason="no cuda-checkpoint (set RIGKIT_CUDA_CHECKPOINT)")]


def printed(tool: str, *args: str) -> dict:
    done = subprocess.run([tool, *args], capture_output=True, text=True, timeout=120)
    return {"argv": list(args), "exit": done.returncode, "stdout": done.stdout, "stderr": done.stderr}


def test_rigkits_checkpoint_and_restore_park_only_the_cuda_process_and_bring_it_back_intact():
    tool = cuda_checkpoint()
    pynvml.nvmlInit()
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    holder = subprocess.Popen([sys.executable, "-c", HOLDER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    plain = subprocess.Popen(["sleep", "600"])
    capture = {}
    try:
        ready, _, total = line_from(holder, 300).partition(" ")
        assert ready == "ready"
        pids = [holder.pid, plain.pid]
        capture["get_state_running"] = printed(tool, "--get-state", "--pid", str(holder.pid))
        capture["get_state_no_cuda"] = printed(tool, "--get-state", "--pid", str(plain.pid))
        assert gpu_checkpoint.cuda_states(tool, pids) == {holder.pid: "running"}
        assert held_mib(handle, holder.pid) >= 2048

        assert gpu_checkpoint.checkpoint(tool, gpu_checkpoint.cuda_states(tool, pids)) == [holder.pid]
        capture["get_state_checkpointed"] = printed(tool, "--get-state", "--pid", str(holder.pid))
        assert gpu_checkpoint.state(tool, holder.pid) == "checkpointed"
        assert held_mib(handle, holder.pid) == 0
        with pytest.raises(gpu_checkpoint.CheckpointError, match="no running CUDA process"):
            gpu_checkpoint.checkpoint(tool, gpu_checkpoint.cuda_states(tool, pids))  # nothing left to park

        assert gpu_checkpoint.restore(tool, gpu_checkpoint.cuda_states(tool, pids)) == [holder.pid]
        assert gpu_checkpoint.state(tool, holder.pid) == "running"
        holder.stdin.write("go\n")
        holder.stdin.flush()
        assert line_from(holder, 60) == f"sum {total}"  # the same data, summed on the GPU again
        capture["toggle_no_cuda"] = printed(tool, "--toggle", "--pid", str(plain.pid))
    finally:
        holder.kill()
        plain.kill()
        out = os.environ.get("RIGKIT_GPU_OUT")
        if out:
            with open(os.path.join(out, "cuda-checkpoint-capture.json"), "w") as f:
                json.dump(capture, f, indent=1)
        print(json.dumps(capture, indent=1))
