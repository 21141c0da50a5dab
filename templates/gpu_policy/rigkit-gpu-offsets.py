#!/usr/bin/python3
"""rigkit GPU policy: set one GPU's NVML clock offsets (P0) and prove them by reading them back.

Installed by rigkit; run by rigkit-gpu-policy. Usage:
    rigkit-gpu-offsets INDEX MEMORY_MHZ GRAPHICS_MHZ [--if-supported]
Each offset is checked against the range the driver reports (nvmlDeviceGetClockOffsets) before
it is set; out of range, nothing is set and it exits 1 naming the range. `--if-supported` (used
for "default", i.e. 0,0): a driver or pynvml without clock offsets is not an error. Standard
library plus pynvml (nvidia-ml-py, or the copy rigkit ships beside this script).
"""

import ctypes
import sys

try:
    import pynvml
except ImportError:
    pynvml = None

DOMAINS = (("memory", 2), ("graphics", 0))  # NVML_CLOCK_MEM, NVML_CLOCK_GRAPHICS


def say(text):
    print(f"rigkit-gpu-policy: {text}", flush=True)


def info_for(clock_type, mhz=0):
    info = pynvml.c_nvmlClockOffset_t()
    info.version = pynvml.nvmlClockOffset_v1
    info.type = clock_type
    info.pstate = getattr(pynvml, "NVML_PSTATE_0", 0)
    info.clockOffsetMHz = mhz
    return info


def ref(info):
    return ctypes.byref(info) if isinstance(info, ctypes.Structure) else info


def main(argv):
    if len(argv) not in (3, 4) or (len(argv) == 4 and argv[3] != "--if-supported"):
        say("usage: rigkit-gpu-offsets INDEX MEMORY_MHZ GRAPHICS_MHZ [--if-supported]")
        return 2
    index, wanted = int(argv[0]), {"memory": int(argv[1]), "graphics": int(argv[2])}
    lenient = len(argv) == 4
    if pynvml is None or not hasattr(pynvml, "nvmlDeviceSetClockOffsets"):
        if lenient:
            return 0
        say(f"GPU {index}: FAILED: clock offsets need nvidia-ml-py with nvmlDeviceSetClockOffsets")
        return 1
    pynvml.nvmlInit()
    try:
        handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        done = []
        for name, kind in DOMAINS:
            current = info_for(kind)
            try:
                pynvml.nvmlDeviceGetClockOffsets(handle, ref(current))
            except pynvml.NVMLError as exc:
                if lenient and wanted[name] == 0:
                    continue
                say(f"GPU {index}: FAILED: the driver reports no {name} clock offset ({exc})")
                return 1
            low, high = current.minClockOffsetMHz, current.maxClockOffsetMHz
            if not low <= wanted[name] <= high:
                say(f"GPU {index}: FAILED: {name} offset {wanted[name]:+d} MHz is outside {low:+d}..{high:+d} MHz, "
                    "the range this driver reports")
                return 1
            if current.clockOffsetMHz != wanted[name]:
                pynvml.nvmlDeviceSetClockOffsets(handle, ref(info_for(kind, wanted[name])))
            check = info_for(kind)
            pynvml.nvmlDeviceGetClockOffsets(handle, ref(check))
            if check.clockOffsetMHz != wanted[name]:  # the binding does not raise on every failure: read back
                say(f"GPU {index}: FAILED: {name} offset reads {check.clockOffsetMHz:+d} MHz after setting "
                    f"{wanted[name]:+d} MHz")
                return 1
            done.append(f"{name} {wanted[name]:+d} MHz")
        if done:
            say(f"GPU {index}: clock offsets {', '.join(done)} (read back)")
        return 0
    except pynvml.NVMLError as exc:
        say(f"GPU {index}: FAILED: setting clock offsets: {exc}")
        return 1
    finally:
        pynvml.nvmlShutdown()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
