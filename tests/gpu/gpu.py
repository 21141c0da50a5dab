"""Whether this machine has an NVIDIA GPU with NVML and CUDA (the real-GPU tests skip otherwise)."""

from __future__ import annotations


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
