"""The vLLM stand-in held to vLLM itself: the same requests, compared on everything rigkit reads.

The real side is what vLLM 0.32.0 (its CPU build) printed, saved under tests/data/vllm-0.32/ (its README
says how it was captured); the stand-in (tests/vllm_standin, a local process) is asked the same here.
Compared: SSE framing, the chunk and usage fields rigkit reads on both endpoints, error codes and body
shapes, /health, /v1/models, and for every metric the stand-in exports, vLLM's name, type and labels.
Differences kept on purpose are listed in KNOWN_DIFFERENCES, each with why.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import httpx
import pytest

from tests.standin import standin

REAL = Path(__file__).parent / "data" / "vllm-0.32"
COMPLETION = {"prompt": "the of and to in", "max_tokens": 8, "temperature": 0, "ignore_eos": True, "stream": True,
              "stream_options": {"include_usage": True}}
CHAT = {**{k: v for k, v in COMPLETION.items() if k != "prompt"},
        "messages": [{"role": "user", "content": "the of and"}]}
# What the stand-in does that vLLM does not, and why it stays.
KNOWN_DIFFERENCES = {
    "/version": "says 'standin', so a result's provenance tells a stand-in's figures from an engine's",
    "vllm:request_success_total": "one series per model, without vLLM's finished_reason label (rigkit sums it)",
}


def events(raw: str) -> list[str]:
    """The data of each SSE event, checking the framing vLLM uses: `data: ` with its space, a blank line after
    each event, no comments or event names."""
    assert raw.endswith("\n\n"), raw[-80:]
    blocks = raw[:-2].split("\n\n")
    for block in blocks:
        assert block.startswith("data: ") and "\n" not in block, block
    return [block.removeprefix("data: ") for block in blocks]


def read_fields(data: list[str], chat: bool) -> dict:
    """What rigkit.verify.stream reads from a stream, in the shape it reads it."""
    assert data[-1] == "[DONE]"
    chunks = [json.loads(d) for d in data[:-1]]
    *tokens, usage = chunks
    kind = "chat.completion.chunk" if chat else "text_completion"
    out = {"id_prefix": {c["id"].split("-")[0] for c in chunks}, "object": {c["object"] for c in chunks},
           "usage_choices": usage["choices"], "usage_keys": sorted(usage["usage"]),
           "one_choice": {len(c["choices"]) for c in tokens}, "finish": tokens[-1]["choices"][0]["finish_reason"]}
    assert out["object"] == {kind}
    if chat:
        out["first_delta"] = tokens[0]["choices"][0]["delta"]
        out["token_keys"] = {k for c in tokens[1:] for k in c["choices"][0]["delta"]}
    else:
        out["token_keys"] = {"text"} & {k for c in tokens for k in c["choices"][0]}
    return out


def shape(value):
    """A JSON value with its leaves replaced by their types: what a reader relies on."""
    if isinstance(value, dict):
        return {k: shape(v) for k, v in value.items()}
    if isinstance(value, list):
        return [shape(v) for v in value[:1]]
    return type(value).__name__


def metric_families(text: str) -> dict[str, tuple[str, set[str]]]:
    """{family: (type, label names)} of a Prometheus text exposition; histogram samples under their family."""
    types = dict(re.findall(r"^# TYPE (\S+) (\S+)$", text, re.M))
    labels: dict[str, set[str]] = {}
    for name, body in re.findall(r"^([a-zA-Z_:][\w:]*)\{([^}]*)\}", text, re.M):
        family = re.sub(r"_(bucket|sum|count)$", "", name) if re.sub(r"_(bucket|sum|count)$", "", name) in types else name
        labels.setdefault(family, set()).update(k for k in re.findall(r'(\w+)="', body) if k != "le")
    return {name: (kind, labels.get(name, set())) for name, kind in types.items()}


@pytest.fixture(scope="module")
def url(tmp_path_factory):
    spec = '{"method":"ngram","num_speculative_tokens":3}'
    with standin(tmp_path_factory.mktemp("contract"), "--speculative-config", spec, name="tiny",
                 standin_decode_tok_s="400", standin_prefill_tok_s="20000") as base:
        yield base


def test_completion_streams_are_framed_and_filled_as_vllm_does(url):
    with httpx.stream("POST", f"{url}/v1/completions", json={"model": "tiny", **COMPLETION}, timeout=30) as r:
        mine = r.read().decode()
        assert r.headers["content-type"].startswith("text/event-stream")
    real = (REAL / "completions-stream.sse").read_text()
    assert "content-type: text/event-stream" in (REAL / "completions-stream.headers").read_text()
    assert read_fields(events(mine), chat=False) == read_fields(events(real), chat=False)


def test_chat_streams_open_with_the_role_and_end_with_usage_as_vllm_does(url):
    with httpx.stream("POST", f"{url}/v1/chat/completions", json={"model": "tiny", **CHAT}, timeout=30) as r:
        mine = r.read().decode()
    real = (REAL / "chat-stream.sse").read_text()
    assert read_fields(events(mine), chat=True) == read_fields(events(real), chat=True)


@pytest.mark.parametrize("request_, capture, status", [
    (("POST", "/v1/completions", {"model": "nope", "prompt": "x", "max_tokens": 2}), "error-404-model.json", 404),
    (("POST", "/v1/completions", {"model": "tiny", "max_tokens": 2}), "error-400-no-prompt.json", 400),
    (("POST", "/v1/chat/completions", {"model": "tiny", "max_tokens": 2}), "error-400-chat-no-messages.json", 400),
    (("GET", "/v1/nothing", None), "error-404-route.json", 404),
])
def test_errors_have_vllms_codes_and_body_shapes(url, request_, capture, status):
    method, path, body = request_
    answer = httpx.request(method, f"{url}{path}", json=body, timeout=10)
    real = json.loads((REAL / capture).read_text())
    assert answer.status_code == status
    assert shape(answer.json()) == shape(real)
    if isinstance(real.get("error"), dict):
        assert {k: answer.json()["error"][k] for k in ("type", "param", "code")} == {
            k: real["error"][k] for k in ("type", "param", "code")}
        assert answer.json()["error"]["message"].split("`")[0] == real["error"]["message"].split("`")[0]


def test_a_wedged_request_ends_with_vllms_engine_dead_500_and_health_stays_200(tmp_path):
    """A request the stand-in's stuck engine never serves ends (after STANDIN_HANG_LIMIT_S, here 1 s) the way
    vLLM ends a request whose engine died: HTTP 500 and its body; /health said 200 meanwhile, as vLLM's does
    with its engine core stopped."""
    with standin(tmp_path, name="tiny", standin_hang_limit_s="1") as base:
        httpx.post(f"{base}/standin/wedge", timeout=5)
        assert httpx.get(f"{base}/health", timeout=5).status_code == 200
        answer = httpx.post(f"{base}/v1/completions", json={"model": "tiny", "prompt": "ping", "max_tokens": 1},
                            timeout=30)
    real = json.loads((REAL / "error-500-engine-dead.json").read_text())
    assert answer.status_code == 500 and answer.json() == real


def test_health_and_models_answer_as_vllm_does(url):
    health = httpx.get(f"{url}/health", timeout=10)
    assert health.status_code == 200 and health.content == b""
    assert "content-length: 0" in (REAL / "health.headers").read_text()
    mine, real = httpx.get(f"{url}/v1/models", timeout=10).json(), json.loads((REAL / "v1-models.json").read_text())
    assert (mine["object"], [m["id"] for m in mine["data"]], mine["data"][0]["object"]) == (
        real["object"], [m["id"] for m in real["data"]], real["data"][0]["object"])


def test_every_metric_the_standin_exports_is_vllms_by_name_type_and_labels(url):
    httpx.post(f"{url}/v1/completions", json={"model": "tiny", **COMPLETION}, timeout=30).raise_for_status()
    mine = metric_families(httpx.get(f"{url}/metrics", timeout=10).text)
    real = metric_families((REAL / "metrics.txt").read_text())
    assert mine, "the stand-in exported no metric"
    for name, (kind, labels) in mine.items():
        assert name in real, f"{name}: vLLM 0.32 has no such metric"
        assert kind == real[name][0], f"{name}: the stand-in says {kind}, vLLM {real[name][0]}"
        missing = real[name][1] - labels - ({"finished_reason"} if name in KNOWN_DIFFERENCES else set())
        assert labels <= real[name][1] and not missing, f"{name}: labels {sorted(labels)}, vLLM's {sorted(real[name][1])}"


def test_a_wrong_key_gets_vllms_401_and_the_paths_vllm_leaves_open_stay_open(tmp_path):
    """vLLM 0.32 with --api-key: /v1/* wants the key ({"error": "Unauthorized"}); /health, /metrics and /version
    answer without it (seen on the real engine: its middleware checks only paths under /v1)."""
    with standin(tmp_path, "--api-key", "sk-test-key", name="tiny") as base:
        refused = httpx.get(f"{base}/v1/models", headers={"Authorization": "Bearer sk-wrong"}, timeout=10)
        open_paths = {path: httpx.get(f"{base}{path}", timeout=10).status_code for path in ("/health", "/metrics", "/version")}
    assert refused.status_code == 401 and refused.json() == json.loads((REAL / "error-401.json").read_text())
    assert open_paths == {"/health": 200, "/metrics": 200, "/version": 200}
