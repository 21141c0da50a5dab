"""Model weights onto Docker volumes, through the rig's Docker Engine (docker SDK).

A short-lived helper container mounts the source read-only at /src and the
volume at /dst and runs the copier's check, copy or verify (templates/weights/copier/,
shipped as one file by rigkit/weights/copier.py):
one read of each source file both copies and hashes it; a manifest and then a
completion marker are written last, so an interrupted copy is never complete
and the next run resumes it. The helper image is any image with python3; by
default the model's own serving image, which the rig pulls anyway.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import docker
import requests
from docker.types import Mount

from rigkit.config.schema import ModelConfig
from rigkit.weights.copier import copier_source
from rigkit.rigside.names import WEIGHTS_HELPER_LABEL, volume_name, weights_helper_name
from rigkit.weights.layout import helper_image, source_layout

COPY_TIMEOUT_S = 6 * 3600  # tens of GB over a slow mount still end


class WeightsError(Exception):
    pass


@dataclass(frozen=True)
class CopyReport:
    model: str
    volume: str
    status: str  # unchanged | copied | verified | corrupt | needed
    files: int = 0
    bytes: int = 0
    copied_bytes: int = 0
    hashed_bytes: int = 0
    seconds: float = 0.0
    bad: tuple[str, ...] = ()
    reasons: tuple[str, ...] = ()  # verify: why each bad file failed (expected and found)
    proven: tuple[tuple[str, int], ...] = ()  # (check, files that passed it): hub-sha256, git-blob-sha1, ...

    @property
    def mb_per_s(self) -> float | None:
        return self.copied_bytes / 1e6 / self.seconds if self.seconds > 0 and self.copied_bytes else None

    def line(self) -> str:
        if self.status == "copied":
            rate = f", {self.mb_per_s:.0f} MB/s" if self.mb_per_s else ""
            return (f"{self.model}: copied {_size(self.copied_bytes)} of {_size(self.bytes)}, "
                    f"{self.files} files, in {self.seconds:.1f} s{rate} into volume {self.volume}{self._proven()}")
        if self.status == "corrupt":
            return (f"{self.model}: volume {self.volume} has files that fail their check (copied again from the "
                    f"source next): {'; '.join(self.reasons or self.bad)}")
        return f"{self.model}: volume {self.volume} {self.status}{self._proven()}"

    def _proven(self) -> str:
        return "; proven: " + ", ".join(f"{n} {check}" for check, n in self.proven) if self.proven else ""


def _size(n: int) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} B"


def run_helper(client: docker.DockerClient, model: ModelConfig, mode: str) -> dict:
    """Run the copier in `mode` and return its JSON report. Any earlier helper for this model is
    stopped first: the copy protocol makes a second start a resume, never a second writer."""
    try:
        client.containers.get(weights_helper_name(model)).remove(force=True)
    except docker.errors.NotFound:
        pass
    root, inside = source_layout(model.spec.weights.source)
    try:
        container = client.containers.run(
            helper_image(model),
            ["python3", "-c", copier_source(), mode, f"/src/{inside}", "/dst", "/src"],
            entrypoint=[],
            name=weights_helper_name(model),
            # A bind Mount, unlike `volumes=`, never creates a missing source folder on the rig.
            mounts=[
                Mount("/src", root, type="bind", read_only=True),
                Mount("/dst", volume_name(model), type="volume"),
            ],
            network_mode="none",
            labels={WEIGHTS_HELPER_LABEL: model.name},
            detach=True,
        )
    except docker.errors.APIError as exc:
        raise WeightsError(f"{model.name}: the weights helper could not start: {exc.explanation or exc}") from None
    try:
        status = container.wait(timeout=COPY_TIMEOUT_S)
        output = container.logs().decode(errors="replace").strip()
    except requests.exceptions.RequestException as exc:
        raise WeightsError(f"{model.name}: the weights helper ({mode}) did not finish within "
                           f"{COPY_TIMEOUT_S} s or the connection to the rig's Docker Engine broke: {exc}") from None
    finally:
        container.remove(force=True)
    last = output.splitlines()[-1] if output else ""
    return _parse_report(model, status.get("StatusCode"), output, last)


# Exit codes a container gets from a signal (128 + the signal's number), and what usually sent it.
SIGNAL_EXITS = {137: "killed by SIGKILL: the kernel's out-of-memory killer or a `docker kill`",
                143: "stopped by SIGTERM: a `docker stop` or the engine shutting down"}


def _parse_report(model: ModelConfig, exit_code, output: str, last: str) -> dict:
    try:
        result = json.loads(last)
    except ValueError:
        why = SIGNAL_EXITS.get(exit_code, "it printed no report")
        said = f"; its last output: {output[-500:]}" if output else "; it printed nothing"
        raise WeightsError(f"{model.name}: the weights helper exited {exit_code} ({why}){said}. Nothing was "
                           "marked complete: deploy again and the copy resumes") from None
    if result.get("status") == "error":
        if result.get("error") == "no space":
            raise WeightsError(
                f"{model.name}: volume {volume_name(model)} is out of space: the copy needs "
                f"{result['needed_bytes'] / 1e9:.2f} GB more (free: {result.get('free_bytes', 0) / 1e9:.2f} GB). "
                "Free space on the Docker data disk and deploy again; the copy resumes"
            )
        raise WeightsError(f"{model.name}: weights from {model.spec.weights.source}: {result.get('error')}")
    return result


def refuse_volatile(model: ModelConfig, volume) -> None:
    """A volume that keeps nothing once unmounted (the local driver with `type=tmpfs`) would be filled,
    marked complete, and empty again when the helper exits: refuse it, naming the fix."""
    options = (volume.attrs or {}).get("Options") or {}
    if str(options.get("type", "")).lower() in ("tmpfs", "ramfs"):
        raise WeightsError(
            f"{model.name}: volume {volume.name} is a {options['type']} volume: it empties whenever no container "
            f"has it mounted, so the weights cannot stay on it. Remove it (docker volume rm {volume.name}) and "
            "deploy again: rigkit creates it on the engine's disk")


def needs_copy(client: docker.DockerClient, model: ModelConfig) -> bool:
    """Reads only metadata: no volume yet, no completion marker, or the source's paths, sizes and
    mtimes differ from the manifest. Creates nothing."""
    try:
        volume = client.volumes.get(volume_name(model))
    except docker.errors.NotFound:
        return True
    refuse_volatile(model, volume)
    return run_helper(client, model, "check")["status"] != "unchanged"


def copy(client: docker.DockerClient, model: ModelConfig, verify: bool = False) -> list[CopyReport]:
    """Make the volume hold the source: verify first if asked (corrupt files are removed), then copy."""
    name = volume_name(model)
    try:
        refuse_volatile(model, client.volumes.get(name))
        fresh = False
    except docker.errors.NotFound:
        client.volumes.create(name, labels={"rigkit.model": model.name})
        fresh = True
    reports = []
    if verify and not fresh:
        result = run_helper(client, model, "verify")
        reports.append(_report(model, result))
    result = {"status": "needed"} if fresh else run_helper(client, model, "check")
    if result["status"] != "unchanged":
        result = run_helper(client, model, "copy")
    reports.append(_report(model, result))
    return reports


def _report(model: ModelConfig, result: dict) -> CopyReport:
    return CopyReport(
        model=model.name, volume=volume_name(model), status=result["status"],
        files=result.get("files", 0), bytes=result.get("bytes", 0),
        copied_bytes=result.get("copied_bytes", 0), hashed_bytes=result.get("hashed_bytes", 0),
        seconds=result.get("seconds", 0.0), bad=tuple(result.get("bad", ())),
        reasons=tuple(result.get("reasons", {}).values()), proven=tuple(sorted(result.get("proven", {}).items())),
    )
