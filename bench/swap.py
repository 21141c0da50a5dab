"""Each swap path of an on-demand model, timed from the request to its first token through rigkit-ondemand's
front and scheduler (rigkit/rigside: front, swap, engine_control), from one run. docs/on-demand.md.

1. vLLM's sleep mode, level 1, on two vLLM stand-ins sized as a 32B model (local processes, no GPU). Their
   sleep and wake times are vLLM's published figures scaled to 32B by the bytes they copy: Qwen3-8B on an
   A100, level 1: sleep 10.57 s, wake 2.19 s, with ~22 GiB backed up in host RAM (vllm-project/vllm#48337,
   a maintainer-run comparison of 2026-07-15). A 32B model in bfloat16 backs up 59.6 GiB: 2.71 x, so sleep
   28.6 s and wake 5.93 s. Timed: a wake with the GPUs free (issue #51: within 10 s), and a swap, where the
   other model must sleep first.
2. NVIDIA's cuda-checkpoint (swap: checkpoint), on the same stand-ins with the stand-in tool
   (tests/simrig/cuda-checkpoint). Its times are this project's H200 measurement (tests/gpu/test_park_gpu.py:
   checkpoint 3.81 s, restore 1.17 s for a process using 6756 MiB) scaled linearly to what a 32B model's
   process holds on an 80 GB card at gpu_memory_utilization 0.9, 72 GiB (its weights and its KV cache: a
   checkpoint copies all of it, where a level-1 sleep copies the weights alone): 10.9 x, checkpoint 41.6 s,
   restore 12.8 s. An extrapolation: both copy the process's GPU memory through host memory.
3. Stop and start (engines without sleep mode: vLLM's CPU build refuses --enable-sleep-mode), on the real
   engine here: the demo's model from the compose file rigkit renders (bench/startup.py's), its compile cache
   on a volume of this bench's own. A cold start (empty cache, new container) against a swap back in (the
   stopped container started again by the scheduler, warm), each from request to first token. Issue #51: the
   warm one at most 0.6 of the cold one.

Under the Docker lock, alone (it measures):

    flock /tmp/rigkit-docker.lock .venv/bin/python bench/swap.py [--skip-real]
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
sys.path.insert(0, str(REPO / "bench"))

import httpx  # noqa: E402

from rigkit.rigside.engine_control import Engine  # noqa: E402
from rigkit.rigside.front import Front  # noqa: E402
from rigkit.rigside.swap import Scheduler, Slot  # noqa: E402
from tests import ondemand_engines  # noqa: E402
from tests.standin import free_port  # noqa: E402

SCALE_32B = 59.6 / 22  # GiB a 32B bf16 model backs up / GiB the measured 8B backed up (vllm#48337)
SLEEP_S = {1: round(10.57 * SCALE_32B, 2)}
WAKE_S = {1: round(2.19 * SCALE_32B, 2)}
SCALE_CHECKPOINT_32B = 72 * 1024 / 6756  # MiB a 32B model's process holds at 0.9 of 80 GB / MiB of the H200's one
CHECKPOINT_S, RESTORE_S = round(3.81 * SCALE_CHECKPOINT_32B, 2), round(1.17 * SCALE_CHECKPOINT_32B, 2)
CUDA_CHECKPOINT = str(REPO / "tests" / "simrig" / "cuda-checkpoint")


def first_token_s(url: str, model: str, timeout: float = 900) -> float:
    """Seconds from sending a streamed completion to its first token."""
    body = {"model": model, "prompt": "one two three", "max_tokens": 4, "stream": True}
    started = time.monotonic()
    with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=timeout) as response:
        if response.status_code != 200:
            response.read()
            raise SystemExit(f"{model}: HTTP {response.status_code} {response.text[:300]}")
        for line in response.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                if json.loads(line[6:]).get("choices"):
                    return time.monotonic() - started
    raise SystemExit(f"{model}: a stream with no token")


def serve(slots: dict, engine_urls: dict) -> tuple[Scheduler, dict, list]:
    scheduler = Scheduler(slots, hold_s=900)
    scheduler.start()
    fronts, urls = [], {}
    for name in slots:
        front = Front(name, ("127.0.0.1", free_port()), engine_urls[name], scheduler)
        front.serve_in_thread()
        fronts.append(front)
        urls[name] = f"http://127.0.0.1:{front.server_address[1]}"
    return scheduler, urls, fronts


def stand_in_path(folder: Path, swap: str) -> tuple[float, float, float]:
    """(first token with the model loaded, after a swap, after a wake with the GPUs free) on two stand-ins sized
    as a 32B model, parked by `swap` ("sleep" or "checkpoint")."""
    import os

    registry = folder / f"cuda-processes-{swap}"
    os.environ["CUDA_CHECKPOINT_STANDIN_REGISTRY"] = str(registry)
    env = {"STANDIN_SLEEP_S": ",".join(f"{k}:{v}" for k, v in SLEEP_S.items()),
           "STANDIN_WAKE_S": ",".join(f"{k}:{v}" for k, v in WAKE_S.items()),
           "STANDIN_CHECKPOINT_S": str(CHECKPOINT_S), "STANDIN_RESTORE_S": str(RESTORE_S),
           "STANDIN_CHECKPOINT_REGISTRY": str(registry)}
    specs, slots, engine_urls = [], {}, {}
    try:
        for name in ("alpha", "beta"):
            port = free_port()
            spec = ondemand_engines.spec_for(folder / swap, name, port, env, [])
            specs.append(spec)
            subprocess.run(ondemand_engines.command("start", spec), check=True, timeout=30)
            engine_urls[name] = f"http://127.0.0.1:{port}"
            engine = Engine(name=name, served_name=name, url=engine_urls[name], swap=swap, sleep_level=1,
                            stop=ondemand_engines.command("stop", spec), start=ondemand_engines.command("start", spec),
                            restart=ondemand_engines.command("restart", spec), ready_timeout_s=60,
                            checkpoint_tool=CUDA_CHECKPOINT, pids=ondemand_engines.command("pids", spec))
            engine.wait_ready()
            engine.wake()  # records the canary from this start
            slots[name] = Slot(engine=engine, conflicts={"beta"} if name == "alpha" else {"alpha"})
        _, slots["beta"].parked_as = slots["beta"].engine.park()
        slots["alpha"].state, slots["beta"].state = "awake", "parked"
        scheduler, urls, fronts = serve(slots, engine_urls)
        awake_s = first_token_s(urls["alpha"], "alpha")
        swap_s = first_token_s(urls["beta"], "beta")  # alpha is parked, then beta loaded
        with scheduler.cond:  # beta parked by hand, as the scheduler would: the GPUs are free then
            _, slots["beta"].parked_as = slots["beta"].engine.park()
            slots["beta"].state = "parked"
            slots["alpha"].state = "parked"  # alpha is parked already (the swap above)
        wake_s = first_token_s(urls["beta"], "beta")
        for front in fronts:
            front.shutdown()
        scheduler.stop()
    finally:
        for spec in specs:
            ondemand_engines.stop(spec)
    return awake_s, swap_s, wake_s


def sleep_path(folder: Path) -> None:
    awake_s, swap_s, wake_s = stand_in_path(folder, "sleep")
    print(f"sleep mode, level 1, a 32B model (stand-in: sleep {SLEEP_S[1]} s, wake {WAKE_S[1]} s):")
    print(f"  loaded already:            {awake_s:6.2f} s to the first token")
    print(f"  woken, GPUs free:          {wake_s:6.2f} s   (issue #51: within 10 s)")
    print(f"  swapped (the other sleeps): {swap_s:6.2f} s")
    print(f"  swapped / woken: {swap_s / wake_s:.2f}")


def checkpoint_path(folder: Path) -> None:
    awake_s, swap_s, wake_s = stand_in_path(folder, "checkpoint")
    print(f"cuda-checkpoint, a 32B model (stand-in: checkpoint {CHECKPOINT_S} s, restore {RESTORE_S} s, "
          "the H200's times scaled by the bytes):")
    print(f"  loaded already:                   {awake_s:6.2f} s to the first token")
    print(f"  restored, GPU free:               {wake_s:6.2f} s")
    print(f"  swapped (the other checkpointed): {swap_s:6.2f} s")


def stop_start_path(folder: Path) -> None:
    import docker

    from startup import PORT, PROJECT, clear, compose, compose_file

    client = docker.from_env()
    path = compose_file(folder, {})
    clear(path, client)
    url = f"http://127.0.0.1:{PORT}"
    base = ["docker", "compose", "-f", str(path)]
    engine = Engine(name="sim-chat", served_name="sim-chat", url=url, swap="stop", stop=[*base, "stop"],
                    start=[*base, "start"], restart=[*base, "restart"], ready_timeout_s=900)
    try:
        started = time.monotonic()
        compose(path, "up", "-d")  # a cold start: a new container, an empty compile cache
        engine.wait_ready()
        cold_s = time.monotonic() - started
        engine.wake()  # records the canary from this start
        print(engine.park()[0])
        slot = Slot(engine=engine, state="parked")
        scheduler, urls, fronts = serve({"sim-chat": slot}, {"sim-chat": url})
        warm_s = first_token_s(urls["sim-chat"], "sim-chat")
        print(f"  the scheduler's swap: {scheduler.swaps}")
        for front in fronts:
            front.shutdown()
        scheduler.stop()
    finally:
        clear(path, client)
    print(f"stop and start, the real engine (vLLM's CPU build, {PROJECT}):")
    print(f"  cold start, request to first token: {cold_s:6.1f} s")
    print(f"  swapped back in (stopped container started, warm): {warm_s:6.1f} s")
    print(f"  warm / cold: {warm_s / cold_s:.2f}   (issue #51: at most 0.6)")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--skip-real", action="store_true", help="the stand-in's sleep path only")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        sleep_path(Path(folder))
        checkpoint_path(Path(folder))
        if not args.skip_real:
            stop_start_path(Path(folder))
    return 0


if __name__ == "__main__":
    sys.exit(main())
