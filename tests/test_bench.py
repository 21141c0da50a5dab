"""The benchmark client against the vLLM stand-in (a local process on 127.0.0.1).

Simulated: vLLM (tests/vllm_standin/server.py: configured prefill/decode rates are the
truth the client must find; speculative decoding packs several tokens per chunk; its
traps are reproduced). Real: httpx streaming over loopback, the client's arithmetic.
"""

from __future__ import annotations

import json
import re
import time

import pytest

from rigkit.verify.client import run_bench
from tests.standin import standin

SPEC = ["--speculative-config", '{"method":"mtp","num_speculative_tokens":2}']


def check(result, name):
    return next(c for c in result.checks if c.name == name)


def found(measured: float, truth: float) -> bool:
    """The rate the stand-in was given, found to within 2% above it and 10% below. The stand-in can be late,
    never early (it sleeps until each token's time): a process starved on a loaded machine once took 1.059 s
    over a 1.024 s prefill, and the server's own histogram (which the client reads) said so. The errors this
    guards against (queueing in the prefill, chunks counted as tokens, cached tokens) are factors, not percents."""
    return truth * 0.9 <= measured <= truth * 1.02


def test_decode_and_prefill_match_the_truth_under_speculative_decoding(tmp_path):
    with standin(tmp_path, *SPEC, "--dtype", "bfloat16", standin_decode_tok_s="100", standin_prefill_tok_s="2000") as url:
        result = run_bench(url, "m", prompt_tokens=2048, output_tokens=200, seed=1)
    assert result.passed, result.checks
    assert found(result.decode_tok_s, 100)
    assert found(result.prefill_tok_s, 2000)
    assert result.prompt_tokens == 2048 and result.completion_tokens == 200
    # 1 + 1.4 accepted tokens per draft: ~2.4 tokens in each chunk.
    assert result.tokens_per_chunk == pytest.approx(2.4, rel=0.03)
    assert result.acceptance_length == pytest.approx(2.4, rel=0.03)
    # Counting chunks as tokens would have been off by exactly that factor.
    assert result.chunk_counted_decode_tok_s == pytest.approx(100 / result.tokens_per_chunk, rel=0.03)
    # 100 tok/s = 10 ms per token; chunks of 2 and 3 tokens normalised by their 2.4 mean give 8.3 and 12.5 ms.
    # p99 has room for scheduling jitter on a loaded 2-core machine.
    assert 8.0 <= result.itl_p50_ms <= 12.6 and result.itl_p99_ms <= 20


def test_half_dtype_with_a_drafter_fails_acceptance_with_a_hint(tmp_path):
    with standin(tmp_path, *SPEC, "--dtype", "half", standin_decode_tok_s="90") as url:
        result = run_bench(url, "m", prompt_tokens=64, output_tokens=40, seed=2)
    acceptance = check(result, "spec_decode_acceptance")
    assert not acceptance.passed
    assert "mean acceptance length 1.00" in acceptance.message and "check --dtype" in acceptance.message
    assert result.decode_tok_s == pytest.approx(30, rel=0.05)  # 3x slower, and no error from the server


def test_a_hang_with_health_200_fails_within_the_timeout(tmp_path):
    with standin(tmp_path, standin_fault="hang") as url:
        started = time.monotonic()
        result = run_bench(url, "m", prompt_tokens=64, output_tokens=8, timeout_s=3)
        elapsed = time.monotonic() - started
    produced = check(result, "tokens_produced")
    assert not produced.passed
    assert "no token within the 3 s timeout" in produced.message
    assert elapsed < 10  # warm-up request fails fast; the run never hangs
    assert not result.passed


