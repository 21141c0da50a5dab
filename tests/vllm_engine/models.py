"""Small real models for the real engine, made offline on the host. TEST INFRASTRUCTURE.

A model is made once per engine image (make_model.py, run in that image with no network) under
SIM_MODELS, the folder the simulated rigs mount at the same path: the rig's docker CLI drives the host's
dockerd, which resolves bind sources on the host. A finished model is renamed into place whole, and the
image tag it was made with is written beside it last, so a half-made model is never served and a new
recipe makes it again.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from pathlib import Path

from tests.simrig.weights import SIM_MODELS
from tests.vllm_engine.image import ensure_engine_image

TINY_LLAMA = "tiny-llama"  # hidden 256, 2 layers, 4 heads of 64, 2 KV heads; a 1,024-token BPE tokenizer


def ensure_engine_model(name: str = TINY_LLAMA, seed: int = 0, log=print) -> Path:
    """The folder of `name` under SIM_MODELS, made with the engine image's make_model.py if missing or stale."""
    tag = ensure_engine_image(log=log)
    folder = SIM_MODELS / name
    stamp = SIM_MODELS / f".{name}.made-with"
    if folder.is_dir() and stamp.is_file() and stamp.read_text() == f"{tag} seed {seed}":
        return folder
    SIM_MODELS.mkdir(parents=True, exist_ok=True)
    log(f"making the model {name} with {tag}")
    with tempfile.TemporaryDirectory(prefix=f".{name}-", dir=SIM_MODELS) as tmp:
        proc = subprocess.run(
            ["docker", "run", "--rm", "--network", "none", "--entrypoint", "python3", "-v", f"{tmp}:/out",
             tag, "/opt/rigkit/make_model.py", "/out/model", "--seed", str(seed)],
            capture_output=True, text=True, timeout=600)
        if proc.returncode != 0:
            raise RuntimeError(f"making {name} failed: {proc.stdout[-2000:]}{proc.stderr[-2000:]}")
        made = Path(tmp) / "model"
        for path in made.iterdir():
            path.chmod(0o644)  # readable by the weights copier and the engine, whoever they run as
        stamp.unlink(missing_ok=True)
        if folder.exists():
            shutil.rmtree(folder)
        made.rename(folder)
    stamp.write_text(f"{tag} seed {seed}")
    return folder


if __name__ == "__main__":
    print(ensure_engine_model())
