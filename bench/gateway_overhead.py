"""What does the LiteLLM gateway add? TTFT and throughput through it against direct requests to
the same replicas, as ratios from one run.

Runs two vLLM stand-ins locally (known prefill and decode rates) and the real LiteLLM proxy
(litellm[proxy] from PyPI, tests/gateway/venv.py) as a local process, with the config rigkit
renders for two rigs of one replica each. rigkit's benchmark client measures each path in
ABBA order (direct, gateway, gateway, direct) so drift cancels; per path it reports single-stream
TTFT and decode rate (tokens from usage: the gateway must pass usage through streaming) and the
aggregate rate at 8 streams (spread over both replicas through the gateway, over one replica
per half when direct).

    .venv/bin/python bench/gateway_overhead.py
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rigkit.config.schema import GatewaySpec, ModelConfig, ModelSpec, RigConfig, RigSpec  # noqa: E402
from rigkit.gateway.config import render_config  # noqa: E402
from rigkit.gateway.plan import RigView, plan  # noqa: E402
from rigkit.plumbing.render import template_path  # noqa: E402
from rigkit.verify.client import run_bench  # noqa: E402
from tests.gateway.venv import litellm_python  # noqa: E402
from tests.standin import free_port, standin  # noqa: E402

MASTER_KEY = "sk-bench"
PROMPT_TOKENS, OUTPUT_TOKENS, STREAMS = 256, 128, 8
RATES = {"standin_decode_tok_s": "400", "standin_prefill_tok_s": "20000"}


def rig(name: str, port: int) -> RigConfig:
    spec = RigSpec(os="linux", psu_w=1200, system_w=200, gpus=[{"index": 0, "model": "RTX 4090"}], models=[name])
    model = ModelSpec(image="x/standin:1", weights={"source": "/x"}, gpus=[0], port=port,
                      vllm={"served_model_name": "m"})
    return RigConfig(name, spec, (ModelConfig(name, model, Path(f"{name}.yml")),), Path(f"{name}.yml"))


def start_gateway(folder: Path, ports: list[int]) -> tuple[str, subprocess.Popen]:
    port = free_port()
    gateway = GatewaySpec(port=port, master_key_file="/unused")
    views = [RigView(f"rig{n}", rig(f"replica{n}", p), "127.0.0.1", gateway=gateway if n == 0 else None,
                     gateway_address="127.0.0.1") for n, p in enumerate(ports)]
    (folder / "config.yaml").write_text(render_config(plan(views)))
    (folder / "rigkit_drain.py").write_text(template_path("gateway/rigkit_drain.py").read_text())
    # The stand-in streams one word over and over; LiteLLM's loop guard ends a stream after 100
    # identical chunks (a real model's text varies), so the guard is raised for this bench only.
    env = dict(os.environ, LITELLM_MASTER_KEY=MASTER_KEY, LITELLM_LOG="ERROR", REPEATED_STREAMING_CHUNK_LIMIT="100000")
    proc = subprocess.Popen([str(litellm_python()), "-m", "litellm.proxy.proxy_cli", "--config",
                             str(folder / "config.yaml"), "--host", "127.0.0.1", "--port", str(port),
                             "--num_workers", "1"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    for _ in range(120):
        try:
            if httpx.get(f"{url}/health/liveliness", timeout=1).status_code == 200:
                return url, proc
        except httpx.HTTPError:
            pass
        time.sleep(1)
    proc.kill()
    raise SystemExit("the LiteLLM proxy did not start within 120 s")


def measure(url: str, key: str | None) -> dict:
    result = run_bench(url, "m", PROMPT_TOKENS, OUTPUT_TOKENS, concurrency=(STREAMS,), api_key=key, seed=1)
    level = result.concurrency[0]
    if level.errors:
        print(f"{url}: {len(level.errors)} failed, e.g. {level.errors[0]}", file=sys.stderr)
    return {"ttft_s": result.ttft_s, "decode_tok_s": result.decode_tok_s, "aggregate_tok_s": level.aggregate_tok_s,
            "errors": len(level.errors), "usage_tokens": result.completion_tokens}


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp, ExitStack() as stack:
        folder = Path(tmp)
        urls = []
        for n in range(2):
            (folder / f"s{n}").mkdir()
            urls.append(stack.enter_context(standin(folder / f"s{n}", **RATES)))
        gateway, proc = start_gateway(folder, [int(u.rsplit(":", 1)[1]) for u in urls])
        stack.callback(proc.wait)
        stack.callback(proc.kill)
        measure(gateway, MASTER_KEY)  # warm the proxy (imports, connection pools)
        runs = {"direct": [], "gateway": []}
        for path in ("direct", "gateway", "gateway", "direct"):
            url, key = (urls[len(runs["direct"]) % 2], None) if path == "direct" else (gateway, MASTER_KEY)
            runs[path].append(measure(url, key))
    mean = {p: {k: sum(r[k] or 0 for r in rs) / len(rs) for k in rs[0]} for p, rs in runs.items()}
    print(f"{'':>18} {'direct':>10} {'gateway':>10} {'ratio':>7}")
    for key, unit in (("ttft_s", "s"), ("decode_tok_s", "tok/s"), ("aggregate_tok_s", "tok/s")):
        d, g = mean["direct"][key], mean["gateway"][key]
        print(f"{key:>18} {d:>10.4f} {g:>10.4f} {g / d if d else float('nan'):>7.3f}   ({unit})")
    print(f"gateway TTFT added: {1000 * (mean['gateway']['ttft_s'] - mean['direct']['ttft_s']):.1f} ms; "
          f"usage tokens through the gateway: {mean['gateway']['usage_tokens']:.0f} of {OUTPUT_TOKENS}; "
          f"failed requests: direct {mean['direct']['errors']:.0f}, gateway {mean['gateway']['errors']:.0f} "
          f"(aggregate at {STREAMS} streams: direct = one replica, gateway = both)")


if __name__ == "__main__":
    main()
