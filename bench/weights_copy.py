"""rigkit's weights copy against a plain `cp -a` of the same tree, on the same disk, in one run.

Makes a 10-file checkpoint (safetensors-shaped shards + config), then times, in ABBA order
to cancel drift: cp -a into a folder under Docker's data root, rigkit's copy into a fresh
volume, rigkit again into another fresh volume, cp -a again. Then the no-op rerun. Prints
rigkit's throughput as a ratio of cp's (goal >= 0.95, issue #15) and the no-op time (goal < 1 s).
The page cache is dropped before each copy where the machine allows it.

    .venv/bin/python bench/weights_copy.py [--shard-mb 300]
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import docker  # noqa: E402

from rigkit.config.loader import ModelSpec  # noqa: E402
from rigkit.config.schema import ModelConfig
from rigkit.weights.volumes import copy, needs_copy  # noqa: E402
from tests.test_weights import make_checkpoint  # noqa: E402
from tests.vllm_standin.image import STABLE_TAG, ensure_standin_image  # noqa: E402

SOURCE = Path("/srv/rigkit-bench-weights/model")
SHARDS = 8  # + config.json + tokenizer.json = 10 files


def drop_caches() -> bool:
    try:
        subprocess.run(["sync"], check=True)
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
        return True
    except OSError:
        return False


def model(name: str) -> ModelConfig:
    spec = ModelSpec.model_validate({"image": STABLE_TAG, "weights": {"source": str(SOURCE)}, "gpus": [0], "port": 18999})
    return ModelConfig(name, spec, Path(f"{name}.yml"))


def time_cp(client) -> float:
    root = Path(client.info()["DockerRootDir"]) / "rigkit-bench-cp"
    shutil.rmtree(root, ignore_errors=True)
    dropped = drop_caches()
    started = time.monotonic()
    subprocess.run(["cp", "-a", str(SOURCE), str(root)], check=True)
    subprocess.run(["sync"], check=True)
    seconds = time.monotonic() - started
    shutil.rmtree(root)
    return seconds, dropped


def time_rigkit(client, name: str) -> tuple[float, object]:
    config = model(name)
    for v in client.volumes.list(filters={"name": f"rigkit-weights-{name}"}):
        v.remove(force=True)
    drop_caches()
    started = time.monotonic()
    [report] = copy(client, config)
    return time.monotonic() - started, report


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--shard-mb", type=int, default=300)
    args = parser.parse_args()
    ensure_standin_image()
    client = docker.from_env()
    shutil.rmtree(SOURCE.parent, ignore_errors=True)
    make_checkpoint(SOURCE, shards=SHARDS, shard_bytes=args.shard_mb << 20)
    total = sum(p.stat().st_size for p in SOURCE.rglob("*") if p.is_file())
    files = sum(1 for p in SOURCE.rglob("*") if p.is_file())
    print(f"checkpoint: {files} files, {total / 1e9:.2f} GB")

    cp1, dropped = time_cp(client)
    r1, rep1 = time_rigkit(client, "bench-a")
    r2, rep2 = time_rigkit(client, "bench-b")
    cp2, _ = time_cp(client)
    cp_s, rigkit_s = (cp1 + cp2) / 2, (r1 + r2) / 2
    print(f"page cache dropped before each copy: {dropped}")
    print(f"cp -a:        {cp1:.2f} s, {cp2:.2f} s  -> {total / 1e6 / cp_s:.0f} MB/s")
    print(f"rigkit copy:  {r1:.2f} s, {r2:.2f} s  -> {total / 1e6 / rigkit_s:.0f} MB/s "
          f"(helper's own figure: {rep1.mb_per_s:.0f}, {rep2.mb_per_s:.0f} MB/s)")
    print(f"throughput ratio rigkit / cp -a: {cp_s / rigkit_s:.2f} (goal >= 0.95, issue #15)")

    noop = []
    for _ in range(3):
        started = time.monotonic()
        assert not needs_copy(client, model("bench-a"))
        noop.append(time.monotonic() - started)
    print(f"no-op rerun (metadata check, helper container included): "
          f"{', '.join(f'{s:.2f}' for s in noop)} s (goal < 1 s)")
    for name in ("bench-a", "bench-b"):
        for v in client.volumes.list(filters={"name": f"rigkit-weights-{name}"}):
            v.remove(force=True)
    shutil.rmtree(SOURCE.parent)


if __name__ == "__main__":
    main()
