"""pyinfra facts about a Linux rig's GPUs."""

from __future__ import annotations

from dataclasses import dataclass

from pyinfra.api import FactBase

from rigkit.gpu.nvsmi import EXIT_MARK, QUERY_FIELDS, GpuReport, parse_query, query_arguments, query_command
from rigkit.preflight.checks import DriverState
from rigkit.preflight.facts import NvidiaDriver
from rigkit.rigread import NVIDIA_SMI_S, bounded


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

