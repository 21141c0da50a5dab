"""pyinfra facts the preflight reads. Read-only, POSIX shell only (a bare OS may have no python3)."""

from __future__ import annotations

import re
import shlex

from pyinfra.api import FactBase

from rigkit.preflight.checks import DriverState, GpuArch
from rigkit.rigread import DOCKER_S, NVIDIA_SMI_S, TIMED_OUT_CODES, bounded, no_answer

_EXIT = "rigkit-exit="
NVSMI = bounded("nvidia-smi", NVIDIA_SMI_S)


class NvidiaDriver(FactBase):
    """The driver's library and kernel module versions and each GPU's compute capability.

    The library's version is nvidia-smi's `driver_version`; when NVML refuses to start
    ("Driver/library version mismatch", exit 18) it is the `NVML library version` nvidia-smi
    prints with that error. The module's is /sys/module/nvidia/version, else the version in
    /proc/driver/nvidia/version (absent when the module is not loaded).
    """

    def command(self) -> str:
        return (
            "command -v nvidia-smi >/dev/null 2>&1 || { echo rigkit-no-nvidia-smi; exit 0; }; "
            'echo "module-sys=$(cat /sys/module/nvidia/version 2>/dev/null)"; '
            'echo "module-proc=$(head -n 1 /proc/driver/nvidia/version 2>/dev/null)"; '
            # One nvidia-smi start (50-300 ms on a rig) where the driver knows compute_cap (2021 on).
            # Drivers without it refuse the whole query; they are asked again without it, and the
            # rig file's GPU model then says what the architecture is.
            # A wedged driver is asked once (the time limit, then its exit status), never again.
            f"out=$({NVSMI} --query-gpu=index,name,driver_version,compute_cap --format=csv,noheader 2>/dev/null); c=$?; "
            'if [ $c -eq 0 ]; then printf "%s\\n" "$out" | sed "s/^/gpu-cc=/"; echo "' + _EXIT + '0"; '
            f'elif [ $c -eq 124 ] || [ $c -eq 137 ]; then echo "{_EXIT}$c"; '
            f"else {NVSMI} --query-gpu=index,name,driver_version --format=csv,noheader 2>&1; "
            f'echo "{_EXIT}$?"; fi; exit 0'
        )

    def process(self, output) -> DriverState:
        lines = [line.rstrip() for line in output]
        if "rigkit-no-nvidia-smi" in lines:
            return DriverState(installed=False)
        module, body, exit_code, caps = None, [], 0, {}
        for line in lines:
            if line.startswith("module-sys="):
                module = line.split("=", 1)[1].strip() or module
            elif line.startswith("module-proc="):
                found = re.search(r"Kernel Module.*?\s([0-9]+\.[0-9]+(?:\.[0-9]+)?)\s", line + " ")
                module = module or (found[1] if found else None)
            elif line.startswith(_EXIT):
                exit_code = int(line[len(_EXIT):])
            elif line.startswith("gpu-cc="):  # index, name, driver_version, compute_cap
                line = line[len("gpu-cc="):]
                if line.count(",") >= 3:  # else not a GPU row (a warning): kept whole, as before
                    line, _, cc = line.rpartition(",")
                    index = line.split(",", 1)[0].strip()
                    if re.fullmatch(r"\s*[0-9]+\.[0-9]+\s*", cc) and index.isdigit():
                        major, minor = cc.strip().split(".")
                        caps[int(index)] = (int(major), int(minor))
                if line.strip():
                    body.append(line.strip())
            elif line.strip():
                body.append(line.strip())
        if exit_code in TIMED_OUT_CODES:
            return DriverState(True, None, module, (), exit_code,
                               no_answer("nvidia-smi", NVIDIA_SMI_S) + " (a wedged GPU or driver)")
        if exit_code != 0:
            nvml = re.search(r"NVML library version:\s*([0-9.]+)", " ".join(body))
            return DriverState(True, nvml[1] if nvml else None, module, (), exit_code,
                               " ".join(body) or f"nvidia-smi exited {exit_code}")
        gpus, versions = [], set()
        for line in body:
            cells = [c.strip() for c in line.split(",")]
            if len(cells) != 3 or not cells[0].isdigit():
                return DriverState(True, None, module, (), exit_code, f"unexpected nvidia-smi line: {line!r}")
            gpus.append(GpuArch(int(cells[0]), cells[1], caps.get(int(cells[0]))))
            versions.add(cells[2])
        return DriverState(True, min(versions) if versions else None, module, tuple(gpus))


class DockerDiskFree(FactBase):
    """Free bytes where Docker keeps its volumes: `docker info`'s root dir (/var/lib/docker where
    Docker is not installed yet), measured on its nearest existing folder.
    Returns {"dir": str, "free_bytes": int | None}."""

    def command(self) -> str:
        return (
            f"d=$({bounded('docker', DOCKER_S)} info --format '{{{{.DockerRootDir}}}}' 2>/dev/null) || d=; "
            '[ -n "$d" ] || d=/var/lib/docker; [ -d "$d/volumes" ] && d="$d/volumes"; p="$d"; n=0; '
            'while [ ! -e "$p" ] && [ $n -lt 64 ]; do p=$(dirname "$p"); n=$((n+1)); done; '
            'echo "dir=$d"; df -P -B1 "$p" 2>/dev/null | tail -n 1'
        )

    def process(self, output) -> dict:
        lines = list(output)
        folder = next((line[4:] for line in lines if line.startswith("dir=")), "/var/lib/docker")
        cells = lines[-1].split() if lines else []
        free = int(cells[3]) if len(cells) >= 4 and cells[3].isdigit() else None
        return {"dir": folder, "free_bytes": free}


class WeightsBytes(FactBase):
    """Bytes of a model's weights source (symlinks followed, as the copier reads them) and bytes
    already on its volume. Returns {"source_bytes": int | None, "volume_bytes": int}."""

    def command(self, source: str, volume: str) -> str:
        return (
            f"s=$(du -s -b -L -- {shlex.quote(source)} 2>/dev/null | cut -f1); echo \"source=$s\"; "
            f"mp=$({bounded('docker', DOCKER_S)} volume inspect --format '{{{{.Mountpoint}}}}' {shlex.quote(volume)} 2>/dev/null) "
            '&& [ -d "$mp" ] && echo "volume=$(du -s -b -- "$mp" 2>/dev/null | cut -f1)"; exit 0'
        )

    def process(self, output) -> dict:
        values = dict(line.split("=", 1) for line in output if "=" in line)
        source = values.get("source", "").strip()
        volume = values.get("volume", "").strip()
        return {"source_bytes": int(source) if source.isdigit() else None,
                "volume_bytes": int(volume) if volume.isdigit() else 0}
