"""The preflight's decisions. Pure functions: no pyinfra, tested directly.

Every problem is one line for the person at the rig: which rig, which GPU or model, the
numbers, and the fix. Background (docs/base.md): after a driver upgrade without a reboot
the kernel module and the user-space library differ and NVML refuses to start; GeForce
cards get no CUDA forward compatibility, so the driver must be at least what the image's
CUDA needs; RTX 50 and RTX PRO Blackwell (sm_120) need images built for sm_120.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from rigkit.config import gpu_models
from rigkit.config.schema import ModelConfig, RigConfig
from rigkit.gpu.driver import DriverState, GpuArch
from rigkit.plumbing.rig_reads import TIMED_OUT_CODES

NVML_MISMATCH_EXIT = 18  # nvidia-smi: "Failed to initialize NVML: Driver/library version mismatch"

INSTALL_DRIVER = (
    "install the NVIDIA driver first (Debian: `apt install nvidia-driver` from contrib non-free non-free-firmware; "
    "Ubuntu: `ubuntu-drivers install`), reboot, and deploy again; rigkit does not install the driver"
)


def version_tuple(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"[0-9]+", text))


def cc_name(cc: tuple[int, int]) -> str:
    return f"sm_{cc[0]}{cc[1]}"


def arch_runs_on(arch: str, cc: tuple[int, int]) -> bool:
    """Does code built for `arch` run on a GPU of compute capability `cc`? CUDA's rules: machine code
    (sm_XY) runs on the same major version with an equal or higher minor; arch-specific code
    (sm_XYa, sm_XYf) only on X.Y; PTX (compute_XY) is JIT-compiled for X.Y and anything newer."""
    match = re.fullmatch(r"(sm|compute)_([0-9]+)([0-9])([af]?)", arch)
    if not match:
        return False
    kind, major, minor, suffix = match[1], int(match[2]), int(match[3]), match[4]
    if kind == "compute":
        return cc >= (major, minor)
    if suffix:
        return cc == (major, minor)
    return cc[0] == major and cc[1] >= minor


def _image(model: ModelConfig) -> str:
    cuda = model.spec.image_requires.cuda if model.spec.image_requires else None
    return f"image {model.spec.image}{f' (CUDA {cuda})' if cuda else ''} of model {model.name} ({model.file})"


def driver_problems(rig: RigConfig, driver: DriverState) -> list[str]:
    """The driver is installed, its module and library agree, and it is new enough for every image."""
    if not driver.installed:
        return [f"the NVIDIA driver is not installed (no nvidia-smi on the rig): {INSTALL_DRIVER}"]
    module, library = driver.module_version, driver.library_version
    mismatch = driver.exit_code == NVML_MISMATCH_EXIT or (
        module and library and version_tuple(module) != version_tuple(library))
    if mismatch:
        return [
            f"the NVIDIA driver's kernel module ({module or 'version unreadable'}) and its library "
            f"({library or 'version unknown'}) disagree (NVML: Driver/library version mismatch; GPU containers "
            "fail until this is fixed): reboot to finish the driver upgrade, then deploy again"
        ]
    if driver.exit_code in TIMED_OUT_CODES:
        return [f"{driver.error}: check the driver on the rig (`dmesg`, `nvidia-smi`); a GPU reset or a reboot "
                "clears a wedged GPU"]
    if driver.error or not library:
        return [f"nvidia-smi failed with exit code {driver.exit_code}: {driver.error or 'no driver version'}; "
                "check the driver with `nvidia-smi` on the rig"]
    gpus = ", ".join(f"GPU {g.index} ({g.name})" for g in driver.gpus) or "its GPUs"
    return [
        f"driver {library} is older than {m.spec.image_requires.driver_min}, the minimum for {_image(m)}, "
        f"for {gpus}: upgrade the driver to {m.spec.image_requires.driver_min} or newer (with base.hold_driver: "
        "false while you upgrade) and reboot, or serve an image built for an older CUDA"
        for m in _with_requirements(rig)
        if version_tuple(library) < version_tuple(m.spec.image_requires.driver_min)
    ]


def arch_problems(rig: RigConfig, gpus: list[GpuArch], source: str) -> list[str]:
    """Every GPU a model runs on has an architecture its image was built for. `source` says where
    the compute capabilities came from, for the message."""
    by_index = {g.index: g for g in gpus}
    problems = []
    for model in _with_requirements(rig):
        archs = model.spec.image_requires.archs
        if not archs:
            continue
        for index in model.spec.gpus:
            gpu = by_index.get(index)
            if gpu is None or gpu.compute_capability is None:
                continue
            if not any(arch_runs_on(a, gpu.compute_capability) for a in archs):
                cc = gpu.compute_capability
                problems.append(
                    f"GPU {index} ({gpu.name}, compute capability {cc[0]}.{cc[1]} {source}) needs {cc_name(cc)}, "
                    f"but {_image(model)} is built for {', '.join(archs)} only (vLLM would fail with "
                    f"\"no kernel image is available\"): serve an image built for {cc_name(cc)} and list it "
                    "in the catalog's image_requires.archs"
                )
    return problems


def offline_findings(rig: RigConfig) -> tuple[list[str], list[str]]:
    """What `rigkit check` can say without the rig: architectures from the rig file's GPU models,
    and the driver minimum against `base.driver_version` when the rig file states it.
    Returns (problems, notes)."""
    gpus = []
    notes = []
    for gpu in rig.spec.gpus:
        info = gpu_models.lookup(gpu.model)
        gpus.append(GpuArch(gpu.index, gpu.model, info.compute_capability if info else None))
        if info is None:
            notes.append(f"GPU {gpu.index} ({gpu.model!r}): not in rigkit's GPU table (rigkit/config/gpu_models.py), "
                         "so its power-limit range and architecture checks were skipped here; the deploy checks "
                         "what the rig reports")
    problems = arch_problems(rig, gpus, "for this model")
    needs = [m for m in _with_requirements(rig)]
    if needs and rig.spec.base.driver_version:
        problems += driver_problems(rig, DriverState(True, rig.spec.base.driver_version,
                                                     rig.spec.base.driver_version, tuple(gpus)))
    elif needs:
        lowest = max(version_tuple(m.spec.image_requires.driver_min) for m in needs)
        advice = " (set base.driver_version to check it here)" if rig.spec.os == "linux" else ""
        notes.append(f"driver {'.'.join(map(str, lowest))} or newer is needed by this rig's images; the deploy "
                     f"checks the rig's driver{advice}")
    return problems, notes


@dataclass(frozen=True)
class WeightsNeed:
    model: str
    source: str
    source_bytes: int
    on_volume_bytes: int  # already copied (a resumed copy needs only the rest)

    @property
    def missing_bytes(self) -> int:
        return max(0, self.source_bytes - self.on_volume_bytes)


def disk_problems(needs: list[WeightsNeed], free_bytes: int | None, docker_dir: str,
                  move: str = "move Docker's data-root to a bigger disk") -> list[str]:
    """The weights still to copy fit in the free space where Docker keeps its volumes (`move`: how
    to put them on another disk, for the message)."""
    total = sum(n.missing_bytes for n in needs)
    if not total or free_bytes is None or total <= free_bytes:
        return []
    parts = " + ".join(f"{n.model} {_gb(n.missing_bytes)}" for n in needs if n.missing_bytes)
    return [
        f"not enough disk for the weights: {parts} = {_gb(total)} to copy, but {docker_dir} has "
        f"{_gb(free_bytes)} free: free {_gb(total - free_bytes)} there, {move}, or serve fewer models from this rig"
    ]


def _gb(count: int) -> str:
    return f"{count / 1e9:.1f} GB"


def _with_requirements(rig: RigConfig) -> list[ModelConfig]:
    return [m for m in rig.models if m.spec.image_requires is not None]
