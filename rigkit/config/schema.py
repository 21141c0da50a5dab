"""The configuration schema: what a rig file and a model catalog entry may say, and the
validated objects every role receives (`RigConfig`, `ModelConfig`).

Strict pydantic models: a quoted "330" is a typo, not a number; unknown keys are errors.
Reference for every field and its default: docs/configuration.md.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PlainValidator,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from rigkit.config import gpu_models
from rigkit.config.names import name_problem
from rigkit.rigside.names import HUB_CACHE_DIR

MAX_GPUS_PER_RIG = 8
MAX_MODELS_ON_DEMAND = 16


class _Strict(BaseModel):
    # strict: a quoted "330" is a typo, not a number; extra=forbid: unknown keys are errors.
    # allow_inf_nan=False: `.inf` and `.nan` are YAML floats, never a limit or a rate.
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False)


# ----- rig file ---------------------------------------------------------------

_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
# A vLLM option value that names something (quantization method, parser, speculative method): vLLM's
# own names are lowercase words with '_' or '-' (awq_marlin, compressed-tensors, deepseek_r1, mtp).
_TOKEN = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")


def _no_control(value: str | None) -> str | None:
    if value is not None and _CONTROL.search(value):
        raise ValueError("may not contain a line break or another control character")
    return value


def _token(value: str | None) -> str | None:
    if value is not None and not _TOKEN.fullmatch(value):
        raise ValueError("expected one of vLLM's names: letters, digits, '_', '-' and '.', at most 64 characters, "
                         "no spaces (e.g. awq_marlin, gptq, fp8, compressed-tensors)")
    return value


def _single_word(value: str | None) -> str | None:
    if value is not None and (not value or re.search(r"[\s\x00-\x1f\x7f]", value)):
        raise ValueError("expected a Hugging Face model id or a path on the rig, without spaces or control characters")
    return value


def _follows_name_rule(value: str | None) -> str | None:
    if value is not None and (problem := name_problem(value)):
        raise ValueError(problem)
    return value


class ClockLock(_Strict):
    floor_mhz: int
    ceiling_mhz: int

    def as_nvidia_smi_arg(self) -> str:
        return f"{self.floor_mhz},{self.ceiling_mhz}"


CLOCK_LOCK_CEILING_MHZ = (100, 4000)  # a lock's ceiling (its floor: 0 up to the same top)


def _parse_clock_lock(value: Any) -> Any:
    """`2200` means [0, 2200] (floor 0 lets the card idle); or `[floor, ceiling]`."""
    if value is None or isinstance(value, ClockLock):
        return value
    if isinstance(value, bool):
        raise ValueError("expected a ceiling in MHz (2200) or [floor, ceiling] ([0, 2200])")
    if isinstance(value, int):
        value = [0, value]
    if not (isinstance(value, list) and len(value) == 2 and all(type(v) is int for v in value)):
        raise ValueError("expected a ceiling in MHz (2200) or [floor, ceiling] ([0, 2200])")
    floor, ceiling = value
    if floor > ceiling:
        raise ValueError(f"floor {floor} MHz is above ceiling {ceiling} MHz; write [floor, ceiling], e.g. [0, 2200]")
    if not 0 <= floor <= CLOCK_LOCK_CEILING_MHZ[1] or not CLOCK_LOCK_CEILING_MHZ[0] <= ceiling <= CLOCK_LOCK_CEILING_MHZ[1]:
        raise ValueError(f"floor must be 0-{CLOCK_LOCK_CEILING_MHZ[1]} MHz and ceiling "
                         f"{CLOCK_LOCK_CEILING_MHZ[0]}-{CLOCK_LOCK_CEILING_MHZ[1]} MHz")
    return ClockLock(floor_mhz=floor, ceiling_mhz=ceiling)


class ClockOffsets(_Strict):
    """NVML clock offsets in MHz (nvmlDeviceSetClockOffsets, P0), applied at boot by the GPU policy
    (Linux). NVML's memory value is the one `rigkit tune --mem-offsets` sweeps, not a slider's percent.
    The driver's own range is checked on the rig when they are applied."""

    memory: int = Field(default=0, ge=-20_000, le=20_000)
    graphics: int = Field(default=0, ge=-2_000, le=2_000)

    def as_policy_arg(self) -> str:
        return f"{self.memory},{self.graphics}"


class GpuSpec(_Strict):
    index: int = Field(ge=0, lt=MAX_GPUS_PER_RIG)
    model: str = Field(min_length=1)
    power_limit_w: int | None = Field(default=None, ge=1, le=1500)
    clock_lock_mhz: Annotated[ClockLock | None, BeforeValidator(_parse_clock_lock)] = None
    clock_offsets_mhz: ClockOffsets | None = None  # Linux only (docs/gpu-policy.md)

    @field_validator("power_limit_w")
    @classmethod
    def _within_reference_range(cls, value: int | None, info: ValidationInfo) -> int | None:
        known = gpu_models.lookup(info.data.get("model", ""))
        if value is not None and known and not known.power_min_w <= value <= known.power_max_w:
            raise ValueError(
                f"{value} W is outside {known.power_min_w}-{known.power_max_w} W, "
                f"the power-limit range of the {known.name}"
            )
        return value


