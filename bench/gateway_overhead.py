"""What does the LiteLLM gateway add? TTFT and throughput through it against direct requests to
the same replicas, as ratios from one run.

Runs two vLLM stand-ins locally (known prefill and decode rates) and the real LiteLLM proxy
(litellm[proxy] from PyPI, tests/gateway/venv.py) as a local process, with the config rigkit
renders for two rigs of one replica each. rigkit's benchmark client measures each path in
ABBA order (direct, gateway, gateway, direct) so drift cancels; per path it reports single-stream
TTFT and decode rate (tokens from usage: the gateway must pass usage through streaming) and the
aggregate rate at 8 streams (spread over both replicas through the gateway, over one replica
per half when direct).

TLS: a second proxy with the same config serves HTTPS with a certificate rigkit's fleet CA issued
(rigkit.gateway.tls, as a deploy does), and is measured in the same ABBA sequence, pinned as rigkit's
own clients pin it. Each run reuses its connection (a warm-up request pays the handshake first, as a
client with keep-alive does); a second figure, "new connection", times the first token of requests
that each open a connection of their own, so it includes the TCP and TLS handshakes.

    .venv/bin/python bench/gateway_overhead.py
"""

from __future__ import annotations

import datetime as dt
import os
import random
import subprocess
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rigkit.config.schema import GatewaySpec, ModelConfig, ModelSpec, RigConfig, RigSpec  # noqa: E402
from rigkit.gateway.config import BESIDE_CONFIG, render_config  # noqa: E402
from rigkit.gateway.plan import RigView, plan  # noqa: E402
from rigkit.gateway.tls import gateway_tls  # noqa: E402
from rigkit.rigside.probe import pinned_context  # noqa: E402
from rigkit.plumbing.render import template_path  # noqa: E402
from rigkit.verify.client import http_client, make_prompt, run_bench  # noqa: E402
from rigkit.verify.stream import stream_completion  # noqa: E402
from tests.gateway.venv import litellm_python  # noqa: E402
from tests.standin import free_port, standin  # noqa: E402

MASTER_KEY = "sk-bench"
PROMPT_TOKENS, OUTPUT_TOKENS, STREAMS = 256, 128, 8
FRESH_REQUESTS = 8  # per path and pass: requests on a connection of their own
RATES = {"standin_decode_tok_s": "400", "standin_prefill_tok_s": "20000"}


def rig(name: str, port: int) -> RigConfig:
    spec = RigSpec(os="linux", psu_w=1200, system_w=200, gpus=[{"index": 0, "model": "RTX 4090"}], models=[name])
    model = ModelSpec(image="x/standin:1", weights={"source": "/x"}, gpus=[0], port=port,
                      vllm={"served_model_name": "m"})
    return RigConfig(name, spec, (ModelConfig(name, model, Path(f"{name}.yml")),), Path(f"{name}.yml"))


