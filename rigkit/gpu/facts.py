"""pyinfra facts about a Linux rig's GPUs and its NVIDIA driver (read-only, POSIX shell only)."""

from __future__ import annotations

import re
from dataclasses import dataclass

from pyinfra.api import FactBase

from rigkit.gpu.driver import DriverState, GpuArch
from rigkit.gpu.nvsmi import EXIT_MARK, QUERY_FIELDS, GpuReport, parse_query, query_arguments, query_command
from rigkit.plumbing.rig_reads import NVIDIA_SMI_S, TIMED_OUT_CODES, bounded, no_answer

_EXIT = "rigkit-exit="
NVSMI = bounded("nvidia-smi", NVIDIA_SMI_S)


class NvidiaGpus(FactBase):
    """Each GPU's name, power limits and persistence mode, as nvidia-smi reports them.

    Returns None where nvidia-smi is not installed; a GpuReport with `error` set
    where it is installed but failed (driver not loaded, no permission).
    """

    requires_command = "nvidia-smi"

    def command(self) -> str:
        return query_command()

    def process(self, output) -> GpuReport:
        return parse_query(list(output))


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


@dataclass(frozen=True)
class DriverAndGpus:
    driver: DriverState  # NvidiaDriver's answer: what the preflight checks
    gpus: GpuReport | None  # NvidiaGpus's answer: what the GPU report and policy check; None: no nvidia-smi


DRIVER_FIELDS = ("index", "name", "driver_version", "compute_cap")  # NvidiaDriver's query
_BOTH_FIELDS = DRIVER_FIELDS + QUERY_FIELDS[2:]  # then uuid, the power limits, ...
_ROW = "gpu-row="
_REPORT = "gpu-report="


class NvidiaDriverAndGpus(FactBase):
    """NvidiaDriver's and NvidiaGpus's answers from one nvidia-smi start where the driver
    answers both queries as one (a current driver: every field is known since 2021).

    nvidia-smi is the slowest command a converged deploy runs (it starts NVML: 50-300 ms on a
    rig, more with many GPUs), and the preflight and the GPU report both ask it. Where the
    one query is refused (a driver from before compute_cap, a field the GPU does not know, NVML
    not starting), each fact's own command runs, so what is reported is what each reports
    alone (tests/test_preflight.py compares them), for one nvidia-smi start more. One
    difference, on purpose: a warning nvidia-smi prints on stderr among good rows failed the
    GPU report alone (after the base role had run); it now fails the preflight too, before
    anything on the rig changes."""

    def command(self) -> str:
        fields = ",".join(_BOTH_FIELDS)
        report = " ".join(query_arguments())
        nvsmi = bounded("nvidia-smi", NVIDIA_SMI_S)
        return (
            "command -v nvidia-smi >/dev/null 2>&1 || { echo rigkit-no-nvidia-smi; exit 0; }; "
            'echo "module-sys=$(cat /sys/module/nvidia/version 2>/dev/null)"; '
            'echo "module-proc=$(head -n 1 /proc/driver/nvidia/version 2>/dev/null)"; '
            # 2>&1 as NvidiaGpus alone: a warning nvidia-smi prints is a line that is not a GPU row.
            f"out=$({nvsmi} --query-gpu={fields} --format=csv,noheader,nounits 2>&1); c=$?; if [ $c -eq 0 ]; then "
            f'printf "%s\\n" "$out" | sed "s/^/{_ROW}/"; echo rigkit-exit=0; echo "{_REPORT}{EXIT_MARK}0"; '
            # A wedged driver (the time limit passed) is not asked twice more: both answers say so.
            f'elif [ $c -eq 124 ] || [ $c -eq 137 ]; then echo "rigkit-exit=$c"; echo "{_REPORT}{EXIT_MARK}$c"; '
            f"else ( {NvidiaDriver().command()} ) | sed '/^module-/d'; "
            f'out=$({nvsmi} {report} 2>&1); code=$?; printf "%s\\n" "$out" | sed "s/^/{_REPORT}/"; '
            f'echo "{_REPORT}{EXIT_MARK}$code"; fi; exit 0'
        )

    def process(self, output) -> DriverAndGpus:
        lines = list(output)  # each parser trims as it does alone
        if "rigkit-no-nvidia-smi" in (line.rstrip() for line in lines):
            return DriverAndGpus(NvidiaDriver().process(lines), None)
        driver, report = [], []
        for line in lines:
            if line.startswith(_ROW):
                row = line[len(_ROW):]
                cells = row.split(",")
                if len(cells) == len(_BOTH_FIELDS):
                    driver.append("gpu-cc=" + ",".join(cells[:len(DRIVER_FIELDS)]))
                    report.append(",".join(cells[:2] + cells[len(DRIVER_FIELDS):]))
                else:  # not a GPU row (a warning): each parser reports it whole, as alone
                    driver.append("gpu-cc=" + row)
                    report.append(row)
            elif line.startswith(_REPORT):
                report.append(line[len(_REPORT):])
            else:
                driver.append(line)
        return DriverAndGpus(NvidiaDriver().process(driver), parse_query(report))