# ----- rig file: the base role (docs/base.md) ---------------------------------

# An apt repository URL: http(s), host, port and path only, so it is safe in a sources list and in a
# shell. apt itself expands `$(ARCH)` (NVIDIA's repository line uses it).
_REPO_URL = re.compile(r"https?://[A-Za-z0-9.-]+(:[0-9]{1,5})?(/([A-Za-z0-9._~%+-]|\$\(ARCH\))*)*")
_KEY_URL = re.compile(r"https?://[A-Za-z0-9.-]+(:[0-9]{1,5})?(/[A-Za-z0-9._~%+-]*)*")
_VERSION = r"^[0-9]{1,4}(\.[0-9]{1,4}){0,2}$"  # a driver version as nvidia-smi prints it: 580.95.05

NVIDIA_REPO_URL = "https://nvidia.github.io/libnvidia-container/stable/deb/$(ARCH)"
NVIDIA_KEY_URL = "https://nvidia.github.io/libnvidia-container/gpgkey"


def _repo_url(value: str | None) -> str | None:
    if value is not None and not _REPO_URL.fullmatch(value):
        raise ValueError("expected an http(s) URL of letters, digits and . _ ~ % + - / (and apt's $(ARCH)), "
                         "e.g. https://nvidia.github.io/libnvidia-container/stable/deb/$(ARCH)")
    return value


def _key_url(value: str | None) -> str | None:
    if value is not None and not _KEY_URL.fullmatch(value):
        raise ValueError("expected an http(s) URL of letters, digits and . _ ~ % + - /, "
                         "e.g. https://nvidia.github.io/libnvidia-container/gpgkey")
    return value


class AptRepoSpec(_Strict):
    """An apt repository and its signing key (a mirror of it, for rigs that cannot reach the original)."""

    url: Annotated[str, AfterValidator(_repo_url)]
    key_url: Annotated[str, AfterValidator(_key_url)]


class BaseSpec(_Strict):
    install: bool = True  # false: install nothing (the preflight still runs)
    docker_source: Literal["distro", "docker"] = "distro"
    docker_repo: AptRepoSpec | None = None  # default: https://download.docker.com/linux/<debian|ubuntu>
    nvidia_repo: AptRepoSpec = AptRepoSpec(url=NVIDIA_REPO_URL, key_url=NVIDIA_KEY_URL)
    hold_driver: bool = True  # apt-mark hold the driver's packages; false unholds them
    driver_version: str | None = Field(default=None, pattern=_VERSION)  # for `rigkit check` only


# ----- rig file: the monitoring pack (docs/monitoring.md) -------------------------


class MonitoringSpec(_Strict):
    """The monitoring pack (roles/monitoring.py): an exporter of GPU power, clocks, policy drift and
    rigkit's own figures, and Debian's Prometheus scraping it and every model's /metrics. Off unless
    the rig file says `monitoring: {enabled: true}`. Linux rigs only. Both listen on 127.0.0.1; the
    exporter on every interface, wanting the models' key, where the models serve there (serve_address)."""

    enabled: bool = False
    exporter_port: int = Field(default=9835, ge=1024, le=65535)  # the exporter's /metrics (127.0.0.1, or the LAN)
    prometheus: bool = True  # install Debian's prometheus on the rig, scraping the exporter and the models
    prometheus_port: int = Field(default=9090, ge=1024, le=65535)  # its web UI and HTTP API (127.0.0.1)
    scrape_interval_s: int = Field(default=15, ge=1, le=600)
    retention_days: int = Field(default=15, ge=1, le=3650)  # --storage.tsdb.retention.time

    @field_validator("prometheus_port")
    @classmethod
    def _two_ports(cls, value: int, info: ValidationInfo) -> int:
        if value == info.data.get("exporter_port"):
            raise ValueError(f"port {value} is the exporter_port too; give Prometheus and the exporter a port each")
        return value


def _ipv4_network(value: str) -> str:
    """An IPv4 address or network (10.0.0.7, 10.0.0.0/24), as nftables will read it."""
    import ipaddress

    try:
        return str(ipaddress.IPv4Network(value, strict=False))
    except ValueError:
        raise ValueError(f"{value!r} is not an IPv4 address or network (10.0.0.7, 10.0.0.0/24)") from None


