"""`rigkit bench --endpoint chat` and the streams a chat-only server, a reasoning model or an empty
stream send, against the vLLM stand-in (tests/vllm_standin/server.py, a local process on 127.0.0.1)
serving /v1/chat/completions as vLLM streams it. Real: httpx over loopback, the client's parsing
and arithmetic, the command line."""

from __future__ import annotations

import json

import httpx
import pytest

from rigkit.cli import main
from rigkit.verify.client import run_bench
from tests.conftest import DATA
from tests.standin import standin

FAST = {"standin_decode_tok_s": "200", "standin_prefill_tok_s": "2000"}


def failed(result):
    return {c.name: c.message for c in result.checks if not c.passed}


def bench_cli(url, tmp_path, *extra):
    out = tmp_path / "bench.json"
    code = main(["bench", "--url", url, "--model", "m", "--prompt-tokens", "512", "--output-tokens", "40",
                 "--json", str(out), *extra])
    return code, json.loads(out.read_text())


def test_chat_is_measured_by_the_same_rules(tmp_path, capsys):
    """Simulated: vLLM's chat stream (role chunk, then content deltas, then usage); ChatML adds 8 prompt tokens."""
    with standin(tmp_path, **FAST) as url:
        code, doc = bench_cli(url, tmp_path, "--endpoint", "chat")
    printed = capsys.readouterr().out
    assert code == 0, [c for c in doc["checks"] if not c["passed"]]
    assert doc["endpoint"] == "chat" and doc["provenance"]["endpoint"] == "chat"
    assert doc["prompt_tokens"] == 520 and doc["chat_template_tokens"] == 8  # read from the warm-up request
    assert "of which 8 the chat template's (0.0% off" in next(c["message"] for c in doc["checks"]
                                                              if c["name"] == "context_readback")
    assert doc["token_fields"] == ["content"] and doc["completion_tokens"] == 40 and doc["chunks"] == 40
    assert doc["decode_tok_s"] == pytest.approx(200, rel=0.2)
    assert doc["ttft_s"] >= 0.25  # the role chunk carries no token: the first token needs the 520-token prefill
    assert "/v1/chat/completions" in printed


def test_an_inflated_count_is_sized_away_on_chat_too(tmp_path):
    """Simulated: a server counting 1.9 tokens per word, its 8-token template too. The template's share and
    the tokens per word are told apart by the warm-up's count and the calibration's: the measured prompt is
    the asked length besides the template."""
    with standin(tmp_path, standin_prompt_inflation="1.9", **FAST) as url:
        result = run_bench(url, "m", prompt_tokens=256, output_tokens=8, endpoint="chat")
    assert "context_readback" not in failed(result)
    assert result.chat_template_tokens == pytest.approx(8 * 1.9, abs=1.5)
    assert abs(result.prompt_tokens - result.chat_template_tokens - 256) <= 256 * 0.02


@pytest.mark.parametrize("field", ["reasoning_content", "reasoning"])
def test_a_reasoning_models_first_token_is_its_first_reasoning_token(tmp_path, field):
    """Simulated: vLLM with --reasoning-parser: the first 16 tokens stream in delta.<field>, the rest in content."""
    # 25 tok/s: the first content token comes 16 tokens (640 ms) after the first reasoning token, a gap
    # far wider than a loaded machine's lag in reading a chunk (measured up to 115 ms at 200 tok/s).
    slow = {**FAST, "standin_decode_tok_s": "25"}
    with standin(tmp_path, "--reasoning-parser", "qwen3", standin_reasoning_field=field, **slow) as url:
        result = run_bench(url, "m", prompt_tokens=512, output_tokens=40, endpoint="chat", seed=4)
    assert result.passed, failed(result)
    assert result.token_fields == [field, "content"]
    assert result.chunks == 40  # every reasoning chunk is a token chunk; counting content only would give 24
    # The first token is the first reasoning token: the client's TTFT is the server's, not 16 tokens (640 ms) later.
    assert result.ttft_s == pytest.approx(result.server_ttft_s, abs=0.3)
    assert result.decode_tok_s == pytest.approx(25, rel=0.2)


def test_a_choice_level_reasoning_field_on_completions_is_a_token(tmp_path):
    """Simulated: a server that puts a reasoning model's text in the choice's own `reasoning` field (text empty)."""
    with standin(tmp_path, standin_token_field="choice_reasoning", **FAST) as url:
        result = run_bench(url, "m", prompt_tokens=512, output_tokens=40)
    assert result.passed, failed(result)
    assert result.token_fields == ["choice.reasoning"] and result.chunks == 40
    assert result.ttft_s >= 0.25


def test_a_chat_only_server_is_named_and_benched_through_chat(tmp_path):
    """Simulated: a server (or gateway) with no /v1/completions route."""
    with standin(tmp_path, standin_fault="chat_only", **FAST) as url:
        completions = run_bench(url, "m", prompt_tokens=64, output_tokens=8)
        chat = run_bench(url, "m", prompt_tokens=64, output_tokens=8, endpoint="chat")
    assert "HTTP 404" in failed(completions)["tokens_produced"]
    assert "try --endpoint chat" in failed(completions)["tokens_produced"]
    assert chat.passed, failed(chat)


def test_the_standin_refuses_what_vllm_refuses(tmp_path):
    """A chat request without messages and a completion without a prompt are 400s with vLLM 0.32's error object
    (tests/data/vllm-0.32/error-400-*.json)."""
    with standin(tmp_path, **FAST) as url:
        chat = httpx.post(f"{url}/v1/chat/completions", json={"model": "m", "prompt": "hi"})
        completion = httpx.post(f"{url}/v1/completions", json={"model": "m", "messages": [{"role": "user",
                                                                                          "content": "hi"}]})
    for response, field in ((chat, "messages"), (completion, "prompt")):
        body = response.json()
        real = json.loads((DATA / "vllm-0.32" / f"error-400-{'chat-no-messages' if field == 'messages' else 'no-prompt'}.json")
                          .read_text())
        assert response.status_code == 400 and body == real, body


@pytest.mark.parametrize("endpoint", ["completions", "chat"])
def test_a_stream_of_only_done_says_no_tokens_came_back(tmp_path, endpoint):
    """Simulated: HTTP 200 and a stream holding nothing but `data: [DONE]`."""
    with standin(tmp_path, standin_fault="empty_stream", **FAST) as url:
        result = run_bench(url, "m", prompt_tokens=64, output_tokens=8, endpoint=endpoint)
    message = failed(result)["tokens_produced"]
    assert message.startswith("no tokens came back") and "sent no usage" not in message


def test_tokens_without_usage_still_say_no_usage(tmp_path):
    """Simulated: tokens stream, but stream_options.include_usage is ignored: a different failure, named apart."""
    with standin(tmp_path, standin_fault="no_usage", **FAST) as url:
        result = run_bench(url, "m", prompt_tokens=64, output_tokens=8)
    message = failed(result)["tokens_produced"]
    assert message.startswith("the server sent no usage") and "no tokens came back" not in message
