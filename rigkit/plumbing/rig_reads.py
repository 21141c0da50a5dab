"""Time limits on what rigkit asks a rig's GPU driver and Docker Engine.

A wedged GPU or driver hangs `nvidia-smi` and NVML calls; a wedged engine hangs every `docker`
command. Every such call rigkit makes on a rig runs under coreutils' `timeout -k`, which kills
what it started when the limit passes (nothing is left running on the rig), and a call that ran
out of time is reported as such (`no_answer`), never as a missing volume or a drift to repair.
Shell facts use `bounded`; the rig-side Python scripts carry the same numbers.
"""

from __future__ import annotations

NVIDIA_SMI_S = 8  # one nvidia-smi start answers in 50-300 ms on a rig; 8 s is a wedged driver
DOCKER_S = 10  # one docker CLI command against a local engine answers in ~30-150 ms
KILL_AFTER_S = 2  # SIGTERM first, SIGKILL this long after
TIMED_OUT_CODES = (124, 137)  # timeout's own exit status; 137: it had to SIGKILL


def bounded(command: str, seconds: int) -> str:
    """`command` (a simple command, e.g. `docker volume inspect X`) run under a time limit on the rig."""
    return f"timeout -k {KILL_AFTER_S} {seconds} {command}"


def no_answer(tool: str, seconds: int) -> str:
    return f"{tool} did not answer within {seconds} s"