class OnDemandModel(_Strict):
    """One model of the rig served on demand (docs/on-demand.md): loaded when a request for it comes, parked
    after `idle_park_s` with none. `swap`: how it is parked and loaded again, vLLM's sleep mode (level 1: the
    weights kept in host RAM), NVIDIA's cuda-checkpoint (its process's GPU memory kept in host RAM, nothing left
    on the GPU; a model on one GPU) or stopping its container (started again warm). `engine_port`: where its vLLM
    listens on the rig's loopback, behind rigkit-ondemand's front on the model's own port (default: the
    model's port + 10000, or - 10000 where that passes 65535)."""

    name: Annotated[str, AfterValidator(_follows_name_rule)]
    idle_park_s: int = Field(default=600, ge=5, le=86_400)
    swap: Literal["sleep", "checkpoint", "stop"] = "sleep"
    engine_port: int | None = Field(default=None, ge=1024, le=65535)


class OnDemandSpec(_Strict):
    """The rig's on-demand models and how long a request waits for its model to be loaded (`hold_s`)."""

    hold_s: int = Field(default=300, ge=5, le=3600)
    # NVIDIA's cuda-checkpoint on the rig (github.com/NVIDIA/cuda-checkpoint, bin/x86_64_Linux/; driver 570 or
    # later), for models with `swap: checkpoint`: an absolute path on the rig (letters, digits, _ . / -).
    cuda_checkpoint: str = Field(default="/usr/local/bin/cuda-checkpoint", max_length=200, pattern=r"^/[A-Za-z0-9_./-]*$")
    models: list[OnDemandModel] = Field(default_factory=list, max_length=MAX_MODELS_ON_DEMAND)


class RigSpec(_Strict):
    os: Literal["linux", "windows"]
    psu_w: int = Field(gt=0, le=10_000)
    system_w: int = Field(ge=0, le=5_000)
    psu_headroom_share: float = Field(default=0.20, ge=0.0, lt=1.0)
    gpus: list[GpuSpec] = Field(min_length=1, max_length=MAX_GPUS_PER_RIG)
    models: list[Annotated[str, AfterValidator(_follows_name_rule)]] = Field(default_factory=list)
    gpu_policy: Literal["apply", "remove"] = "apply"
    psu_budget_override: bool = False
    # Multi-GPU topology (docs/topology.md): "allow-risky-p2p" turns the errors for P2P over PCIe while ACS
    # redirects or the IOMMU translates into warnings, for a rig where that was proven to work.
    topology_override: Literal["allow-risky-p2p"] | None = None
    # The active P2P check before a model spanning GPUs first starts (a copy per GPU pair and an all-reduce,
    # in a container of the model's image): its bound, container start included; a hang fails the deploy
    # within it, so within 2 minutes at most.
    p2p_check_timeout_s: int = Field(default=90, ge=10, le=110)
    # A file on the control machine holding the API key the vLLM servers require (mode 600).
    api_key_file: str | None = None
    # A file on the control machine holding a Hugging Face token (mode 600), for models whose weights come
    # from a gated or private hub repository (weights.hub). Reaches the download's container as a file only.
    hub_token_file: str | None = None
    # During a rotation of that key: files of other keys the vLLM servers accept too (mode 600 each); rigkit
    # and the gateway send only api_key_file's. Add the new key here, swap the two, then remove the old one
    # (docs/security.md, "Rotating the models' key"). Linux rigs.
    accept_api_key_files: list[str] = Field(default_factory=list, max_length=4)
    # Where the vLLM servers listen: loopback only (default), or every interface so a gateway on another
    # rig can reach them (then api_key_file is required: rigkit.config.loader refuses it without one).
    serve_address: Literal["127.0.0.1", "0.0.0.0"] = "127.0.0.1"
    # With serve_address 0.0.0.0: the hosts (IPv4 addresses or networks) let in to the models' ports besides
    # the rig itself and the gateway's rig; every other host is refused by the rig's firewall (docs/security.md).
    # They reach every path, not only /v1: vLLM asks for the key only there.
    serve_clients: list[Annotated[str, AfterValidator(_ipv4_network)]] = Field(default_factory=list, max_length=64)
    base: BaseSpec = BaseSpec()  # Linux: Docker, the NVIDIA Container Toolkit, driver holds (roles/base.py)
    monitoring: MonitoringSpec = MonitoringSpec()  # off by default; Linux only (roles/monitoring.py)
    # Windows: the WSL2 VM's memory and swap in GB (Docker Desktop's engine runs in it), written to
    # %UserProfile%\.wslconfig ([wsl2] memory=, swap=; 0 swap: none) and applied with `wsl --shutdown`
    # while no model serves (docs/windows.md). None: .wslconfig left as it is (WSL's defaults: half the
    # RAM, swap a quarter of it).
    wsl_memory_gb: int | None = Field(default=None, ge=2, le=4096)
    wsl_swap_gb: int | None = Field(default=None, ge=0, le=4096)
    # Models served on demand (docs/on-demand.md); the rig's other models stay loaded. Linux rigs.
    on_demand: OnDemandSpec = OnDemandSpec()

    @field_validator("on_demand")
    @classmethod
    def _on_demand_linux_only(cls, value: OnDemandSpec, info: ValidationInfo) -> OnDemandSpec:
        if value.models and info.data.get("os") == "windows":
            raise ValueError("on-demand models run behind rigkit-ondemand, a systemd service of Linux rigs; remove "
                             "`on_demand` from this Windows rig")
        return value

    @field_validator("base")
    @classmethod
    def _base_linux_only(cls, value: BaseSpec, info: ValidationInfo) -> BaseSpec:
        if info.data.get("os") == "windows":
            raise ValueError("the base role (apt packages, Docker, driver holds) runs on Linux rigs only; a Windows "
                             "rig brings Docker Desktop and its driver itself: remove `base` from this Windows rig")
        return value

    @field_validator("monitoring")
    @classmethod
    def _monitoring_linux_only(cls, value: MonitoringSpec, info: ValidationInfo) -> MonitoringSpec:
        if value.enabled and info.data.get("os") == "windows":
            raise ValueError("the monitoring pack (exporter, Prometheus) runs on Linux rigs only; Windows rigs are not "
                             "covered (docs/monitoring.md): remove `monitoring` from this Windows rig")
        return value

    @field_validator("wsl_memory_gb", "wsl_swap_gb")
    @classmethod
    def _wsl_windows_only(cls, value: int | None, info: ValidationInfo) -> int | None:
        if value is not None and info.data.get("os") != "windows":
            raise ValueError(f"{info.field_name} sizes the WSL2 VM of a Windows rig (Docker Desktop); remove it from "
                             "this Linux rig")
        return value

    @field_validator("gpus")
    @classmethod
    def _offsets_linux_only(cls, value: list[GpuSpec], info: ValidationInfo) -> list[GpuSpec]:
        if info.data.get("os") == "windows":
            for gpu in value:
                if gpu.clock_offsets_mhz is not None:
                    raise ValueError(f"GPU {gpu.index}: clock_offsets_mhz is applied through NVML on Linux rigs only; "
                                     "remove it from this Windows rig")
        return value

    @field_validator("gpus")
    @classmethod
    def _unique_indices(cls, value: list[GpuSpec]) -> list[GpuSpec]:
        seen = [g.index for g in value]
        dupes = sorted({i for i in seen if seen.count(i) > 1})
        if dupes:
            raise ValueError(f"GPU index {dupes[0]} is listed more than once; each physical GPU once")
        return value


