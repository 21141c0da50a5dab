"""Clock locks released while every on-demand model of a GPU is parked, and put back before one loads
(docs/on-demand.md). A locked minimum clock keeps an idle GPU's clocks, and its draw, up; with nothing of a
model on it, the lock only costs power. Standard library only (rigkit-ondemand uses it on the rig).

The protocol, between rigkit-ondemand and rigkit-gpu-policy (a deploy's apply, a boot's, the GPU keeper's
repair): GPU_PARKED_PATH lists the GPUs whose clock lock is released, one index a line. The policy script
leaves a GPU listed there unlocked (its power limit and offsets still applied); rigkit-ondemand lists a GPU
and unlocks it, or locks it again from the policy file and takes it off the list, always under the keeper's
lock (GPU_KEEPER_LOCK_PATH), so a repair never sees half of a change. rigkit-ondemand puts every lock back
as it stops: a deploy that stops it to roll a model out proves that model on a GPU with its lock.
"""

from __future__ import annotations

import os
import subprocess

from . import atomic, lock
from .metrics import parse_policy
from .names import GPU_KEEPER_LOCK_PATH, GPU_PARKED_PATH, GPU_POLICY_PATH

NVSMI_TIMEOUT_S = 8  # the policy script's bound on one nvidia-smi call: a wedged driver hangs it


def policy_locks(policy_path: str = GPU_POLICY_PATH) -> dict[int, str]:
    """{GPU: "MIN,MAX"} of the GPUs whose clocks the policy locks, as the exporter reads the file
    (metrics.parse_policy: a lock that does not parse is no lock)."""
    try:
        with open(policy_path) as f:
            policy = parse_policy(f.read())
    except OSError:
        return {}
    return {gpu: f"{p['lock'][0]},{p['lock'][1]}" for gpu, p in policy.items() if p["lock"]}


def parked(parked_path: str = GPU_PARKED_PATH) -> set[int]:
    try:
        with open(parked_path) as f:
            return {int(cell) for cell in f.read().split() if cell.isdigit()}
    except OSError:
        return set()


def _nvidia_smi(args: list[str]) -> str:
    """"" when it did it; else what went wrong, in words."""
    try:
        done = subprocess.run(["nvidia-smi", *args], capture_output=True, text=True, timeout=NVSMI_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return f"nvidia-smi {' '.join(args)} did not answer within {NVSMI_TIMEOUT_S} s"
    except OSError as error:
        return f"nvidia-smi {' '.join(args)}: {error}"
    if done.returncode:
        return f"nvidia-smi {' '.join(args)} exited {done.returncode}: {(done.stderr or done.stdout).strip()[-200:]}"
    return ""


def set_parked(gpus: set[int], want_parked: bool, policy_path: str = GPU_POLICY_PATH,
               parked_path: str = GPU_PARKED_PATH, lock_path: str = GPU_KEEPER_LOCK_PATH, gate=None) -> list[str]:
    """Release (want_parked) or put back the policy's clock lock on `gpus`, those the policy locks; what was
    done or went wrong, a line per GPU. `gate`: asked under the lock; False leaves everything as it is."""
    said = []
    with lock.held(lock_path):
        if gate is not None and not gate():
            return said
        locks, listed = policy_locks(policy_path), parked(parked_path)
        for gpu in sorted(gpus):
            if gpu not in locks or (gpu in listed) == want_parked:
                continue
            if want_parked:  # listed once it is unlocked
                failed = _nvidia_smi(["-i", str(gpu), "-rgc"])
                if not failed:
                    _write(parked_path, listed := listed | {gpu})
                done = f"GPU {gpu}: clock lock {locks[gpu]} MHz released while parked"
            else:  # off the list first: a lock that fails now is put back by the policy's next apply
                _write(parked_path, listed := listed - {gpu})
                failed = _nvidia_smi(["-i", str(gpu), "-lgc", locks[gpu]])
                done = f"GPU {gpu}: clocks locked to {locks[gpu]} MHz again"
            said.append(f"GPU {gpu}: {failed}" if failed else done)
    return said


def _write(parked_path: str, gpus: set[int]) -> None:
    os.makedirs(os.path.dirname(parked_path), mode=0o700, exist_ok=True)
    atomic.write_text(parked_path, "".join(f"{g}\n" for g in sorted(gpus)))


class ParkedClocks:
    """rigkit-ondemand's side: `gpus_of` {model: its GPUs}; `releasable`: the GPUs only on-demand models use
    (a resident model's GPU keeps its lock). `log` takes a line."""

    def __init__(self, gpus_of: dict[str, list[int]], releasable: set[int], log=print, **paths):
        self.gpus_of, self.releasable, self.log, self.paths = gpus_of, set(releasable), log, paths
        self.stopping = False  # set by restore_all: a swap finishing after it releases nothing

    def before_load(self, name: str) -> None:
        """The model's GPUs locked again, before it starts or wakes."""
        for line in set_parked(set(self.gpus_of[name]) & self.releasable, False, **self.paths):
            self.log(f"rigkit-ondemand: {line} ({name} loads)")

    def settle(self, busy_models: set[str]) -> None:
        """Release the lock of each releasable GPU that no busy model (loaded, or with requests waiting for
        it) uses: asleep or stopped ones run no work."""
        busy = {gpu for name in busy_models for gpu in self.gpus_of.get(name, ())}
        for line in set_parked(self.releasable - busy, True, gate=lambda: not self.stopping, **self.paths):
            self.log(f"rigkit-ondemand: {line}")

    def restore_all(self) -> None:
        """Every lock back, as rigkit-ondemand stops."""
        self.stopping = True
        for line in set_parked(self.releasable, False, **self.paths):
            self.log(f"rigkit-ondemand: {line} (stopping)")
