"""The Windows preflight's decisions (roles/windows.py runs them before anything on the rig changes).
Pure: no pyinfra, tested directly. What the fact read (`WindowsPreflightFacts`) comes in as
`PreflightFacts`; every problem is one line naming the setting and the fix.

What must hold (docs/windows.md, "Preflight"):
- Docker Desktop answers, on the WSL2 backend (its engine's kernel is WSL2's), with a Compose that
  reads `env_file` entries with `format: raw` where the rig has an API key (Compose 2.30.0,
  docker/compose#12179);
- a short-lived GPU container sees the GPUs (`nvidia-smi` inside it), with a driver new enough for
  every image and an architecture every image was built for (the Linux checks, rigkit.preflight.checks);
- the WSL2 VM has the memory the rig's models need (`wsl_memory_gb`, written to .wslconfig, or the
  VM as it is), and not more than Windows has;
- the drive that holds Docker Desktop's disk image has room for the weights still to copy.
Host networking is not used on Windows (each model is published on loopback), so neither Docker
Desktop's "Enable host networking" nor Enhanced Container Isolation matters to rigkit.
"""

from __future__ import annotations

import base64
import json
import re
from dataclasses import dataclass, field

from rigkit.config.schema import RigConfig
from rigkit.gpu.driver import DriverState, GpuArch
from rigkit.preflight.checks import WeightsNeed, arch_problems, disk_problems, driver_problems, version_tuple
from rigkit.rigside.names import project_name, volume_name

GIB = 1024 ** 3
# Compose reads `env_file: [{path, format: raw}]` (the API key's env file) from 2.30.0 on (docker/compose#12179).
COMPOSE_MIN = "2.30.0"
# The WSL2 backend's engine runs on Microsoft's WSL2 kernel ("5.15.167.4-microsoft-standard-WSL2"); the
# Hyper-V backend's on Docker's LinuxKit kernel ("6.10.14-linuxkit").
WSL2_KERNEL = "microsoft-standard-WSL2"
# What the VM needs beside the models (an estimate, docs/windows.md): Docker Desktop's own services
# and the VM's kernel; per GPU a model runs on, one vLLM worker's host memory (CUDA context, Python,
# PyTorch) beside its weights, which it reads through the page cache while loading.
VM_RESERVE_GIB = 2
WORKER_GIB_PER_GPU = 4
# The VM's memory as `docker info` reports it is a little under .wslconfig's `memory=` (its kernel
# keeps some): within this share below it, the VM runs with that setting.
VM_MEMORY_SLACK = 0.10
WSLCONFIG_SECTION = "wsl2"


@dataclass(frozen=True)
class Answer:
    """One docker.exe call: its exit code (-1: did not start or ran past its deadline) and output."""

    exit_code: int
    output: str
    timed_out: bool = False


@dataclass(frozen=True)
class PreflightFacts:
    version: Answer  # docker.exe version --format '{{json .}}'
    info: Answer  # docker.exe info --format '{{json .}}'
    compose: Answer  # docker.exe compose version --short
    gpu: Answer | None  # nvidia-smi in a GPU container; None: not run (no model)
    serving: Answer  # docker.exe ps: the compose projects of running containers
    volumes: Answer  # docker.exe volume ls: the volumes that exist
    user_profile: str  # %UserProfile% of the SSH account
    host_memory_bytes: int | None  # Windows' physical memory
    disk_dir: str  # Docker Desktop's disk image folder (%LOCALAPPDATA%\Docker\wsl)
    disk_free_bytes: int | None  # free on its drive
    wslconfig: str | None  # %UserProfile%\.wslconfig's text, None where there is none
    source_bytes: dict[str, int | None] = field(default_factory=dict)  # per model with weights on a volume

    def version_json(self) -> dict:
        return _json(self.version)

    def info_json(self) -> dict:
        return _json(self.info)


def _json(answer: Answer) -> dict:
    """The JSON line of a `--format '{{json .}}'` answer (docker.exe's stderr follows it: warnings)."""
    line = next((line for line in answer.output.splitlines() if line.startswith("{")), None)
    try:
        value = json.loads(line) if answer.exit_code == 0 and line else {}
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def docker_desktop_version(facts: PreflightFacts) -> str | None:
    """"4.37.1" from `Server.Platform.Name` ("Docker Desktop 4.37.1 (178610)"), or None."""
    name = ((facts.version_json().get("Server") or {}).get("Platform") or {}).get("Name") or ""
    found = re.match(r"Docker Desktop ([0-9][0-9.]*)", name)
    return found[1] if found else None