# ----- model catalog ----------------------------------------------------------

# Docker's reference grammar (distribution/reference): [registry[:port]/]path[:tag][@digest], the path of
# lowercase components. Pinned: a tag (not `latest`), a digest, or both.
_LABEL = r"[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?"
# A first component is a registry only with a '.', a port, or as localhost (Docker's rule).
_REGISTRY = rf"(?:(?:localhost|{_LABEL}(?:\.{_LABEL})+)(?::[0-9]{{1,5}})?/|{_LABEL}:[0-9]{{1,5}}/)"
_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_IMAGE = re.compile(rf"(?P<name>{_REGISTRY}?{_COMPONENT}(?:/{_COMPONENT})*)"
                    r"(?::(?P<tag>[A-Za-z0-9_][A-Za-z0-9._-]{0,127}))?(?:@(?P<digest>sha256:[0-9a-f]{64}))?")
PIN_EXAMPLE = "e.g. vllm/vllm-openai:v0.11.0 or registry.local:5000/vllm/vllm-openai:v0.11.0@sha256:<64 hex>"


def image_problem(value: str) -> str | None:
    """Why `value` is not a pinned Docker image reference, or None."""
    match = _IMAGE.fullmatch(value)
    if match is None:
        reference = value.split("@", 1)[0]
        head, _, tail = reference.rpartition(":")
        name = head if head and "/" not in tail else reference
        if name != name.lower() and _IMAGE.fullmatch(value.replace(name, name.lower(), 1)):
            return (f"Docker image names must be lowercase (the tag may have capitals); {PIN_EXAMPLE}")
        return (f"not a Docker image reference ([registry[:port]/]name[:tag][@sha256:digest], lowercase name, no "
                f"spaces); {PIN_EXAMPLE}")
    if match["digest"] is None and match["tag"] in (None, "latest"):
        return f"pin the image to a tag or digest (not :latest, not untagged); {PIN_EXAMPLE}"
    return None


def _pinned_image(value: str | None) -> str | None:
    if value is not None and (problem := image_problem(value)):
        raise ValueError(problem)
    return value


