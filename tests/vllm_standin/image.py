"""Build the vLLM stand-in image locally. TEST INFRASTRUCTURE.

FROM the simulated rig's image (it has python3; no registry is reachable), plus
server.py as the entrypoint, so the rendered compose file's command (the model
path, then vLLM's flags) reaches it as it would reach `vllm serve`, the torch
stand-in (torch/: only what rigkit's P2P check calls) where the real image has torch, PyYAML, and
huggingface_hub with what it requires (the controller's installed copy, the version real vLLM images carry). Tagged with a
content hash and with the stable tag `sim` that the demo's catalog names.
"""

from __future__ import annotations

import hashlib
import io
import tarfile
from pathlib import Path

import docker
import yaml

from tests.simrig.image import ensure_image

REPO = "rigkit-vllm-standin"
STABLE_TAG = f"{REPO}:sim"
SERVER = Path(__file__).with_name("server.py")
CURVES = Path(__file__).parents[1] / "sim_curves.py"  # the tuning curves, shared with the simulated NVML
TORCH = sorted(Path(__file__).with_name("torch").glob("*.py"))  # the torch stand-in
# PyYAML's pure-Python modules (the controller's own copy): `--config` files are read with yaml.safe_load,
# as vLLM reads them; the rig's image has no PyYAML.
YAML = sorted(Path(yaml.__file__).parent.glob("*.py"))
HUB_CLIENT = "huggingface_hub"  # real vLLM images carry it (0.32.0's: 2.4.0, the version tests pin); weights.hub uses it


def hub_client_files() -> list[tuple[str, bytes]]:
    """huggingface_hub and what it requires, from the controller's own installation (the same Python minor
    version as the rig's), as (path under site-packages, bytes): the real client, not a look-alike."""
    import importlib.metadata as metadata

    from packaging.requirements import Requirement

    seen, todo, found = set(), [HUB_CLIENT], []
    while todo:
        dist = metadata.distribution(todo.pop())
        name = dist.metadata["Name"].lower().replace("_", "-")
        if name in seen:
            continue
        seen.add(name)
        todo += [r.name for r in map(Requirement, dist.requires or ()) if not r.marker or r.marker.evaluate({"extra": ""})]
        found += [(str(f), f.locate().read_bytes()) for f in dist.files or ()
                  if f.parts[0] != ".." and "__pycache__" not in f.parts and f.locate().is_file()]
    return sorted(found)


def ensure_standin_image(client: docker.DockerClient | None = None, log=print) -> str:
    client = client or docker.from_env()
    base = ensure_image(client, log=log)
    hub_client = hub_client_files()
    digest = hashlib.sha256(base.encode() + SERVER.read_bytes() + CURVES.read_bytes()
                            + b"".join(p.name.encode() + p.read_bytes() for p in TORCH)
                            + b"".join(p.name.encode() + p.read_bytes() for p in YAML)
                            + b"".join(path.encode() + data for path, data in hub_client)).hexdigest()[:16]
    tag = f"{REPO}:{digest}"
    try:
        client.images.get(tag)
    except docker.errors.ImageNotFound:
        log(f"building {tag}")
        dockerfile = (
            f"FROM {base}\n"
            "COPY server.py /opt/vllm-standin/server.py\n"
            "COPY rigkit_sim_curves.py /opt/vllm-standin/rigkit_sim_curves.py\n"
            "COPY torch /opt/vllm-standin/lib/torch\n"
            "COPY yaml /opt/vllm-standin/lib/yaml\n"
            "COPY hub-lib /opt/vllm-standin/hub-lib\n"
            "ENV PYTHONPATH=/opt/vllm-standin/lib:/opt/vllm-standin/hub-lib\n"
            'ENTRYPOINT ["python3", "-u", "/opt/vllm-standin/server.py"]\n'
            "CMD []\n"
        )
        context = io.BytesIO()
        with tarfile.open(fileobj=context, mode="w") as tar:
            for name, data in (("Dockerfile", dockerfile.encode()), ("server.py", SERVER.read_bytes()),
                               ("rigkit_sim_curves.py", CURVES.read_bytes()),
                               *((f"torch/{p.name}", p.read_bytes()) for p in TORCH),
                               *((f"yaml/{p.name}", p.read_bytes()) for p in YAML),
                               *((f"hub-lib/{path}", data) for path, data in hub_client)):
                info = tarfile.TarInfo(name)
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
        context.seek(0)
        client.images.build(fileobj=context, custom_context=True, tag=tag, rm=True, pull=False)
    client.images.get(tag).tag(STABLE_TAG)
    return tag
