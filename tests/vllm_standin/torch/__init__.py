"""A stand-in for exactly the part of PyTorch that rigkit's P2P check (templates/serving/rigkit-p2p-probe.py)
uses. TEST INFRASTRUCTURE, never product code: installed only in the vLLM stand-in image, where the real
image has torch; there is no GPU behind it.

What it fakes, and how:
- The GPUs the container sees are Docker's NVIDIA device request (NVIDIA_VISIBLE_DEVICES, e.g. "0,1"),
  numbered 0.. in the rig's index order (as CUDA_DEVICE_ORDER=PCI_BUS_ID numbers them).
- The simulated rig's gpus.json (STANDIN_TORCH_GPU_DIR: the folder in the container holding it, a
  copy tests.simrig.rig.SimRig writes into a model's bind-mounted folder; without it every call
  refuses, so a test cannot pass without the rig's hardware) says what the links between them do: `topology.p2p_faults`, {"A-B": "hang" | "wrong_bytes"} by the rig's GPU
  indices. A copy between A and B (either way) then never returns (a hung DMA: the call blocks and
  cannot be interrupted, as a CUDA call cannot) or delivers one byte changed; an all-reduce over a
  group holding both never returns or sums one element wrong.
- Tensors are 1-D: uint8 ones as bytes, float32 ones as Python floats; only the calls the check makes.
- torch.distributed (tests/vllm_standin/torch/distributed.py): one process per rank, meeting in a
  folder under /tmp named by MASTER_PORT; init_process_group honours its timeout as the real
  rendezvous does.
"""

from __future__ import annotations

import json
import os
import threading

from . import cuda, distributed  # noqa: F401  (torch.cuda, torch.distributed)

uint8 = "uint8"
float32 = "float32"


def _rig_gpus() -> list[int]:
    visible = os.environ.get("NVIDIA_VISIBLE_DEVICES", "")
    if not visible or visible in ("void", "none"):
        return []
    return sorted(int(g) for g in visible.split(","))


def _faults() -> dict[frozenset, str]:
    folder = os.environ.get("STANDIN_TORCH_GPU_DIR")
    if not folder:
        raise RuntimeError("torch stand-in: STANDIN_TORCH_GPU_DIR is not set, so there are no simulated GPUs")
    with open(os.path.join(folder, "gpus.json")) as f:
        topology = json.load(f).get("topology") or {}
    return {frozenset(int(g) for g in pair.split("-")): mode for pair, mode in (topology.get("p2p_faults") or {}).items()}


def fault_between(devices) -> str | None:
    """The fault of any pair of these device ordinals (by the rig's GPU indices), or None."""
    gpus = _rig_gpus()
    rig = {gpus[d] for d in devices}
    for pair, mode in _faults().items():
        if pair <= rig:
            return mode
    return None


def hang() -> None:
    threading.Event().wait()  # never set: a hung DMA or collective


def _ordinal(device) -> int:
    if device is None or device == "cpu":
        return -1
    ordinal = int(str(device).split(":")[1])
    if not 0 <= ordinal < len(_rig_gpus()):
        raise RuntimeError(f"CUDA error: invalid device ordinal ({device})")
    return ordinal


class Tensor:
    def __init__(self, data, dtype, device):
        self.data, self.dtype, self.device = data, dtype, device

    def repeat(self, times):
        return Tensor(self.data * times, self.dtype, self.device)

    def __add__(self, value):
        if self.dtype == uint8:
            table = bytes((i + int(value)) % 256 for i in range(256))
            return Tensor(self.data.translate(table), self.dtype, self.device)
        return Tensor([x + value for x in self.data], self.dtype, self.device)

    def copy_(self, source):
        if len(source.data) != len(self.data):
            raise RuntimeError("The size of tensor a must match the size of tensor b")
        data = source.data
        a, b = _ordinal(source.device), _ordinal(self.device)
        if a >= 0 and b >= 0 and a != b:
            mode = fault_between((a, b))
            if mode == "hang":
                hang()
            if mode == "wrong_bytes":
                data = bytearray(data)
                data[len(data) // 2] ^= 0x01
                data = bytes(data)
        self.data = data if self.dtype == uint8 else list(data)
        return self

    def cpu(self):
        return Tensor(self.data, self.dtype, "cpu")

    def min(self):
        return Tensor([min(self.data)], self.dtype, self.device)

    def max(self):
        return Tensor([max(self.data)], self.dtype, self.device)

    def item(self):
        return self.data[0]


def arange(n, dtype, device=None):
    _ordinal(device)
    return Tensor(bytes(range(n)) if dtype == uint8 else [float(i) for i in range(n)], dtype, device)


def empty(n, dtype, device=None):
    _ordinal(device)
    return Tensor(bytes(n) if dtype == uint8 else [0.0] * n, dtype, device)


def full(shape, value, dtype, device=None):
    _ordinal(device)
    (n,) = shape
    return Tensor(bytes([int(value)]) * n if dtype == uint8 else [float(value)] * n, dtype, device)


def equal(a, b) -> bool:
    return a.dtype == b.dtype and a.data == b.data