def _weights_source(value: str) -> str:
    if _CONTROL.search(value):
        raise ValueError("may not contain a line break or another control character")
    if ".." in re.split(r"[\\/]", value):
        raise ValueError("may not contain a '..' component; give the folder's own absolute path")
    return value


class RigSource(_Strict):
    """Weights taken from another rig's volume (one download per fleet, docs/weights.md): `rig` is the
    inventory name of that rig (checked against the inventory: rigkit.config.inventory.check_rig_sources),
    `volume` the volume there, by default this model's own volume name."""
    rig: str = Field(min_length=1, max_length=253, pattern=r"^[A-Za-z0-9@][A-Za-z0-9@._/:-]*$")
    volume: str | None = Field(default=None, pattern=r"^[a-zA-Z0-9][a-zA-Z0-9_.-]{1,127}$")

    def __str__(self) -> str:
        return f"rig {self.rig}" + (f" volume {self.volume}" if self.volume else "")


def _source(value: Any) -> str | RigSource:
    """A folder (str) or another rig ({rig: NAME, volume: ...}); one error naming what is allowed."""
    if isinstance(value, RigSource):
        return value
    if isinstance(value, dict):
        try:
            return RigSource.model_validate(value)
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(p) for p in first["loc"]) or "rig"
            raise ValueError(f"{where}: {first['msg']}; allowed: {{rig: NAME, volume: VOLUME}}") from None
    if not isinstance(value, str) or not 1 <= len(value) <= 4096:
        raise ValueError("give the model folder's path (1-4096 characters), or {rig: NAME, volume: VOLUME} "
                         "to copy another rig's volume")
    return _weights_source(value)


HUB_CACHE = HUB_CACHE_DIR  # the rig's Hugging Face cache for hub sources (HF_HUB_CACHE's layout)
HUB_ENDPOINT = "https://huggingface.co"
# Where a hub cache may not go: it is mounted read-write into a container that runs as root on the host's network.
SYSTEM_FOLDERS = ("/bin", "/boot", "/dev", "/etc", "/lib", "/lib32", "/lib64", "/proc", "/root", "/run", "/sbin",
                  "/sys", "/usr", "/var/lib/docker", "/var/lib/containerd")


class HubSource(_Strict):
    """Weights downloaded from a Hugging Face Hub repository at a pinned commit, on one rig of the fleet with
    huggingface_hub (the model's serving image carries it), into the rig's cache (`cache`), then copied onto
    the volume and proven against the hub's own hashes by the copier (docs/weights.md)."""
    # The Hub's rule for a repository id: namespace/name, letters, digits, '-', '_', '.', no '--' or '..'
    # (huggingface_hub's validate_repo_id), and so one safe word in a path and a command.
    repo: str = Field(max_length=200, pattern=r"^[A-Za-z0-9](?:[A-Za-z0-9_.-]{0,94}[A-Za-z0-9])?"
                                              r"/[A-Za-z0-9](?:[A-Za-z0-9_.-]{0,94}[A-Za-z0-9])?$")
    # A commit, never a branch: `main` moves, and a fleet must serve the same bytes on every rig.
    revision: str = Field(pattern=r"^[0-9a-f]{40}$")  # the 40 hex digits of a commit
    endpoint: str = Field(default=HUB_ENDPOINT, max_length=200, pattern=r"^https?://[A-Za-z0-9.-]+(:[0-9]{1,5})?$")
    cache: str = Field(default=HUB_CACHE, max_length=200, pattern=r"^/[A-Za-z0-9_./-]*$")

    @field_validator("repo")
    @classmethod
    def _hub_repo_rule(cls, value: str) -> str:
        if "--" in value or ".." in value or value.endswith(".git"):
            raise ValueError("a hub repository id may not contain '--' or '..' or end in '.git' (the Hub's own rule)")
        return value

    @field_validator("cache")
    @classmethod
    def _plain_folder(cls, value: str) -> str:
        parts = value.rstrip("/").split("/")[1:]
        if not parts or any(p in ("", ".", "..") for p in parts):
            raise ValueError("give a folder's own absolute path below /, without '.', '..' or '//'")
        if any(value.rstrip("/") == p or value.startswith(p + "/") for p in SYSTEM_FOLDERS):
            raise ValueError(f"a folder of the system or of Docker's own ({', '.join(SYSTEM_FOLDERS)}); the "
                             f"default is {HUB_CACHE}")
        return value

    @property
    def snapshot(self) -> str:
        """The snapshot folder huggingface_hub makes under the cache: what the copier copies from."""
        org, name = self.repo.split("/")
        return f"{self.cache.rstrip('/')}/models--{org}--{name}/snapshots/{self.revision}"

    def __str__(self) -> str:
        return f"hub {self.repo}@{self.revision[:12]}"