def _late(answer: Answer, what: str) -> str:
    return f"{what} did not answer within its deadline" if answer.timed_out else f"{what} failed ({answer.output.strip()[-300:] or f'exit code {answer.exit_code}'})"


def docker_problems(rig: RigConfig, facts: PreflightFacts) -> list[str]:
    """Docker Desktop answers, on the WSL2 backend, with a Compose new enough for the rig's files."""
    if facts.version.exit_code != 0 or not (facts.version_json().get("Server")):
        return [f"Docker Desktop's engine is not reachable: {_late(facts.version, 'docker.exe version')}: start "
                "Docker Desktop as the SSH user (it must be running, with its engine started) and deploy again"]
    if docker_desktop_version(facts) is None:
        name = ((facts.version_json().get("Server") or {}).get("Platform") or {}).get("Name") or "an unnamed engine"
        return [f"docker.exe reaches {name!r}, not Docker Desktop: rigkit's Windows rigs need Docker Desktop's "
                "engine (GPU containers through WSL2, C:\\ bind sources); switch the context with `docker context use "
                "desktop-linux`"]
    problems = []
    kernel = facts.version_json()["Server"].get("KernelVersion") or facts.info_json().get("KernelVersion") or ""
    if WSL2_KERNEL not in kernel:
        problems.append(f"Docker Desktop runs its engine on kernel {kernel or 'unknown'!r}, not on WSL2: switch on "
                        "Settings > General > \"Use the WSL 2 based engine\" (GPU containers need the WSL2 backend)")
    compose = facts.compose.output.strip().lstrip("v")
    if rig.spec.api_key_file and (facts.compose.exit_code != 0 or version_tuple(compose or "0") < version_tuple(COMPOSE_MIN)):
        problems.append(f"Docker Compose {compose or 'unknown'} is older than {COMPOSE_MIN}, which the API key's env "
                        "file needs (`format: raw`): update Docker Desktop (Settings > Software updates)")
    return problems


def gpu_problems(rig: RigConfig, facts: PreflightFacts, image: str | None) -> tuple[list[str], DriverState | None]:
    """nvidia-smi inside a GPU container sees the rig's GPUs; then the Linux driver and architecture
    checks on what it reported. Returns (problems, the driver as the container saw it)."""
    if facts.gpu is None:
        return [], None
    answer = facts.gpu
    if answer.exit_code != 0 and "No such image" in answer.output:
        return [], None  # not pulled yet: the caller warns; the bootstrap pulls it
    if answer.exit_code != 0:
        return [f"no GPU inside a container ({_late(answer, f'nvidia-smi in a GPU container of {image}')}): update "
                "the NVIDIA Windows driver (it brings WSL2's GPU support) and WSL (`wsl --update`), restart Docker "
                "Desktop, and check `docker run --rm --gpus all <image> nvidia-smi`"], None
    gpus, library = [], None
    for line in answer.output.strip().splitlines():
        cells = [c.strip() for c in line.split(",")]
        if len(cells) != 4 or not cells[0].isdigit():
            continue
        found = re.fullmatch(r"([0-9]+)\.([0-9]+)", cells[3])
        gpus.append(GpuArch(int(cells[0]), cells[1], (int(found[1]), int(found[2])) if found else None))
        library = library or cells[2]
    seen = {g.index for g in gpus}
    missing = sorted({i for m in rig.models for i in m.spec.gpus} - seen)
    problems = [f"GPU {', '.join(map(str, missing))} of the rig's models is not visible inside a container (it sees "
                f"{', '.join(map(str, sorted(seen))) or 'none'}): check Docker Desktop's GPU support and the driver"] if missing else []
    driver = DriverState(True, library, library, tuple(gpus))
    problems += driver_problems(rig, driver)
    problems += arch_problems(rig, gpus, "inside a container")
    return problems, driver


def needed_memory_bytes(rig: RigConfig) -> tuple[int, list[str]]:
    """The VM memory the rig's models need (estimate: VM_RESERVE_GIB, each model's weight_bytes and
    WORKER_GIB_PER_GPU per GPU), and the models whose weight_bytes the catalog does not give."""
    total = VM_RESERVE_GIB * GIB
    unknown = []
    for model in rig.models:
        total += WORKER_GIB_PER_GPU * GIB * len(model.spec.gpus)
        if model.spec.weight_bytes:
            total += model.spec.weight_bytes
        else:
            unknown.append(model.name)
    return total, unknown