def test_the_prompt_is_sized_in_the_servers_own_tokens(tmp_path):
    """Simulated: a server that counts 1.9 tokens per word of the prompt (a real tokenizer counted 300 of the
    prompt's words as 488-1231 tokens). The calibration request reads that count before the measured prompt
    is built, so the server counts what was asked for, and the read-back confirms it."""
    with standin(tmp_path, standin_prompt_inflation="1.9") as url:
        result = run_bench(url, "m", prompt_tokens=256, output_tokens=8)
    readback = check(result, "context_readback")
    assert readback.passed, readback.message
    assert abs(result.prompt_tokens - 256) <= 256 * 0.02
    assert result.prompt_scale["tokens_per_word"] == pytest.approx(1.9, rel=0.02)


def test_decode_below_the_expected_minimum_fails(tmp_path):
    with standin(tmp_path, "--enforce-eager", standin_decode_tok_s="70") as url:
        result = run_bench(url, "m", prompt_tokens=64, output_tokens=30, expected_min_decode_tok_s=50)
    decode = check(result, "decode_min")
    assert not decode.passed and result.decode_tok_s == pytest.approx(10, rel=0.05)


def test_concurrency_levels_report_aggregate_and_per_stream(tmp_path):
    # 3 s of decode per stream: the streams' start skew on a loaded machine (0.19 s seen) is then a small
    # share of the level's wall time, which the aggregate divides by (50 tokens, 1 s, measured 169 tok/s).
    with standin(tmp_path, standin_decode_tok_s="50") as url:
        result = run_bench(url, "m", prompt_tokens=64, output_tokens=150, concurrency=(4,))
    [level] = result.concurrency
    assert level.errors == []
    assert level.per_stream_decode_tok_s == pytest.approx(50, rel=0.05)
    assert level.aggregate_tok_s == pytest.approx(200, rel=0.15)


def test_rigkit_bench_cli_writes_the_documented_json(tmp_path, capsys):
    from rigkit.cli import main

    out = tmp_path / "bench.json"
    with standin(tmp_path, standin_decode_tok_s="80") as url:
        code = main(["bench", "--url", url, "--model", "m", "--prompt-tokens", "128", "--output-tokens", "16",
                     "--json", str(out)])
    assert code == 0
    result = json.loads(out.read_text())
    for key in ("prompt_tokens", "requested_prompt_tokens", "completion_tokens", "ttft_s", "prefill_tok_s",
                "decode_tok_s", "tokens_per_chunk", "itl_p50_ms", "itl_p99_ms", "max_stall_ms", "acceptance_length",
                "checks"):
        assert key in result
    assert result["acceptance_length"] is None  # not drafting
    printed = capsys.readouterr().out  # the table shows the figures of the JSON, not only its headers
    assert "decode (client)" in printed and f"{result['decode_tok_s']:.1f} tok/s" in printed, printed
    assert re.search(rf"completion tokens \(asked / from usage\) +16 / {result['completion_tokens']},", printed), printed


def test_the_printed_table_and_the_json_agree(tmp_path, capsys):
    """Simulated: a drafting server (k=2) with a 0.5 s queue before prefill. Each figure printed is the JSON's."""
    from rigkit.cli import main

    out = tmp_path / "bench.json"
    with standin(tmp_path, *SPEC, standin_queue_s="0.5", standin_decode_tok_s="150") as url:
        code = main(["bench", "--url", url, "--model", "m", "--prompt-tokens", "256", "--output-tokens", "60",
                     "--json", str(out)])
    printed = capsys.readouterr().out
    doc = json.loads(out.read_text())
    assert code == 0 and doc["passed"]
    assert f"prefill ({doc['prefill_source']})" in printed and f"{doc['prefill_tok_s']:.0f} tok/s" in printed
    assert f"{doc['queue_s']:.3f} s" in printed and f"{doc['decode_tok_s']:.1f} tok/s" in printed
    assert f"{doc['acceptance_length']:.2f} mean length" in printed
    assert doc["provenance"] == {"prompt_tokens": 256, "output_tokens": 60, "concurrency": [1],
                                 "server_version": "standin", "endpoint": "completions"}
    assert doc["wall_first_token_s"] > doc["wall_send_s"] and doc["wall_last_token_s"] > doc["wall_first_token_s"]