class WeightsSpec(_Strict):
    # directory on the rig, or a Windows path as Docker Desktop sees it (rigkit.config.lint checks which);
    # or {rig: NAME, volume: ...}: another rig's copy, streamed through the control machine
    source: Annotated[str | RigSource, PlainValidator(_source)]
    storage: Literal["volume", "bind"] = "volume"
    volume: str | None = Field(default=None, pattern=r"^[a-zA-Z0-9][a-zA-Z0-9_.-]{1,127}$")  # Docker's volume rule
    # image with python3 that copies; default: the serving image. Pinned like it.
    helper_image: Annotated[str | None, AfterValidator(_pinned_image)] = None
    # or a Hugging Face Hub repository at a commit: `source` is then its snapshot folder in the rig's cache
    hub: HubSource | None = None

    @model_validator(mode="before")
    @classmethod
    def _hub_sets_the_folder(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("hub") is not None:
            if "source" in data:
                raise ValueError("give either source (a folder, or {rig: NAME}) or hub ({repo, revision}), not both")
            try:
                hub = data["hub"] if isinstance(data["hub"], HubSource) else HubSource.model_validate(data["hub"])
            except ValidationError:  # reported by the hub field's own validation, with its place (weights.hub.X)
                return {**data, "source": "/"}
            data = {**data, "hub": hub, "source": hub.snapshot}
        return data

    @field_validator("storage")
    @classmethod
    def _rig_source_on_volume(cls, value: str, info: ValidationInfo) -> str:
        if value == "bind" and isinstance(info.data.get("source"), RigSource):
            raise ValueError("weights from another rig are copied onto a volume; use storage: volume (the default)")
        return value

    @property
    def from_rig(self) -> RigSource | None:
        return self.source if isinstance(self.source, RigSource) else None


class ParallelSpec(_Strict):
    tensor: int = Field(default=1, ge=1, le=MAX_GPUS_PER_RIG)
    pipeline: int = Field(default=1, ge=1, le=MAX_GPUS_PER_RIG)
    data: int = Field(default=1, ge=1, le=MAX_GPUS_PER_RIG)


class SpeculativeSpec(_Strict):
    method: Annotated[str, AfterValidator(_token)]
    model: Annotated[str | None, Field(max_length=4096), AfterValidator(_single_word)] = None
    num_speculative_tokens: int = Field(ge=1, le=16)
    # ngram (prompt lookup): the longest and shortest n-gram matched against the context; vLLM's
    # default is 5 for both when neither is given.
    prompt_lookup_max: int | None = Field(default=None, ge=1, le=64)
    prompt_lookup_min: int | None = Field(default=None, ge=1, le=64)

    @field_validator("prompt_lookup_min")
    @classmethod
    def _min_not_above_max(cls, value: int | None, info: ValidationInfo) -> int | None:
        top = info.data.get("prompt_lookup_max")
        if value is not None and top is not None and value > top:
            raise ValueError(f"prompt_lookup_min {value} is above prompt_lookup_max {top} (vLLM refuses that)")
        return value


class VllmOptions(_Strict):
    dtype: Literal["auto", "bfloat16", "float16", "half", "float32"] = "auto"
    quantization: Annotated[str | None, AfterValidator(_token)] = None
    kv_cache_dtype: Literal["auto", "fp8", "fp8_e4m3", "fp8_e5m2"] = "auto"
    max_model_len: int | None = Field(default=None, ge=128)
    gpu_memory_utilization: float = Field(default=0.90, gt=0.0, le=1.0)
    enable_prefix_caching: bool = True
    enforce_eager: bool = False
    speculative: SpeculativeSpec | None = None
    served_model_name: Annotated[str | None, AfterValidator(_follows_name_rule)] = None
    reasoning_parser: Annotated[str | None, AfterValidator(_token)] = None
    tool_call_parser: Annotated[str | None, AfterValidator(_token)] = None
    safetensors_load_strategy: Literal["lazy", "eager", "prefetch"] | None = None
    extra_args: list[Annotated[str, Field(max_length=4096), AfterValidator(_no_control)]] = Field(default_factory=list)


class WatchdogSpec(_Strict):
    """The rig-side watchdog for one model (templates/serving/rigkit-watchdog; docs/serving.md#watchdog)."""

    enabled: bool = True
    interval_s: int = Field(default=30, ge=1, le=3600)  # one probe and one /metrics read this often
    wedged_after_s: int = Field(default=120, ge=1, le=86_400)  # both signals this long -> restart
    max_restarts_per_hour: int = Field(default=3, ge=0, le=60)
    probe_timeout_s: int = Field(default=15, ge=1, le=600)  # deadline of the one-token completion


# CUDA arch names as nvcc writes them: sm_XY is machine code (runs on X.Y up to X.9), sm_XYa only on
# X.Y, compute_XY is PTX (JIT-compiled for X.Y and anything newer).
_ARCH = r"^(sm_[0-9]{2,3}[af]?|compute_[0-9]{2,3})$"


class ImageRequiresSpec(_Strict):
    """What a serving image needs from the rig's driver and GPUs (checked before anything changes)."""

    driver_min: str = Field(pattern=_VERSION)  # lowest driver version its CUDA runs on
    cuda: str | None = Field(default=None, pattern=r"^[0-9]{1,2}\.[0-9]{1,2}$")  # for messages
    archs: list[Annotated[str, Field(pattern=_ARCH)]] | None = Field(default=None, min_length=1)


class ModelSpec(_Strict):
    image: str
    image_requires: ImageRequiresSpec | None = None
    weights: WeightsSpec
    gpus: list[int] = Field(min_length=1, max_length=MAX_GPUS_PER_RIG)
    parallel: ParallelSpec = ParallelSpec()
    port: int = Field(ge=1024, le=65535)
    vllm: VllmOptions = VllmOptions()
    shared_gpus: bool = False  # allow other services on the same GPUs (each must say so)
    env: dict[str, str] = Field(default_factory=dict)  # extra container environment; no secrets
    expected_min_decode_tok_s: float | None = Field(default=None, gt=0)
    weight_bytes: int | None = Field(default=None, gt=0)  # checkpoint size, for "fits on one card"
    active_weight_bytes: int | None = Field(default=None, gt=0)  # bytes read per decoded token
    # At least 10 s: less is no start at all (vLLM's API server alone takes seconds); a tiny model on a fast rig
    # (and the simulated rig's hang tests) may want a short one, a big one minutes.
    ready_timeout_s: int = Field(default=900, ge=10, le=7200)
    # Optional: the time a start may take from its container's start to its first token. A start over it is a
    # failed check (time_to_ready) in the verification that follows it, naming its slowest phase.
    ready_budget_s: float | None = Field(default=None, gt=0, le=7200)
    # The container's memory limit in GiB (Compose `deploy.resources.limits.memory`): host RAM a model may take
    # (vLLM's CPU-side buffers, a CPU build's KV cache) before the kernel stops it, not the rig. None: no limit.
    memory_limit_gb: int | None = Field(default=None, ge=1, le=4096)
    watchdog: WatchdogSpec = WatchdogSpec()
    # Served model names the gateway tries, in order, when every replica of this one failed (docs/gateway.md).
    gateway_fallbacks: list[Annotated[str, AfterValidator(_follows_name_rule)]] = Field(default_factory=list)

    @field_validator("env")
    @classmethod
    def _no_secrets(cls, value: dict[str, str]) -> dict[str, str]:
        for key in value:
            if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key):
                raise ValueError(f"{key!r} is not an environment variable name")
            if re.search(r"KEY|TOKEN|SECRET|PASSWORD", key, re.I):
                raise ValueError(f"{key} looks like a secret; compose files are not secret stores: use the rig's api_key_file")
            if _CONTROL.search(value[key]):
                raise ValueError(f"{key}: the value may not contain a line break or another control character")
        return value

    @field_validator("image")
    @classmethod
    def _pinned(cls, value: str) -> str:
        # fullmatch: `re.match(...$)` would also accept a tag with a trailing newline.
        return _pinned_image(value)