def vm_applied(rig: RigConfig, facts: PreflightFacts) -> bool:
    """Does the running VM have the rig's `wsl_memory_gb` (its memory within VM_MEMORY_SLACK below it)?"""
    memory = facts.info_json().get("MemTotal")
    wanted = (rig.spec.wsl_memory_gb or 0) * GIB
    return isinstance(memory, int) and wanted * (1 - VM_MEMORY_SLACK) <= memory <= wanted


def memory_problems(rig: RigConfig, facts: PreflightFacts, will_apply: bool) -> list[str]:
    """The VM's memory (rig's `wsl_memory_gb` where it will be applied, else the running VM's) covers
    what the models need; `wsl_memory_gb` is at most Windows' memory."""
    need, _ = needed_memory_bytes(rig)
    memory_gb, host = rig.spec.wsl_memory_gb, facts.host_memory_bytes
    where = f"wsl_memory_gb in {rig.file}"
    if memory_gb and host and memory_gb * GIB > host:
        return [f"{where} is {memory_gb} GB, more than the {host / GIB:.1f} GB Windows has: lower it"]
    if memory_gb and will_apply:
        have, what = memory_gb * GIB, f"wsl_memory_gb {memory_gb} GB"
    else:
        have = facts.info_json().get("MemTotal")
        if not isinstance(have, int):
            return []  # docker info did not answer: docker_problems says so
        what = "the WSL2 VM's memory " + (f"({have / GIB:.1f} GB, docker info; .wslconfig's memory= takes effect after "
                                           "`wsl --shutdown`, which rigkit runs only while no model is serving)"
                                           if memory_gb else f"({have / GIB:.1f} GB, docker info)")
    if need <= have:
        return []
    fix = (f"raise wsl_memory_gb in {rig.file} to {-(-need // GIB)} or more" if memory_gb and will_apply else
           "stop the models (`docker compose -p rigkit-<model> down`) so rigkit can restart WSL with wsl_memory_gb"
           if memory_gb else f"set wsl_memory_gb: {-(-need // GIB)} (or more) in {rig.file}; rigkit writes it to "
           "%UserProfile%\\.wslconfig")
    return [f"{what} is less than the {need / GIB:.1f} GB the models need ({_need_arithmetic(rig)}): {fix}"]


def _need_arithmetic(rig: RigConfig) -> str:
    parts = [f"VM {VM_RESERVE_GIB} GB"]
    for model in rig.models:
        weights = f"{model.spec.weight_bytes / GIB:.1f} GB weights + " if model.spec.weight_bytes else ""
        parts.append(f"{model.name} {weights}{WORKER_GIB_PER_GPU} GB x {len(model.spec.gpus)} GPU")
    return " + ".join(parts)


def weights_needs(rig: RigConfig, facts: PreflightFacts) -> list[WeightsNeed]:
    """The weights still to copy: each volume-stored model whose volume does not exist yet (a
    volume that exists holds a complete or resumable copy, which the copy finishes)."""
    existing = set(facts.volumes.output.split()) if facts.volumes.exit_code == 0 else set()
    needs = []
    for model in rig.models:
        size = facts.source_bytes.get(model.name)
        if model.spec.weights.storage == "volume" and volume_name(model) not in existing and size:
            needs.append(WeightsNeed(model.name, model.spec.weights.source, max(size, model.spec.weight_bytes or 0), 0))
    return needs


def serving_models(rig: RigConfig, facts: PreflightFacts) -> list[str]:
    """The rig's models with a running container (their compose project in `docker ps`)."""
    running = set(facts.serving.output.split())
    return [m.name for m in rig.models if project_name(m) in running]


