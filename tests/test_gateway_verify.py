"""Verification through the gateway (rigkit.gateway.verify) against the real LiteLLM proxy
(litellm[proxy] from PyPI, tests/gateway/venv.py) run as a local process with the config rigkit
renders, health checks on, in front of two vLLM stand-ins (local processes, each with an API key).

Simulated: vLLM (tests/vllm_standin), and two ways a gateway loses the server's usage:
- `stripped`: a gateway that passes no usage through streaming: a LiteLLM callback
  (tests/gateway/strip_usage.py) drops `usage` from that model's streamed chunks;
- `estimated`: a gateway whose server sends it no usage (as if it did not forward
  stream_options.include_usage): LiteLLM's backend is a stand-in that ignores include_usage
  (STANDIN_FAULT=no_usage), while the direct requests go to a twin stand-in of the same model that
  reports usage, as the same server would to a client that asks for it. LiteLLM then makes usage up
  from its own tokenizer; nothing about that part is simulated.
The deployed path (pyinfra, SSH forwards, the simulated rigs) is in tests/test_gateway.py.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from contextlib import ExitStack
from pathlib import Path

import httpx
import pytest

from rigkit.config.schema import GatewaySpec, ModelConfig, ModelSpec, RigConfig, RigSpec
from rigkit.gateway.config import BESIDE_CONFIG, render_config
from rigkit.gateway.plan import RigView, plan
from rigkit.gateway.stack import backend_keys
from rigkit.plumbing.render import template_path
from rigkit.gateway import verify as gv
from tests.gateway.venv import litellm_python
from tests.standin import free_port, standin

REPO = Path(__file__).resolve().parents[1]
MASTER = "sk-verify-test"
KEYS = {"kept": "key-kept $1", "stripped": "key-stripped #2", "estimated": "key-estimated 3"}
FAULTS = {"estimated": "no_usage"}
HEALTH_CHECK_INTERVAL_S = 2  # short, so checks run while the tests watch


def rig(folder: Path, name: str, port: int) -> RigConfig:
    key_file = folder / f"{name}.key"
    key_file.write_text(KEYS[name] + "\n")
    key_file.chmod(0o600)
    spec = RigSpec(os="linux", psu_w=1200, system_w=200, gpus=[{"index": 0, "model": "RTX 4090"}], models=[name],
                   api_key_file=str(key_file))
    model = ModelSpec(image="x/standin:1", weights={"source": "/x"}, gpus=[0], port=port,
                      vllm={"served_model_name": name})
    return RigConfig(name, spec, (ModelConfig(name, model, Path(f"{name}.yml")),), Path(f"{name}.yml"))


@pytest.fixture(scope="module")
def proxy(tmp_path_factory):
    """{"gateway": url, model: its stand-in's url, "estimated-twin": url}, LiteLLM in front of the three
    stand-ins (not the twin)."""
    folder = tmp_path_factory.mktemp("gwverify")
    rates = {"standin_decode_tok_s": "400", "standin_prefill_tok_s": "20000"}
    urls = {}
    with ExitStack() as stack:
        for name in KEYS:
            (folder / name).mkdir()
            fault = {"standin_fault": FAULTS[name]} if name in FAULTS else {}
            urls[name] = stack.enter_context(standin(folder / name, "--api-key", KEYS[name], name=name, **rates,
                                                     **fault))
        (folder / "twin").mkdir()
        urls["estimated-twin"] = stack.enter_context(standin(folder / "twin", "--api-key", KEYS["estimated"],
                                                             name="estimated", **rates))
        port = free_port()
        gateway = GatewaySpec(port=port, master_key_file="/unused", health_check_interval_s=HEALTH_CHECK_INTERVAL_S)
        views = [RigView(f"rig-{name}", rig(folder, name, int(urls[name].rsplit(":", 1)[1])), "127.0.0.1",
                         gateway=gateway if name == "kept" else None, gateway_address="127.0.0.1") for name in KEYS]
        gateway_plan = plan(views)
        config = render_config(gateway_plan).replace("- rigkit_drain.handler", "- rigkit_drain.handler\n  - strip_usage.handler")
        (folder / "config.yaml").write_text(config)
        # What `rigkit-gateway up` hands the proxy: each replica's key, sent by rigkit's callback.
        (folder / "backend_keys.json").write_bytes(
            backend_keys(gateway_plan, {f"RIGKIT_KEY_RIG_{name.upper()}": key for name, key in KEYS.items()}))
        for module in BESIDE_CONFIG:  # the drain filter and the key check, as the deployed gateway has them
            shutil.copy(template_path(module), folder / Path(module).name)
        shutil.copy(REPO / "tests/gateway/strip_usage.py", folder / "strip_usage.py")
        env = dict(os.environ, LITELLM_MASTER_KEY=MASTER, LITELLM_LOG="ERROR", STRIP_USAGE_MODELS="stripped")
        log = open(folder / "litellm.log", "w")
        proc = subprocess.Popen([str(litellm_python()), "-m", "litellm.proxy.proxy_cli", "--config",
                                 str(folder / "config.yaml"), "--host", "127.0.0.1", "--port", str(port)],
                                env=env, cwd=folder, stdout=log, stderr=subprocess.STDOUT)
        stack.callback(log.close)
        stack.callback(proc.wait)
        stack.callback(proc.kill)
        url = f"http://127.0.0.1:{port}"
        for _ in range(300):
            try:
                if httpx.get(f"{url}/health/liveliness", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                assert proc.poll() is None, (folder / "litellm.log").read_text()[-3000:]
            time.sleep(0.5)
        else:
            pytest.fail("LiteLLM did not start within 150 s: " + (folder / "litellm.log").read_text()[-3000:])
        yield {"gateway": url, **urls}


def test_through_the_gateway_tokens_come_from_usage_and_the_added_ttft_is_measured(proxy):
    result = gv.measure_model(proxy["gateway"], MASTER, proxy["kept"], KEYS["kept"], "kept", ["rig-kept.kept"],
                              "rig-kept.kept", timeout_s=60, seed=1)
    entry = result.to_json()
    assert result.passed, [c for c in result.checks if not c.passed]
    assert entry["usage_passed_through"] is True and entry["usage_from_server"] is True
    assert entry["completion_tokens"] == gv.OUTPUT_TOKENS  # the stand-in's usage, through LiteLLM's stream
    probe = entry["usage_probe"]
    assert probe["direct"] == probe["gateway"] == [gv.PROBE_PROMPT_TOKENS, gv.PROBE_OUTPUT_TOKENS]
    assert entry["prompt_tokens"] == gv.PROMPT_TOKENS
    assert len(entry["ttft_direct_samples_ms"]) == len(entry["ttft_gateway_samples_ms"]) == 2 * gv.TTFT_BLOCKS
    assert entry["ttft_direct_ms"] > 0 and entry["ttft_gateway_ms"] > 0
    assert entry["ttft_added_ms"] == pytest.approx(entry["ttft_gateway_ms"] - entry["ttft_direct_ms"])
    assert {c["name"] for c in entry["checks"]} >= {"tokens_produced", "gateway_usage", "gateway_ttft"}
    # The measured comparison against a limit below what LiteLLM really added: the check fails on it.
    below = max(entry["ttft_added_ms"] / 2, 0.001) if entry["ttft_added_ms"] > 0 else None
    if below is not None:
        assert not gv.check_ttft(result.ttft, below).passed
    assert gv.check_ttft(result.ttft, entry["ttft_added_ms"] + 1).passed
    print(gv.summary_line(result))


def test_a_gateway_that_drops_usage_fails_verification_and_nothing_is_counted_from_chunks(proxy):
    result = gv.measure_model(proxy["gateway"], MASTER, proxy["stripped"], KEYS["stripped"], "stripped",
                              ["rig-stripped.stripped"], "rig-stripped.stripped", timeout_s=60, seed=1)
    checks = {c.name: c for c in result.checks}
    assert not result.passed
    assert not checks["gateway_usage"].passed
    assert "no usage reached the client through the gateway's stream" in checks["gateway_usage"].message
    assert "does not count chunks instead" in checks["gateway_usage"].message
    entry = result.to_json()
    assert entry["usage_passed_through"] is False
    assert entry["completion_tokens"] is None and entry["decode_tok_s"] is None  # no chunk-counted figure
    assert entry["ttft_added_ms"] is None and "no usage" in entry["ttft_note"]
    assert gv.summary_line(result).startswith("FAIL  gateway stripped: NO USAGE through the gateway")


def test_usage_the_gateway_made_up_is_told_from_the_servers_and_fails(proxy):
    result = gv.measure_model(proxy["gateway"], MASTER, proxy["estimated-twin"], KEYS["estimated"], "estimated",
                              ["rig-estimated.estimated"], "rig-estimated.estimated", timeout_s=60, seed=1)
    entry = result.to_json()
    checks = {c.name: c for c in result.checks}
    # LiteLLM did hand the client a usage (its own count), so the plain "was there usage" test is passed...
    assert entry["usage_passed_through"] is True and entry["completion_tokens"] is not None
    # ...but it is not the server's count of the same prompt, and verification says so.
    assert entry["usage_from_server"] is False
    assert entry["usage_probe"]["direct"] == [gv.PROBE_PROMPT_TOKENS, gv.PROBE_OUTPUT_TOKENS]
    assert entry["usage_probe"]["gateway"] != entry["usage_probe"]["direct"], entry["usage_probe"]
    assert not result.passed and not checks["gateway_usage"].passed
    assert "the gateway's usage is not the server's" in checks["gateway_usage"].message
    assert gv.summary_line(result).startswith("FAIL  gateway estimated: usage NOT the server's")
    print(checks["gateway_usage"].message)


def read_counts(url: str, key: str) -> tuple[float, float]:
    """(requests, generated tokens) the stand-in has served, from its /metrics."""
    text = httpx.get(f"{url}/metrics", headers={"Authorization": f"Bearer {key}"}, timeout=5).text
    values = {}
    for line in text.splitlines():
        for name in ("vllm:request_success_total", "vllm:generation_tokens_total"):
            if line.startswith(name + "{"):
                values[name] = float(line.rsplit(" ", 1)[1])
    return values.get("vllm:request_success_total", 0.0), values.get("vllm:generation_tokens_total", 0.0)


def test_health_checks_authenticate_with_the_rigs_key_and_cost_one_token_each(proxy):
    """No client traffic meanwhile: whatever the stand-ins serve is LiteLLM's background checks."""
    before = {n: read_counts(proxy[n], KEYS[n]) for n in KEYS}
    deadline = time.monotonic() + 10 * HEALTH_CHECK_INTERVAL_S + 10
    while True:  # until two checks have reached every stand-in (they come at the interval)
        after = {n: read_counts(proxy[n], KEYS[n]) for n in KEYS}
        if all(after[n][0] - before[n][0] >= 2 for n in KEYS):
            break
        assert time.monotonic() < deadline, ("fewer than 2 health checks per replica", before, after)
        time.sleep(0.5)
    for name in KEYS:
        requests = after[name][0] - before[name][0]
        tokens = after[name][1] - before[name][1]
        assert requests >= 2, (name, before, after)  # checks keep coming, at the interval
        assert tokens == requests  # one token each: health_check_max_tokens reached the request
    health = httpx.get(f"{proxy['gateway']}/health", headers={"Authorization": f"Bearer {MASTER}"}, timeout=30).json()
    # The stand-ins refuse requests without their key: healthy means the check sent the rig's key.
    assert health["healthy_count"] == len(KEYS) and health["unhealthy_count"] == 0, health


def test_the_direct_replica_is_the_one_on_the_gateways_rig_else_the_first(tmp_path):
    """Pure: which replica the TTFT comparison asks directly."""
    from roles.gateway_verify import direct_replica

    gateway = GatewaySpec(port=4100, master_key_file="/unused")
    rigs = {name: rig(tmp_path, name, port) for name, port in (("kept", 18301), ("stripped", 18302))}
    on_b = plan([RigView("rig-a", rigs["kept"], "10.0.0.1", gateway_address="10.0.0.1"),
                 RigView("rig-b", rigs["stripped"], "10.0.0.2", gateway=gateway)])
    assert direct_replica(on_b, "stripped").deployment_id == "rig-b.stripped"  # the gateway's own rig
    assert direct_replica(on_b, "kept").deployment_id == "rig-a.kept"  # the only one, reached as the gateway does
    assert direct_replica(on_b, "kept").api_base == "http://10.0.0.1:18301/v1"


def test_ttft_figures_are_medians_and_their_difference_and_a_failed_request_fails_the_check():
    """Pure: the comparison's arithmetic and verdicts."""
    ok = gv.TtftComparison("rig-a.m", [10.0, 30.0, 12.0], [50.0, 70.0, 55.0])
    assert (ok.ttft_direct_ms, ok.ttft_gateway_ms, ok.ttft_added_ms) == (12.0, 55.0, 43.0)
    assert gv.check_ttft(ok).passed and "+43.0 ms" in gv.check_ttft(ok).message
    failed = gv.TtftComparison("rig-a.m", [10.0], [50.0], ["gateway: HTTP 502: no healthy deployment"])
    assert not gv.check_ttft(failed).passed and "HTTP 502" in gv.check_ttft(failed).message
    none = gv.TtftComparison("rig-a.m", [], [], [], "not measured: the warm-up request on the direct path failed")
    assert none.ttft_added_ms is None and not gv.check_ttft(none).passed
    # The threshold: at the limit passes, above it fails with both figures and the setting named.
    assert gv.check_ttft(ok, max_added_ms=43.0).passed
    slow = gv.check_ttft(ok, max_added_ms=40)
    assert not slow.passed and slow.message == (
        "the gateway adds 43.0 ms to the first token (TTFT 55.0 ms through it vs 12.0 ms direct to rig-a.m), more "
        "than max_added_ttft_ms 40: is it buffering, retrying or queueing requests?")
    assert GatewaySpec(port=4100, master_key_file="/unused").max_added_ttft_ms == 250