# ----- inventory: the gateway (docs/gateway.md) -------------------------------

# The official LiteLLM proxy image, pinned by digest: the one place it is named. Its version must be
# LITELLM_VERSION (rigkit/gateway/__init__.py), the one the tests run from PyPI. Never 1.107.0 (a
# compromised release on PyPI, Docker Hub and GHCR). Move both together, after the release notes.
LITELLM_IMAGE = "ghcr.io/berriai/litellm@sha256:bd089afdcd35b894b14a93f9743cdc8b591f82da1a38dd43a010a7b0c9de5fd7"


# A name a TLS certificate may be issued for: a DNS name (letters, digits, '-', dots between labels)
# or an IP address (checked by ipaddress in the validator).
_DNS_NAME = re.compile(r"(?=.{1,253}$)([A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)(\.[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*")


def _tls_name(value: str) -> str:
    import ipaddress

    try:
        return str(ipaddress.ip_address(value))
    except ValueError:
        pass
    if not _DNS_NAME.fullmatch(value):
        raise ValueError("a DNS name (letters, digits and '-' in labels between dots) or an IP address")
    return value


class GatewayTlsFiles(_Strict):
    """A certificate the user gives for the gateway, on the control machine: PEM files."""

    cert_file: str  # the certificate, then any intermediates
    key_file: str  # its private key, unencrypted, mode 600