def start_gateway(folder: Path, ports: list[int], tls: bool = False) -> tuple[str, subprocess.Popen, object]:
    """A LiteLLM proxy over the stand-ins: (its URL, its process, how a client verifies it)."""
    folder.mkdir(exist_ok=True)
    port = free_port()
    gateway = GatewaySpec(port=port, master_key_file="/unused")
    views = [RigView(f"rig{n}", rig(f"replica{n}", p), "127.0.0.1", gateway=gateway if n == 0 else None,
                     gateway_address="127.0.0.1") for n, p in enumerate(ports)]
    (folder / "config.yaml").write_text(render_config(plan(views)))
    for module in BESIDE_CONFIG:  # the drain filter and the key check, as the deployed gateway has them
        (folder / Path(module).name).write_text(template_path(module).read_text())
    # The stand-in streams one word over and over; LiteLLM's loop guard ends a stream after 100
    # identical chunks (a real model's text varies), so the guard is raised for this bench only.
    env = dict(os.environ, LITELLM_MASTER_KEY=MASTER_KEY, LITELLM_LOG="ERROR", REPEATED_STREAMING_CHUNK_LIMIT="100000")
    ssl_args, verify, scheme = [], True, "http"
    if tls:
        material = gateway_tls("rigkit", folder / "rigkit-ca", ("127.0.0.1", "localhost"), dt.datetime.now(dt.timezone.utc))
        material.save()
        (folder / "chain.pem").write_bytes(material.cert_pem)
        (folder / "key.pem").write_bytes(material.key_pem)
        (folder / "key.pem").chmod(0o600)
        ssl_args = ["--ssl_certfile_path", str(folder / "chain.pem"), "--ssl_keyfile_path", str(folder / "key.pem")]
        verify, scheme = pinned_context(material.cert_pem.decode()), "https"
    proc = subprocess.Popen([str(litellm_python()), "-m", "litellm.proxy.proxy_cli", "--config",
                             str(folder / "config.yaml"), "--host", "127.0.0.1", "--port", str(port),
                             "--num_workers", "1", *ssl_args], env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    url = f"{scheme}://127.0.0.1:{port}"
    for _ in range(120):
        try:
            if httpx.get(f"{url}/health/liveliness", timeout=1, verify=verify).status_code == 200:
                return url, proc, verify
        except httpx.HTTPError:
            pass
        time.sleep(1)
    proc.kill()
    raise SystemExit("the LiteLLM proxy did not start within 120 s")


def measure(url: str, key: str | None, verify=True) -> dict:
    result = run_bench(url, "m", PROMPT_TOKENS, OUTPUT_TOKENS, concurrency=(STREAMS,), api_key=key, seed=1,
                       verify=verify)
    level = result.concurrency[0]
    if level.errors:
        print(f"{url}: {len(level.errors)} failed, e.g. {level.errors[0]}", file=sys.stderr)
    fresh = fresh_ttft(url, key, verify)
    return {"ttft_s": result.ttft_s, "new_connection_ttft_s": fresh, "decode_tok_s": result.decode_tok_s,
            "aggregate_tok_s": level.aggregate_tok_s, "errors": len(level.errors),
            "usage_tokens": result.completion_tokens}


def fresh_ttft(url: str, key: str | None, verify) -> float:
    """Mean time to first token of FRESH_REQUESTS short requests, each on a connection of its own."""
    rng, times = random.Random(2), []
    for _ in range(FRESH_REQUESTS):
        with http_client({"Authorization": f"Bearer {key}"} if key else {}, 60, verify=verify) as client:
            result = stream_completion(client, url, "m", make_prompt(32, rng), 32, 2, 60)
        if result.ttft_s is not None:
            times.append(result.ttft_s)
    return sum(times) / len(times) if times else float("nan")


def main() -> None:
    paths = ("direct", "gateway", "gateway_tls")
    with tempfile.TemporaryDirectory() as tmp, ExitStack() as stack:
        folder = Path(tmp)
        urls = []
        for n in range(2):
            (folder / f"s{n}").mkdir()
            urls.append(stack.enter_context(standin(folder / f"s{n}", **RATES)))
        ports = [int(u.rsplit(":", 1)[1]) for u in urls]
        targets = {}
        for path, tls in (("gateway", False), ("gateway_tls", True)):
            url, proc, verify = start_gateway(folder / path, ports, tls)
            stack.callback(proc.wait)
            stack.callback(proc.kill)
            targets[path] = (url, MASTER_KEY, verify)
            measure(*targets[path])  # warm the proxy (imports, connection pools)
        runs = {p: [] for p in paths}
        for path in (*paths, *reversed(paths)):  # ABCCBA: drift cancels
            url, key, verify = targets.get(path) or (urls[len(runs["direct"]) % 2], None, True)
            runs[path].append(measure(url, key, verify))
    mean = {p: {k: sum(r[k] or 0 for r in rs) / len(rs) for k in rs[0]} for p, rs in runs.items()}
    print(f"{'':>22} {'direct':>10} {'gateway':>10} {'https':>10} {'gw/dir':>7} {'https/gw':>8}")
    for key, unit in (("ttft_s", "s"), ("new_connection_ttft_s", "s"), ("decode_tok_s", "tok/s"),
                      ("aggregate_tok_s", "tok/s")):
        d, g, t = (mean[p][key] for p in paths)
        print(f"{key:>22} {d:>10.4f} {g:>10.4f} {t:>10.4f} {g / d if d else float('nan'):>7.3f} "
              f"{t / g if g else float('nan'):>8.3f}   ({unit})")
    ms = {p: 1000 * mean[p]["ttft_s"] for p in paths}
    fresh = {p: 1000 * mean[p]["new_connection_ttft_s"] for p in paths}
    print(f"gateway TTFT added: {ms['gateway'] - ms['direct']:.1f} ms; TLS adds {ms['gateway_tls'] - ms['gateway']:+.1f} ms "
          f"on a kept connection, {fresh['gateway_tls'] - fresh['gateway']:+.1f} ms on a new one (handshake included); "
          f"usage tokens through the gateway: {mean['gateway']['usage_tokens']:.0f} of {OUTPUT_TOKENS}; failed "
          f"requests: direct {mean['direct']['errors']:.0f}, gateway {mean['gateway']['errors']:.0f}, https "
          f"{mean['gateway_tls']['errors']:.0f} (aggregate at {STREAMS} streams: direct = one replica, gateway = both)")


if __name__ == "__main__":
    main()
