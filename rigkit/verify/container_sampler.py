"""The telemetry sampler in a short-lived container with GPU access, through the rig's Docker Engine.

The same sampler as on Linux rigs (rigkit/verify/telemetry.py, NVML), for rigs whose host
cannot run it: on Windows 11 NVML answers inside Docker Desktop's WSL2 containers, not in
the rig's own shell. The container reserves every GPU (NVML indices are PCI bus order, the
same as nvidia-smi's, so the rig file's indices apply), gets the sampler and rigkit's copy of
pynvml through the Engine API (the image's own nvidia-ml-py is preferred), has no network,
and is removed after its samples are read back.
"""

from __future__ import annotations

import io
import json
import tarfile
import time
from contextlib import contextmanager
from pathlib import Path

import docker
import pynvml
import requests
from docker.types import DeviceRequest

import rigkit.verify.telemetry

FOLDER = "/rigkit-telemetry"
OUT = f"{FOLDER}/out/telemetry.json"
START_S = 20  # the sampler says "sampling" within this, or it failed (logs shown)
STOP_S = 30  # after SIGTERM it writes its samples and exits within this
SAMPLER = "nvml-container"  # what the result records as the sampler that ran


class SamplerError(Exception):
    pass


def _archive() -> bytes:
    """rigkit-telemetry.py, nvml/pynvml.py and an empty out/ under FOLDER, as a tar for put_archive."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        folders = [FOLDER, f"{FOLDER}/nvml", f"{FOLDER}/out"]
        for folder in folders:
            info = tarfile.TarInfo(folder.lstrip("/"))
            info.type, info.mode = tarfile.DIRTYPE, 0o755
            tar.addfile(info)
        for name, source in (("rigkit-telemetry.py", rigkit.verify.telemetry.__file__), ("nvml/pynvml.py", pynvml.__file__)):
            data = Path(source).read_bytes()
            info = tarfile.TarInfo(f"{FOLDER.lstrip('/')}/{name}")
            info.size, info.mode = len(data), 0o644
            tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def _command(gpus: list[int], hz: int, max_seconds: int) -> list[str]:
    indices = ",".join(str(int(i)) for i in gpus)
    return ["sh", "-c",
            f"python3 -c 'import pynvml' 2>/dev/null || export PYTHONPATH={FOLDER}/nvml; "
            f"exec python3 {FOLDER}/rigkit-telemetry.py --gpus {indices} --hz {int(hz)} --out {OUT} "
            f"--max-seconds {int(max_seconds)}"]


def _logs(container) -> str:
    try:
        return container.logs().decode(errors="replace").strip()[-1000:]
    except (docker.errors.APIError, requests.exceptions.RequestException):
        return "(no logs)"


@contextmanager
def sampling_in_container(client: docker.DockerClient, image: str, name: str, gpus: list[int], hz: int,
                          max_seconds: int):
    """Sample `gpus` while the block runs; yields a dict that holds {"telemetry": ...} afterwards
    (the sampler's JSON document, with "sampler" added). `name`: the container's name (an
    earlier one of that name is removed first)."""
    try:
        client.containers.get(name).remove(force=True)
    except docker.errors.NotFound:
        pass
    try:
        container = client.containers.create(
            image, _command(gpus, hz, max_seconds), entrypoint=[], name=name, network_mode="none",
            device_requests=[DeviceRequest(count=-1, capabilities=[["gpu", "utility"]])],
            labels={"rigkit.telemetry-sampler": "1"},
        )
    except docker.errors.APIError as exc:
        raise SamplerError(f"the telemetry sampler's container could not be created from {image}: "
                           f"{exc.explanation or exc}") from None
    try:
        container.put_archive("/", _archive())
        container.start()
        deadline = time.monotonic() + START_S
        while "sampling" not in _logs(container):
            container.reload()
            if container.status != "running" or time.monotonic() > deadline:
                raise SamplerError(f"the telemetry sampler did not start in its container ({image}) within "
                                   f"{START_S} s (state {container.status}): {_logs(container)}")
            time.sleep(0.2)
        held: dict = {}
        yield held
        container.kill(signal="SIGTERM")
        try:
            container.wait(timeout=STOP_S)
        except requests.exceptions.RequestException:
            raise SamplerError(f"the telemetry sampler did not stop within {STOP_S} s of SIGTERM") from None
        held["telemetry"] = {**_read_samples(container), "sampler": SAMPLER}
    except docker.errors.APIError as exc:
        raise SamplerError(f"the telemetry sampler's container failed: {exc.explanation or exc}") from None
    finally:
        container.remove(force=True)


def _read_samples(container) -> dict:
    try:
        stream, _ = container.get_archive(OUT)
    except docker.errors.NotFound:
        raise SamplerError(f"the telemetry sampler wrote no samples: {_logs(container)}") from None
    with tarfile.open(fileobj=io.BytesIO(b"".join(stream))) as tar:
        member = tar.getmembers()[0]
        return json.loads(tar.extractfile(member).read())