class GatewaySpec(_Strict):
    """The LiteLLM gateway: the inventory host whose data has `gateway:` runs it (roles/gateway.py)."""

    port: int = Field(default=4000, ge=1024, le=65535)
    bind_address: str = Field(default="127.0.0.1", pattern=r"^(25[0-5]|2[0-4][0-9]|1?[0-9]?[0-9])(\.(25[0-5]|2[0-4][0-9]|1?[0-9]?[0-9])){3}$")
    master_key_file: str  # on the control machine, mode 600; the key must start with sk- (LiteLLM's rule)
    image: str = LITELLM_IMAGE
    num_retries: int = Field(default=2, ge=0, le=10)  # a retry may pick another replica
    allowed_fails: int = Field(default=1, ge=0, le=100)  # failures in a minute before a replica cools down
    cooldown_s: int = Field(default=30, ge=1, le=3600)  # how long a failed replica gets no traffic
    # A request may wait this long for its whole answer: a 128K-token prompt at 300 tok/s prefill is ~430 s.
    request_timeout_s: int = Field(default=900, ge=10, le=7200)
    drain_timeout_s: int = Field(default=120, ge=0, le=3600)  # rollout: wait this long for in-flight requests
    ready_timeout_s: int = Field(default=180, ge=10, le=3600)  # deploy: wait this long for the proxy to answer
    # Proxy processes: one handles every streamed chunk in Python and capped ~460 tok/s of one-token
    # chunks on a busy 2-core machine (bench/gateway_overhead.py). Cooldowns are per process (no Redis).
    workers: int = Field(default=1, ge=1, le=64)
    # LiteLLM's background health checks: one 1-token completion per replica every this many seconds;
    # 0 turns them off. None: not set here; an inventory's entry gets GATEWAY_HEALTH_CHECK_INTERVAL_S
    # (rigkit/config/inventory.py, where inventory defaults are declared), a spec built in code none.
    health_check_interval_s: int | None = Field(default=None, ge=0, le=3600)
    # Verification through the gateway fails when it adds more than this to the time to first token
    # (median through it minus median direct to one replica). 250 ms: ~4x the 58 ms bench/gateway_overhead.py
    # measured on a shared 2-core machine (2026-12-01; the deployed test saw 47 ms, docs/gateway.md), so
    # only a gateway that buffers, retries or queues trips it.
    max_added_ttft_ms: int = Field(default=250, ge=1, le=600_000)
    # Keys clients may use besides the master key, one file each on the control machine (mode 600). A
    # deploy changes the list without restarting the gateway: rotate by adding the new file, moving the
    # clients, then removing the old one (docs/gateway.md, "Keys").
    client_key_files: list[str] = Field(default_factory=list, max_length=64)
    # HTTPS (docs/security.md): "rigkit" issues a certificate from the fleet's CA kept in ca_dir; a
    # mapping gives your own (cert_file, key_file); "none" serves plain HTTP (keys cross the network
    # in clear where the gateway binds beyond loopback, so each deploy warns).
    tls: Literal["rigkit", "none"] | GatewayTlsFiles = "rigkit"
    # rigkit's certificate covers 127.0.0.1, localhost, the gateway rig's inventory address and the
    # bind address; add here the other names clients use (a DNS name, another address).
    tls_names: list[Annotated[str, AfterValidator(_tls_name)]] = Field(default_factory=list, max_length=32)
    # Where the fleet's CA lives on the control machine (ca.pem for clients, ca.key mode 600). None:
    # the folder rigkit-ca beside master_key_file (rigkit.gateway.tls.CA_DIR_NAME).
    ca_dir: str | None = None

    @field_validator("image")
    @classmethod
    def _pinned(cls, value: str) -> str:
        _pinned_image(value)
        if "1.107.0" in value:
            raise ValueError("LiteLLM 1.107.0 was a compromised release; use the pinned default")
        return value


# ----- validated objects ----------------------------------------------------


@dataclass(frozen=True)
class ModelConfig:
    name: str  # the catalog file's stem
    spec: ModelSpec
    file: Path
    # The catalog's variants (name, the model's spec as that variant), in its order; a rig serves the first whose
    # quantization its GPUs run and whose weights fit them (rigkit.config.variants), named in `variant`.
    variants: tuple[tuple[str, ModelSpec], ...] = ()
    variant: str | None = None
    # Served on demand on this rig (the rig file's on_demand, its engine_port resolved), else None: always loaded.
    on_demand: OnDemandModel | None = None

    @property
    def engine_port(self) -> int:
        """Where its vLLM listens: the model's port, or behind the front, its engine_port on loopback."""
        return self.on_demand.engine_port if self.on_demand else self.spec.port


@dataclass(frozen=True)
class RigConfig:
    name: str  # the rig file's stem
    spec: RigSpec
    models: tuple[ModelConfig, ...]
    file: Path
    warnings: tuple[str, ...] = ()  # serving-config warnings (rigkit.config.lint)
    notes: tuple[str, ...] = ()  # what was chosen for this rig and why (a catalog variant)