def wslconfig_text(existing: str | None, memory_gb: int | None, swap_gb: int | None) -> str | None:
    """`existing` (.wslconfig) with `memory=` and `swap=` of its [wsl2] section set to the rig's values
    (Microsoft: learn.microsoft.com/windows/wsl/wsl-config, sizes as `<n>GB`, `swap=0` for none); every
    other line kept as it is. None where the rig sets neither (rigkit leaves the file alone)."""
    wanted = {k: v for k, v in (("memory", f"{memory_gb}GB" if memory_gb else None),
                                ("swap", (f"{swap_gb}GB" if swap_gb else "0") if swap_gb is not None else None)) if v}
    if not wanted:
        return None
    newline = "\r\n" if existing is None or "\r\n" in existing else "\n"
    lines = (existing or "").splitlines()
    out, section, done = [], None, set()

    def missing() -> list[str]:
        return [f"{key}={value}" for key, value in wanted.items() if key not in done]

    for line in lines:
        header = re.fullmatch(r"\s*\[([^\]]*)\]\s*", line)
        if header:
            if section == WSLCONFIG_SECTION:
                out += missing()
                done |= set(wanted)
            section = header[1].strip().lower()
        key = re.match(r"\s*([A-Za-z]+)\s*=", line)
        if section == WSLCONFIG_SECTION and key and key[1].lower() in wanted:
            name = key[1].lower()
            if name not in done:
                out.append(f"{name}={wanted[name]}")
                done.add(name)
            continue
        out.append(line)
    if section == WSLCONFIG_SECTION:
        out += missing()
    elif missing():
        out += ([""] if out and out[-1].strip() else []) + [f"[{WSLCONFIG_SECTION}]"] + missing()
    return newline.join(out) + newline


ABSENT = "rigkit-absent"  # rigkit.windows.facts.ABSENT (that module imports this one)


def parse_preflight(lines: list[str]) -> PreflightFacts:
    """The sections `rigkit.windows.facts.preflight_script` prints: `rigkit-section=NAME`, then for a
    docker.exe call `rigkit-exit=N timed-out=True|False` and its output."""
    sections: dict[str, list[str]] = {}
    current = None
    for line in lines:
        if line.startswith("rigkit-section="):
            current = line.split("=", 1)[1].strip()
            sections[current] = []
        elif current is not None:
            sections[current].append(line)

    def answer(name: str) -> Answer | None:
        body = sections.get(name)
        if body is None:
            return None
        found = re.fullmatch(r"rigkit-exit=(-?[0-9]+) timed-out=(True|False)", body[0].strip()) if body else None
        if not found:
            return Answer(-1, "\n".join(body))
        return Answer(int(found[1]), "\n".join(body[1:]), found[2] == "True")

    host = dict(line.split("=", 1) for line in sections.get("host", []) if "=" in line)
    wslconfig = "".join(sections.get("wslconfig", [])).strip()  # base64 of its bytes, or ABSENT
    sources = {}
    for name, body in sections.items():
        if name.startswith("source "):
            value = "".join(body).strip()
            sources[name[len("source "):]] = int(value) if value.isdigit() else None
    missing = Answer(-1, "no answer")
    return PreflightFacts(
        version=answer("version") or missing, info=answer("info") or missing, compose=answer("compose") or missing,
        gpu=answer("gpu"), serving=answer("serving") or missing, volumes=answer("volumes") or missing,
        user_profile=host.get("profile", "").strip(),
        host_memory_bytes=int(host["memory"]) if host.get("memory", "").strip().isdigit() else None,
        disk_dir=host.get("disk-dir", "").strip(),
        disk_free_bytes=int(host["disk-free"]) if host.get("disk-free", "").strip().isdigit() else None,
        wslconfig=None if wslconfig == ABSENT else _text(wslconfig),
        source_bytes=sources,
    )


def _text(base64_bytes: str) -> str:
    """.wslconfig's text from its bytes (UTF-8, with or without a BOM; UTF-16 where Notepad's
    "Unicode" or PowerShell 5.1's Out-File wrote it)."""
    data = base64.b64decode(base64_bytes or "", validate=False)
    if data.startswith((b"\xff\xfe", b"\xfe\xff")):
        return data.decode("utf-16")
    return data.decode("utf-8-sig", errors="replace")


def preflight_problems(rig: RigConfig, facts: PreflightFacts, image: str | None, will_apply: bool) -> list[str]:
    """Every refusal, in order; empty: go on. `will_apply`: the deploy will restart WSL with the rig's
    wsl_memory_gb (it changed, or the VM runs without it, and no model is serving)."""
    problems = docker_problems(rig, facts)
    if problems and not facts.version_json().get("Server"):
        return problems  # no engine: nothing else can be read
    problems += gpu_problems(rig, facts, image)[0]
    problems += memory_problems(rig, facts, will_apply)
    problems += disk_problems(weights_needs(rig, facts), facts.disk_free_bytes,
                              f"the drive of Docker Desktop's disk image ({facts.disk_dir})",
                              "move Docker Desktop's disk image to a bigger drive (Settings > Resources > Advanced)")
    return problems
