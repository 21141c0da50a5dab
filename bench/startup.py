"""Cold and warm starts of the real engine side by side, from one run: time to ready and where it went.

Serves the demo's model (inventory/models/sim-chat.yml: vLLM 0.32's CPU build, bfloat16, compiled) from the
compose file rigkit renders for it, on the host's Docker (its weights bind-mounted from the offline test model,
its port moved off the demo's, its compile cache on a volume of this bench's own). Start 1 is cold: the cache
volume is made empty first. Each later start is a new container on the same volume, as a redeploy, a
rollback or a reboot would start. Each start is read as rigkit-stack reads it (rigkit.rigside.startup: the
container's log, Docker's timestamps) up to the first answered completion. Prints each start's table, then
each warm start's time as a ratio of the cold one's (issue #50: at most 0.6). Under the Docker lock, alone
(it measures):

    flock /tmp/rigkit-docker.lock .venv/bin/python bench/startup.py [--warm 2] [--env VLLM_USE_AOT_COMPILE=0]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import docker  # noqa: E402
import yaml  # noqa: E402

from rigkit.config.loader import load_model  # noqa: E402
from rigkit.config.schema import ModelConfig  # noqa: E402
from rigkit.rigside.names import ENGINE_SERVICE  # noqa: E402
from rigkit.rigside.probe import NoAnswer, one_token  # noqa: E402
from rigkit.rigside.startup import stamp, startup, table  # noqa: E402
from rigkit.serving.compose import render_compose  # noqa: E402
from tests.vllm_engine.models import ensure_engine_model  # noqa: E402

PORT = 18191
PROJECT = "rigkit-bench-startup"
VOLUME = "rigkit-bench-compile-cache"
READY_S = 600


def compose_file(folder: Path, extra_env: dict[str, str]) -> Path:
    model = load_model(REPO / "inventory" / "models" / "sim-chat.yml")
    model = ModelConfig(model.name, model.spec.model_copy(update={"port": PORT}), model.file)
    document = yaml.safe_load(render_compose(model, with_api_key=False))
    document["name"] = PROJECT
    service = document["services"][ENGINE_SERVICE]
    service["volumes"][0] = {"type": "bind", "source": str(ensure_engine_model(log=lambda m: None)),
                             "target": service["volumes"][0]["target"], "read_only": True}
    service["environment"].update(extra_env)
    service.pop("deploy", None)  # no GPU reservation: the host's dockerd has no NVIDIA runtime
    document["volumes"] = {"compile_cache": {"name": VOLUME}}
    path = folder / "compose.json"
    path.write_text(json.dumps(document))
    return path


def compose(path: Path, *args: str) -> None:
    subprocess.run(["docker", "compose", "-f", str(path), *args], check=True, capture_output=True, timeout=600)


def clear(path: Path, client) -> None:
    """The bench's stack down and its compile cache volume gone: a cold start next."""
    compose(path, "down")
    try:
        client.volumes.get(VOLUME).remove(force=True)
    except docker.errors.NotFound:
        pass


def one_start(path: Path, served: str) -> dict:
    compose(path, "up", "-d")
    deadline = time.monotonic() + READY_S
    while True:
        try:
            one_token(PORT, served, None, 30)
            ready_at = time.time()
            break
        except NoAnswer:
            if time.monotonic() > deadline:
                raise SystemExit(f"not ready within {READY_S} s")
            time.sleep(0.5)
    [container] = docker.from_env().containers.list(filters={"label": f"com.docker.compose.project={PROJECT}"})
    started = container.attrs["State"]["StartedAt"]
    log = subprocess.run(["docker", "logs", "--timestamps", "--since", started, container.id], capture_output=True,
                         text=True, timeout=60, errors="replace")
    doc = startup(log.stdout + log.stderr, stamp(started), ready_at)
    compose(path, "down")
    return doc


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--warm", type=int, default=2, help="warm starts after the cold one")
    parser.add_argument("--env", action="append", default=[], help="KEY=VALUE for the engine (an experiment)")
    args = parser.parse_args()
    extra = dict(item.split("=", 1) for item in args.env)
    client = docker.from_env()
    with tempfile.TemporaryDirectory() as folder:
        path = compose_file(Path(folder), extra)
        clear(path, client)
        starts = []
        try:
            for n in range(args.warm + 1):
                doc = one_start(path, "sim-chat")
                starts.append(doc)
                print("\n".join(table(f"sim-chat ({'cold' if n == 0 else f'warm {n}'})", doc)), flush=True)
        finally:
            clear(path, client)
    cold = starts[0]["total_s"]
    print(f"\ncold {cold:.1f} s" + (f" (env {extra})" if extra else ""))
    for n, doc in enumerate(starts[1:], 1):
        compile_s = next((p["s"] for p in doc["phases"] if p["phase"] == "compile"), 0.0)
        print(f"warm {n}: {doc['total_s']:.1f} s = {doc['total_s'] / cold:.2f} of cold (compile {compile_s:.1f} s, "
              f"cache {doc['compile_cache']['cache']})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
