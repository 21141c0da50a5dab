"""`rigkit tune`'s helper on the rig: apply a cell, read it back, restore, and the dead man's switch.

Standard library plus `pynvml` (nvidia-ml-py, or the copy rigkit ships) only: the controller
copies this file to the rig and runs it there as root, one SSH round trip per action:

    rigkit-tune.py read    --gpus 0,1
    rigkit-tune.py apply   --gpus 0,1 --power-limit 250 --lock none|1800 --mem 0 --core 0 \
                           --deadman-s 90 --restore-mem 0 --restore-core 0 --policy-unit UNIT
    rigkit-tune.py restore --gpus 0,1 --mem 0 --core 0 --policy-unit UNIT
    rigkit-tune.py disarm

`apply` arms the dead man's switch first: a transient systemd timer (systemd-run --on-active)
that runs `restore` on its own unless re-armed by the next `apply` or disarmed at the end, so a
controller that disappears (a dropped SSH connection, a killed laptop) leaves the GPUs at an
experimental setting for at most --deadman-s seconds. `restore` puts the clock offsets back and
restarts the GPU policy unit, which re-applies the rig file's declared caps and locks.
Every action prints one JSON document: what the driver reports afterwards.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import subprocess
import sys

import pynvml

DEADMAN_UNIT = "rigkit-tune-deadman"
DOMAINS = (("memory", pynvml.NVML_CLOCK_MEM), ("graphics", pynvml.NVML_CLOCK_GRAPHICS))
COMMAND_TIMEOUT_S = 60


def _offset_info(handle, clock_type):
    """nvmlDeviceGetClockOffsets for P0: (now, min, max) MHz, or None where the driver has none."""
    struct = getattr(pynvml, "c_nvmlClockOffset_t", None)
    if struct is None or not hasattr(pynvml, "nvmlDeviceGetClockOffsets"):
        return None
    info = struct()
    info.version = getattr(pynvml, "nvmlClockOffset_v1", 0)
    info.type = clock_type
    info.pstate = getattr(pynvml, "NVML_PSTATE_0", 0)
    try:
        pynvml.nvmlDeviceGetClockOffsets(handle, _ref(info))
    except pynvml.NVMLError:
        return None
    return {"now": info.clockOffsetMHz, "min": info.minClockOffsetMHz, "max": info.maxClockOffsetMHz}


def _ref(info):
    # The real binding hands its argument to the C function as is: a pointer is needed.
    return ctypes.byref(info) if isinstance(info, ctypes.Structure) else info


def _set_offset(handle, clock_type, mhz: int) -> str | None:
    info = pynvml.c_nvmlClockOffset_t()
    info.version = pynvml.nvmlClockOffset_v1
    info.type = clock_type
    info.pstate = pynvml.NVML_PSTATE_0
    info.clockOffsetMHz = mhz
    try:
        pynvml.nvmlDeviceSetClockOffsets(handle, _ref(info))
    except pynvml.NVMLError as exc:
        return str(exc)
    return None


def read(gpus: list[int]) -> dict:
    report = []
    for index in gpus:
        handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        report.append({
            "index": index,
            "enforced_w": pynvml.nvmlDeviceGetEnforcedPowerLimit(handle) / 1000.0,
            "offsets": {name: _offset_info(handle, kind) for name, kind in DOMAINS},
        })
    return {"gpus": report}


def _nvidia_smi(*args: str) -> str | None:
    run = subprocess.run(["nvidia-smi", *args], capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S)
    return None if run.returncode == 0 else f"nvidia-smi {' '.join(args)}: exit {run.returncode}: {run.stdout.strip()}"


def _systemctl(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["systemctl", *args], capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S)


def disarm() -> None:
    # Stopping the timer alone: a restore already running (the timer fired) finishes its work.
    _systemctl("stop", f"{DEADMAN_UNIT}.timer")
    _systemctl("reset-failed", f"{DEADMAN_UNIT}.timer", f"{DEADMAN_UNIT}.service")


def arm(args) -> None:
    disarm()
    gpus = ",".join(str(i) for i in args.gpus)
    command = [sys.executable, os.path.abspath(__file__), "restore", "--gpus", gpus, "--mem", str(args.restore_mem),
               "--core", str(args.restore_core), "--policy-unit", args.policy_unit]
    run = subprocess.run(
        ["systemd-run", f"--unit={DEADMAN_UNIT}", f"--on-active={args.deadman_s}s", "--timer-property=AccuracySec=1s",
         f"--setenv=PYTHONPATH={os.environ.get('PYTHONPATH', '')}",
         "--description=rigkit tune: restore the declared GPU policy if the controller went silent", *command],
        capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S)
    if run.returncode != 0:  # no switch, no experiment
        raise SystemExit(f"could not arm the dead man's switch: {run.stderr.strip() or run.stdout.strip()}")


def apply(args) -> dict:
    arm(args)
    errors = []
    for index in args.gpus:
        errors.append(_nvidia_smi("-i", str(index), "-pl", str(args.power_limit)))
        lock = ("-rgc",) if args.lock == "none" else ("-lgc", f"0,{int(args.lock)}")
        errors.append(_nvidia_smi("-i", str(index), *lock))
        handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        for (name, kind), mhz in zip(DOMAINS, (args.mem, args.core)):
            current = _offset_info(handle, kind)
            if current is None and mhz == 0:
                continue  # no offsets on this driver, and none asked for
            if current is None or current["now"] != mhz:
                failed = _set_offset(handle, kind, mhz)
                errors.append(f"GPU {index}: {name} offset {mhz:+d} MHz: {failed}" if failed else None)
    return {**read(args.gpus), "errors": [e for e in errors if e]}


def restore(args) -> dict:
    errors = []
    for index in args.gpus:
        handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        for (name, kind), mhz in zip(DOMAINS, (args.mem, args.core)):
            current = _offset_info(handle, kind)
            if current is not None and current["now"] != mhz:
                failed = _set_offset(handle, kind, mhz)
                errors.append(f"GPU {index}: {name} offset back to {mhz:+d} MHz: {failed}" if failed else None)
    run = _systemctl("restart", args.policy_unit)
    if run.returncode != 0:
        errors.append(f"systemctl restart {args.policy_unit}: {run.stderr.strip()}")
    if not any(errors):
        # Only a restore that worked may stand the switch down: after a failed one the timer
        # still fires and tries the declared policy again.
        disarm()
    return {**read(args.gpus), "errors": [e for e in errors if e]}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="action", required=True)
    for name in ("read", "apply", "restore", "disarm"):
        p = sub.add_parser(name)
        if name != "disarm":
            p.add_argument("--gpus", required=True, type=lambda t: [int(i) for i in t.split(",")])
        if name in ("apply", "restore"):
            p.add_argument("--mem", type=int, default=0)
            p.add_argument("--core", type=int, default=0)
            p.add_argument("--policy-unit", required=True)
        if name == "apply":
            p.add_argument("--power-limit", type=int, required=True)
            p.add_argument("--lock", default="none")
            p.add_argument("--deadman-s", type=int, required=True)
            p.add_argument("--restore-mem", type=int, default=0)
            p.add_argument("--restore-core", type=int, default=0)
    args = parser.parse_args(argv)
    if args.action == "disarm":
        disarm()
        print(json.dumps({"disarmed": True}))
        return 0
    pynvml.nvmlInit()
    try:
        result = {"read": lambda: read(args.gpus), "apply": lambda: apply(args), "restore": lambda: restore(args)}[args.action]()
    finally:
        pynvml.nvmlShutdown()
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
