"""What the real-GPU tests share: whether this machine has an NVIDIA GPU with NVML and CUDA
(they skip otherwise), and the GPU model server they measure (llm_server.py beside this file).
They run with --noconftest on the lent GPU machine, so this is a module, not conftest fixtures."""

from __future__ import annotations

import contextlib
import socket
import subprocess
import sys
import time
from pathlib import Path

SERVER = Path(__file__).with_name("llm_server.py")
SERVER_START_S = 300  # the model's build and CUDA kernel warm-up


def have_gpu() -> bool:
    try:
        import pynvml
        import torch
    except ImportError:
        return False
    try:
        pynvml.nvmlInit()
        count = pynvml.nvmlDeviceGetCount()
        pynvml.nvmlShutdown()
    except pynvml.NVMLError:
        return False
    return count > 0 and torch.cuda.is_available()


def settings(handle) -> dict:
    """What must not change: every setting rigkit could touch, read through NVML (initialized by the caller)."""
    import pynvml

    def read(call, *args):
        try:
            return call(handle, *args)
        except pynvml.NVMLError as exc:
            return f"unreadable: {exc}"
    return {"power_limit_mw": read(pynvml.nvmlDeviceGetPowerManagementLimit),
            "enforced_limit_mw": read(pynvml.nvmlDeviceGetEnforcedPowerLimit),
            "persistence": read(pynvml.nvmlDeviceGetPersistenceMode),
            "app_clock_sm": read(pynvml.nvmlDeviceGetApplicationsClock, pynvml.NVML_CLOCK_SM),
            "app_clock_mem": read(pynvml.nvmlDeviceGetApplicationsClock, pynvml.NVML_CLOCK_MEM)}


@contextlib.contextmanager
def llm_server():
    """Start llm_server.py on a free loopback port; yield its URL once /health answers."""
    import httpx

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-u", str(SERVER), "--port", str(port)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + SERVER_START_S
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                if proc.poll() is not None:
                    raise RuntimeError(f"server exited: {proc.stdout.read()}")
                time.sleep(1)
        else:
            raise TimeoutError(f"the GPU server did not answer /health within {SERVER_START_S} s")
        yield url
    finally:
        proc.kill()
        proc.wait(timeout=30)
