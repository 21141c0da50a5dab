"""torch.distributed of the torch stand-in (tests/vllm_standin/torch/__init__.py says what it fakes):
the NCCL backend's calls that rigkit's P2P check makes, one process per rank, meeting in a folder
/tmp/torch-standin-<MASTER_PORT> (each rank's tensor as JSON there)."""

from __future__ import annotations

import json
import os
import time

_group: dict = {}


def _folder() -> str:
    return f"/tmp/torch-standin-{os.environ['MASTER_PORT']}"


def _write(name: str, value) -> None:
    path = os.path.join(_folder(), name)
    with open(path + ".tmp", "w") as f:
        json.dump(value, f)
    os.replace(path + ".tmp", path)


def _wait_for(names, timeout_s=None):
    """Every file present; None: as long as it takes (a collective waits for every rank)."""
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    while not all(os.path.exists(os.path.join(_folder(), n)) for n in names):
        if deadline is not None and time.monotonic() > deadline:
            missing = [n for n in names if not os.path.exists(os.path.join(_folder(), n))]
            raise RuntimeError(f"Timed out after {timeout_s} s waiting for ranks to join ({', '.join(missing)})")
        time.sleep(0.05)


def init_process_group(backend, rank, world_size, timeout):
    import torch

    if backend != "nccl":
        raise ValueError(f"torch stand-in: backend {backend!r} is not simulated")
    os.makedirs(_folder(), exist_ok=True)
    _group.update(rank=rank, world=world_size, calls=0)
    _write(f"joined-{rank}", True)
    _wait_for([f"joined-{r}" for r in range(world_size)], timeout.total_seconds())
    _group["device"] = torch.cuda.current_device()


def all_reduce(tensor):
    """Sum over the ranks, in place."""
    import torch

    call = _group["calls"] = _group["calls"] + 1
    world, rank = _group["world"], _group["rank"]
    mode = torch.fault_between(range(world))
    if mode == "hang":
        torch.hang()
    _write(f"reduce-{call}-{rank}", tensor.data)
    _wait_for([f"reduce-{call}-{r}" for r in range(world)])
    parts = []
    for r in range(world):
        with open(os.path.join(_folder(), f"reduce-{call}-{r}")) as f:
            parts.append(json.load(f))
    summed = [sum(values) for values in zip(*parts)]
    if mode == "wrong_bytes":
        summed[len(summed) // 2] += 1.0
    tensor.data = summed


def destroy_process_group():
    _group.clear()

