"""The benchmark client against a misbehaving server: each test names the fault the vLLM stand-in
(tests/vllm_standin/server.py, a local process on 127.0.0.1) simulates through its STANDIN_* switches.
The stand-in's configured rates and its own /metrics are the truth; the client must find it or fail a
check that says why. Real: httpx streaming over loopback, the client's parsing and arithmetic."""

from __future__ import annotations

import json

import httpx
import pytest

from rigkit.cli import main
from rigkit.verify.client import PREFILL_FROM_SERVER, PREFILL_FROM_TTFT, run_bench
from rigkit.verify.table import bench_table
from tests.conftest import DATA
from tests.standin import standin

SPEC = ["--speculative-config", '{"method":"mtp","num_speculative_tokens":2}']
FAST = {"standin_decode_tok_s": "200", "standin_prefill_tok_s": "2000"}


def check(result, name):
    return next(c for c in result.checks if c.name == name)


def failed(result):
    return {c.name: c.message for c in result.checks if not c.passed}


def bench(tmp_path, *flags, output_tokens=40, prompt_tokens=256, **env):
    with standin(tmp_path, *flags, **{**FAST, **env}) as url:
        return run_bench(url, "m", prompt_tokens=prompt_tokens, output_tokens=output_tokens, seed=3)


# 1. A stream that did not finish well is not a success.

def test_an_error_event_mid_stream_fails_with_the_servers_own_text(tmp_path):
    """Simulated: after 2 tokens the server sends an OpenAI error object as an SSE event, then [DONE], no usage."""
    result = bench(tmp_path, standin_fault="error_mid_stream")
    assert not result.passed
    message = check(result, "tokens_produced").message
    assert "CUDA error: an illegal memory access was encountered" in message
    assert "usage" not in message  # the cause is the error, not a missing usage chunk
    assert "illegal memory access" in bench_table(result)


@pytest.mark.parametrize("reason, expected", [("abort", "finish_reason 'abort'"),
                                              ("none", "without a finish_reason")])
def test_an_abnormal_or_missing_finish_reason_fails(tmp_path, reason, expected):
    """Simulated: the last chunk carries finish_reason "abort", or none at all; usage is still sent."""
    result = bench(tmp_path, standin_finish_reason=reason)
    assert expected in failed(result)["stream_finished"]
    assert result.completion_tokens == 40  # usage still read: the figures stay


def test_an_early_stop_fails_and_decode_comes_from_what_arrived(tmp_path):
    """Simulated: the server ignores ignore_eos and stops after 12 tokens with finish_reason "stop"."""
    # At 20 tok/s: 11 gaps of 50 ms. At the 200 tok/s of the other tests, 11 gaps of 5 ms read 93 tok/s once in a
    # fresh clone's no-engine process: 60 ms of scheduling on a loaded machine is more than the whole decode.
    result = bench(tmp_path, standin_stop_after_tokens="12", standin_decode_tok_s="20")
    assert "early stop: asked for 40 tokens with ignore_eos, usage says 12" in failed(result)["stream_finished"]
    assert result.completion_tokens == 12
    assert result.decode_tok_s == pytest.approx(20, rel=0.25)  # from the 12 that arrived, not the 40 asked for
    assert "WARN  early stop" in bench_table(result)


# 2. SSE as the spec has it: a valid stream is never a false failure.

@pytest.mark.parametrize("variant", ["compact", "comments", "event", "multiline", "crlf",
                                     "compact,comments,event,multiline,crlf"])
def test_valid_sse_variants_are_read_in_full(tmp_path, variant):
    """Simulated: `data:` without a space, `: keep-alive` comments while the prompt is read and before each
    event, `event:` lines, JSON spread over several data lines, CRLF line ends. Decode at 50 tok/s (0.8 s for
    the 40 tokens): at 200 tok/s a client held off the CPU for ~0.1 s on a loaded machine read the stream's
    last 0.2 s at once, which the burst check rightly could not tell from a buffering proxy (seen once, crlf)."""
    result = bench(tmp_path, standin_sse=variant, prompt_tokens=512, standin_decode_tok_s="50")
    assert result.passed, failed(result)
    assert (result.completion_tokens, result.finish_reason) == (40, "length")
    # A keep-alive comment is not a token: the first token needs the 512-token prefill (0.256 s) first.
    assert result.ttft_s >= 0.25


# 3. The first token is the first token of any kind.

@pytest.mark.parametrize("field", ["reasoning_content", "reasoning", "tool_calls", "content"])
def test_the_first_token_is_found_in_whatever_field_carries_it(tmp_path, field):
    """Simulated: every generated token streams in `field` (reasoning models, tool calls), and an empty text chunk
    plus a role-only delta arrive before the prefill: those are not tokens."""
    result = bench(tmp_path, standin_token_field=field, standin_fault="empty_first", prompt_tokens=512)
    assert result.passed, failed(result)
    assert result.token_fields == [field]
    assert result.ttft_s >= 0.25  # not the empty chunk at ~0 s
    assert result.chunks == 40 and result.decode_tok_s == pytest.approx(200, rel=0.2)


# 4. Prefill is not prompt / TTFT when the request waited in a queue.

def test_queueing_is_reported_apart_from_prefill_from_the_servers_histograms(tmp_path):
    """Simulated: each request waits 1 s in the scheduler's queue before a 2048-token prefill at 2000 tok/s.
    2048, not 512: the stand-in times its own prefill by the wall clock, and on a loaded machine it woke
    ~40 ms late on a 256 ms prefill (1731 tok/s read, seen once in a fresh-clone run); on 1 s that is 4%."""
    result = bench(tmp_path, standin_queue_s="1.0", prompt_tokens=2048)
    assert result.passed, failed(result)
    assert result.prefill_source == PREFILL_FROM_SERVER
    assert result.prefill_tok_s == pytest.approx(2000, rel=0.1)
    assert result.queue_s == pytest.approx(1.0, abs=0.2)
    assert result.ttft_s >= 2.0  # the client did wait: queue + prefill


def test_without_histograms_the_prefill_figure_is_labelled_as_including_queueing(tmp_path):
    """Simulated: the same 1 s queue, and a server whose /metrics has no per-request histograms."""
    result = bench(tmp_path, standin_queue_s="1.0", standin_histograms="0", prompt_tokens=512)
    assert result.prefill_source.startswith("prompt / TTFT (includes queueing)")
    assert result.prefill_tok_s < 600 and result.queue_s is None  # 512 / (1 + 0.256) s, not the 2000 of prefill
    assert "prefill (prompt / TTFT (includes queueing)" in bench_table(result)


# 5. A decode rate must be physically plausible.

@pytest.mark.parametrize("histograms", ["1", "0"])
def test_a_buffered_stream_fails_instead_of_reporting_an_absurd_decode_rate(tmp_path, histograms):
    """Simulated: a buffering proxy. The server decodes 120 tokens at 200 tok/s; all events arrive at once at the
    end. (0.6 s of decode: the server's own figure then stays within 10% on a loaded machine, where a token
    can come tens of ms late.)"""
    result = bench(tmp_path, standin_fault="buffered", standin_histograms=histograms, output_tokens=120)
    message = failed(result)["decode_plausible"]
    assert "tokens arrived in a burst" in message
    assert result.decode_tok_s is None and result.itl_p50_ms is None
    if histograms == "1":
        assert "while the server spent" in message
        assert result.server_decode_tok_s == pytest.approx(200, rel=0.1)
    # A burst every time: measured again BURST_RETRIES times (what a starved client would not do), then failed.
    from rigkit.verify.client import BURST_RETRIES

    assert sum("measured again" in w for w in result.warnings) == BURST_RETRIES == 4, result.warnings


def test_a_stream_read_in_one_burst_once_is_measured_again_and_passes_with_a_warning(tmp_path):
    """Simulated: the first long stream held to its end and delivered at once, as a client starved for a moment
    reads it (vLLM 0.32's CPU build beside the client: 256 tokens of a 0.18 s decode read within 1 ms, once in
    ten runs); the next streams arrive token by token. The benchmark measures again and keeps that figure."""
    result = bench(tmp_path, standin_fault="buffered", standin_buffered_streams="1", output_tokens=120)
    assert result.passed, failed(result)
    assert result.decode_tok_s == pytest.approx(200, rel=0.2)
    [again] = [w for w in result.warnings if "measured again" in w]
    assert "while" not in again and "120 tokens within" in again and "of server decode" in again, again


def test_decode_far_above_the_roofline_bound_is_not_believed(tmp_path):
    """Simulated: a server decoding 200 tok/s, for a model whose memory-bandwidth bound is said to be 50 tok/s."""
    with standin(tmp_path, **FAST) as url:
        low = run_bench(url, "m", prompt_tokens=64, output_tokens=40, roofline_tok_s=50)
        high = run_bench(url, "m", prompt_tokens=64, output_tokens=40, roofline_tok_s=250)
    assert "memory-bandwidth bound" in failed(low)["decode_plausible"]
    assert high.passed, failed(high)


# 6. Acceptance from whatever counters exist.

@pytest.mark.parametrize("counters, draft_tokens, status, length", [
    ("full", None, "measured", 2.4), ("per_pos", None, "measured", 2.4),
    ("old", None, "rate only", None), ("old", 2, "measured", 2.4)])
def test_acceptance_from_any_sufficient_counter_set(tmp_path, counters, draft_tokens, status, length):
    """Simulated: drafting with k=2 and 1.4 accepted per draft; /metrics has all counters, only per-position
    accepted counts, or the older set without num_drafts (then k given by the caller gives the length)."""
    with standin(tmp_path, *SPEC, standin_spec_counters=counters, **FAST) as url:
        result = run_bench(url, "m", prompt_tokens=64, output_tokens=120, draft_tokens_per_step=draft_tokens)
    assert result.passed, failed(result)
    assert result.acceptance_status == status
    assert result.acceptance_rate == pytest.approx(1.4 / 2, rel=0.05)
    assert result.acceptance_length == (None if length is None else pytest.approx(length, rel=0.05))


def test_drafting_without_counters_says_acceptance_unknown(tmp_path):
    """Simulated: a server drafting (about 2.4 tokens per chunk) with no /metrics (404): acceptance is unknown,
    and the tokens per chunk are reported as chunking, not as drafting."""
    out = tmp_path / "b.json"
    with standin(tmp_path, *SPEC, standin_fault="no_metrics", **FAST) as url:
        main(["bench", "--url", url, "--model", "m", "--prompt-tokens", "64", "--output-tokens", "60",
              "--json", str(out)])
    document = json.loads(out.read_text())
    assert document["acceptance_status"] == "unknown" and document["acceptance_length"] is None
    assert any(w.startswith("acceptance unknown") and "is chunking" in w for w in document["warnings"])


# 7. Errors under concurrency fail the run.

@pytest.mark.parametrize("status", ["429", "500"])
def test_rejected_requests_under_concurrency_fail_the_run(tmp_path, capsys, status):
    """Simulated: half the requests that arrive while another is generating are refused with HTTP 429 or 500."""
    out = tmp_path / "b.json"
    with standin(tmp_path, standin_reject_share="0.5", standin_reject_status=status, **FAST) as url:
        code = main(["bench", "--url", url, "--model", "m", "--prompt-tokens", "64", "--output-tokens", "40",
                     "--concurrency", "4", "--json", str(out)])
    assert code == 1
    [level] = json.loads(out.read_text())["concurrency"]
    assert level["requests"] == 4 and 1 <= level["succeeded"] < 4
    assert len(level["errors"]) == 4 - level["succeeded"] and f"HTTP {status}" in level["errors"][0]
    assert level["aggregate_tok_s"] > 0  # from the requests that succeeded only
    printed = capsys.readouterr().out
    assert f"from {level['succeeded']} of 4 requests" in printed and "FAIL  concurrency_4" in printed


# The command line refuses bad input in one line, exit code 2.

@pytest.mark.parametrize("args, expected", [
    (["--api-key-file", "/nonexistent/key"],
     "--api-key-file /nonexistent/key does not exist; create it (mode 600) or remove the field"),
    (["--concurrency", "4,x"], "--concurrency '4,x': 'x' is not a whole number from 1 to 256 (ASCII digits, "
                               "comma-separated, e.g. 4,8)"),
    (["--concurrency", "0"], "--concurrency '0': '0' is not a whole number from 1 to 256 (ASCII digits, "
                             "comma-separated, e.g. 4,8)"),
])
def test_bench_refuses_bad_input_with_one_line_and_exit_2(capsys, args, expected):
    code = main(["bench", "--url", "http://127.0.0.1:9", "--model", "m", *args])
    err = capsys.readouterr().err
    assert code == 2 and err.strip() == f"rigkit bench: {expected}"


def test_an_empty_unreadable_or_shared_key_file_is_named(tmp_path, capsys):
    """The bench's key file follows the rig key file's rules (rigkit.serving.api_key.read_key_file)."""
    key = tmp_path / "key"
    key.write_text("\n")
    key.chmod(0o600)
    assert main(["bench", "--url", "http://127.0.0.1:9", "--model", "m", "--api-key-file", str(key)]) == 2
    assert capsys.readouterr().err.strip() == (f"rigkit bench: --api-key-file {key} is empty; "
                                               "it must hold the key on one line")
    key.write_text("sk-1\n")
    key.chmod(0o644)
    assert main(["bench", "--url", "http://127.0.0.1:9", "--model", "m", "--api-key-file", str(key)]) == 2
    assert f"readable by others; run chmod 600 {key}" in capsys.readouterr().err
    assert main(["bench", "--url", "http://127.0.0.1:9", "--model", "m", "--api-key-file", str(tmp_path)]) == 2
    assert f"--api-key-file {tmp_path} is not a regular file; give the path of a file (mode 600)" in capsys.readouterr().err


# 8. The seeds' performance mistakes, as a user of `rigkit bench` sees them (the stand-in's STANDIN_FAULT).

def bench_json(tmp_path, url, *extra, prompt_tokens=256, output_tokens=80):
    out = tmp_path / f"b{len(list(tmp_path.glob('b*.json')))}.json"
    code = main(["bench", "--url", url, "--model", "m", "--prompt-tokens", str(prompt_tokens),
                 "--output-tokens", str(output_tokens), "--json", str(out), *extra])
    return code, json.loads(out.read_text())


def counters(url) -> dict[str, float]:
    values = {}
    for line in httpx.get(f"{url}/metrics", timeout=5).text.splitlines():
        if line.startswith("vllm:spec_decode_num_"):
            values[line.split("{")[0]] = float(line.rsplit(" ", 1)[1])
    return values


def test_half_dtype_draft_shows_as_collapsed_acceptance_and_a_third_of_the_decode(tmp_path, capsys):
    """Simulated: a drafter run in --dtype half: every draft rejected, no error, decode 3x slower."""
    with standin(tmp_path, standin_fault="half_dtype_draft", **FAST) as url:
        code, doc = bench_json(tmp_path, url)
        seen = counters(url)
    assert code == 1
    acceptance = next(c for c in doc["checks"] if c["name"] == "spec_decode_acceptance")
    assert not acceptance["passed"] and "mean acceptance length 1.00" in acceptance["message"]
    assert "FAIL  spec_decode_acceptance" in capsys.readouterr().out
    assert doc["decode_tok_s"] == pytest.approx(200 / 3, rel=0.1)
    assert seen["vllm:spec_decode_num_drafts_total"] > 0 and seen["vllm:spec_decode_num_draft_tokens_total"] > 0
    assert seen["vllm:spec_decode_num_accepted_tokens_total"] == 0


def test_eager_mode_shows_as_a_seventh_of_the_decode(tmp_path):
    """Simulated: --enforce-eager left in the config: CUDA graphs off, decode / 7."""
    with standin(tmp_path, standin_fault="eager", **FAST) as url:
        code, doc = bench_json(tmp_path, url, "--expect-decode", "100", output_tokens=40)
    assert code == 1 and doc["decode_tok_s"] == pytest.approx(200 / 7, rel=0.1)
    assert "expected >= 100" in next(c["message"] for c in doc["checks"] if c["name"] == "decode_min")


def test_no_prefix_cache_shows_as_a_repeated_prompt_paying_its_prefill_again(tmp_path, capsys):
    """Simulated: prefix caching off: the same 2048-token prompt sent again waits its whole prefill (~1 s)
    again, where a caching server answers in 1/8 of it."""
    with standin(tmp_path, standin_prefill_tok_s="2000", standin_decode_tok_s="200") as url:
        _, cached = bench_json(tmp_path, url, prompt_tokens=2048, output_tokens=16)
    with standin(tmp_path, standin_fault="no_prefix_cache", standin_prefill_tok_s="2000",
                 standin_decode_tok_s="200") as url:
        _, uncached = bench_json(tmp_path, url, prompt_tokens=2048, output_tokens=16)
    assert cached["prefix_cache_speedup"] == pytest.approx(8, rel=0.25)
    assert not any(w.startswith("prefix cache") for w in cached["warnings"])
    assert uncached["prefix_cache_speedup"] == pytest.approx(1, rel=0.15)
    assert uncached["repeat_ttft_s"] > 0.9
    assert any(w.startswith("prefix cache: the same 2048-token prompt sent again") for w in uncached["warnings"])
    assert "is prefix caching off" in capsys.readouterr().out


def test_a_config_slower_by_a_share_shows_as_that_share(tmp_path):
    """Simulated: a config 10% slower (STANDIN_SLOWER_BY=0.10) against the same server without it."""
    rates = {"standin_decode_tok_s": "100", "standin_prefill_tok_s": "2000"}  # 0.8 s of decode: jitter stays small
    (tmp_path / "base").mkdir()
    (tmp_path / "slow").mkdir()
    # Both up at once and measured in turn, A B B A: a machine whose load changes meanwhile moves both alike.
    with standin(tmp_path / "base", **rates) as base_url, \
            standin(tmp_path / "slow", standin_fault="slower_by", standin_slower_by="0.10", **rates) as slow_url:
        runs = {url: [] for url in (base_url, slow_url)}
        for url in (base_url, slow_url, slow_url, base_url):
            runs[url].append(bench_json(tmp_path, url, prompt_tokens=1024)[1])
    for figure in ("decode_tok_s", "prefill_tok_s"):
        base, slow = (sum(run[figure] for run in runs[url]) for url in (base_url, slow_url))
        assert slow / base == pytest.approx(0.90, abs=0.05), figure  # jitter of a loaded machine


def test_decode_noise_is_seeded_and_of_the_size_asked(tmp_path):
    """Simulated: STANDIN_NOISE_SHARE=0.15 multiplies each request's decode rate by a draw from N(1, 0.15),
    from STANDIN_SEED's generator: a later gate can be tried against run-to-run noise. (Large on purpose:
    a loaded 2-core machine adds a few % of timing jitter of its own.) One second of decode per run, not 0.6:
    a client that reads the first token late measures a shorter span, and a fresh-clone run once read a
    0.89 draw as 143 tok/s over 60 tokens."""
    def runs(**env):
        with standin(tmp_path, standin_decode_tok_s="150", standin_prefill_tok_s="4000", **env) as url:
            return [run_bench(url, "m", prompt_tokens=64, output_tokens=150, seed=n).decode_tok_s for n in range(4)]

    first, again = runs(standin_noise_share="0.15", standin_seed="7"), runs(standin_noise_share="0.15", standin_seed="7")
    exact = runs()
    assert first == pytest.approx(again, rel=0.1)  # the same draws: seeded (seed 7 draws x1.12, 1.05, 0.89, 0.86)
    assert max(first) / min(first) > 1.15  # spread of the size asked for
    assert max(exact) / min(exact) < 1.1  # and none unless asked for


def test_the_prefix_cache_is_judged_on_the_prefill_share_of_the_first_ttft():
    """Measured on vLLM's CPU build with a tiny model: a 488-token prompt reached its first token in 37 ms, the
    warm-up's 32 tokens in about as long, and the repeat came slower on noise alone. No cache can show
    there; a prompt whose TTFT is well above the warm-up's still gets the warning when its repeat is not faster."""
    from rigkit.verify.client import _prefix_cache
    from rigkit.verify.stream import StreamResult

    def timed(ttft_s):
        return StreamResult(requested_prompt_tokens=300, requested_output_tokens=4, t_send=10.0, t_first=10.0 + ttft_s)

    warnings: list[str] = []
    _prefix_cache(timed(0.037), timed(0.045), warnings, warm_ttft_s=0.030)
    assert warnings == []
    # The cache working on a short prefill: 0.055 s -> 0.028 s is only x1.9, but it saved most of the
    # 0.035 s that was prefill (the warm-up's 0.020 s is what every request costs).
    _prefix_cache(timed(0.055), timed(0.028), warnings, warm_ttft_s=0.020)
    assert warnings == []
    _prefix_cache(timed(0.300), timed(0.290), warnings, warm_ttft_s=0.030)
    assert len(warnings) == 1 and warnings[0].startswith("prefix cache: the same 300-token prompt sent again")


def test_drafting_is_told_from_counters_never_from_chunk_sizes():
    """Measured on vLLM 0.32's CPU build with no speculative config: 1.16-1.60 tokens per chunk (its detokenizer
    holds back partial characters) and no vllm:spec_decode_* counter in /metrics, which vLLM registers only
    with a drafter. The status comes from the counters alone; chunk sizes are not an argument."""
    from rigkit.verify.bench_checks import acceptance_status
    from rigkit.verify.metrics import Acceptance, engine_without_drafting, parse

    no_spec = parse((DATA / "vllm-0.32" / "metrics.txt").read_text().replace("vllm:spec_decode_", "x_"))
    with_spec = parse((DATA / "vllm-0.32" / "metrics.txt").read_text())
    assert engine_without_drafting(no_spec) and not engine_without_drafting(with_spec)
    unknown = Acceptance(None, None, "no sufficient spec-decode counters (found: none)")
    idle = Acceptance(None, None, "spec-decode counters did not move: no drafting during the request", idle=True)
    assert acceptance_status(unknown, engine_without_drafting(no_spec)) == "not drafting"
    assert acceptance_status(unknown, engine_without_drafting(with_spec)) == "unknown"
    assert acceptance_status(idle, engine_without_drafting(with_spec)) == "not drafting"


# 9. Round three: what real servers and relays do that fooled the figures.

def test_a_cached_system_prompt_is_not_counted_as_prefilled(tmp_path):
    """Simulated: a chat template that prepends a 256-token system message (a model's own, a front-end's),
    prefilled on the first chat request and served from the prefix cache after it, as vLLM counts it in
    vllm:prefix_cache_hits_total; the stand-in prefills at 2000 tok/s. Counting the cached 256 as prefilled
    would report about 3900 tok/s."""
    with standin(tmp_path, standin_system_prompt_tokens="256", **FAST) as url:
        result = run_bench(url, "m", prompt_tokens=256, output_tokens=20, seed=3, endpoint="chat")
    assert result.passed, failed(result)
    assert result.chat_template_tokens == 264  # ChatML's 8 and the system message's 256
    assert (result.cached_prompt_tokens, result.cached_source) == (256, "vllm:prefix_cache_hits_total")
    assert result.prefill_source == PREFILL_FROM_SERVER
    assert result.prefill_tok_s == pytest.approx(2000, rel=0.2)
    assert any(w.startswith("prefix cache: 256 of the 520 prompt tokens") for w in result.warnings), result.warnings
    assert "520, 256 from the prefix cache" in bench_table(result)


def test_cached_tokens_from_usage_and_a_prompt_mostly_cached_leaves_prefill_unmeasured(tmp_path):
    """Simulated: vLLM with --enable-prompt-tokens-details (usage.prompt_tokens_details.cached_tokens) and a
    1024-token system message: of the measured prompt's 1288 tokens only 264 are prefilled, under half."""
    with standin(tmp_path, "--enable-prompt-tokens-details", standin_system_prompt_tokens="1024", **FAST) as url:
        result = run_bench(url, "m", prompt_tokens=256, output_tokens=20, seed=3, endpoint="chat")
    assert result.passed, failed(result)
    assert (result.cached_prompt_tokens, result.cached_source) == (1024, "usage.prompt_tokens_details.cached_tokens")
    assert result.prefill_tok_s is None
    assert result.prefill_source.startswith("not measured: 1024 of the 1288 prompt tokens came from the prefix cache")


def test_reasoning_a_relay_hid_fails_and_decode_is_the_visible_tokens(tmp_path):
    """Simulated: a relay drops the reasoning (the first 30 of 40 tokens, delta.reasoning_content) while usage
    counts it (completion_tokens_details.reasoning_tokens); decode at 50 tok/s. Dividing all 40 tokens by
    the 10 visible ones' span would read about 4x fast and several tokens per chunk would look like drafting."""
    with standin(tmp_path, "--reasoning-parser", "qwen3", standin_fault="hide_reasoning",
                 standin_reasoning_tokens="30", standin_decode_tok_s="50", standin_prefill_tok_s="2000") as url:
        result = run_bench(url, "m", prompt_tokens=256, output_tokens=40, seed=3, endpoint="chat")
    assert set(failed(result)) == {"tokens_streamed"}, failed(result)
    assert "usage counts 30 reasoning tokens" in failed(result)["tokens_streamed"]
    assert (result.completion_tokens, result.hidden_tokens, result.token_fields) == (40, 30, ["content"])
    assert result.decode_tok_s == pytest.approx(50, rel=0.25)
    assert result.tokens_per_chunk == pytest.approx(1.0)
    assert result.acceptance_status == "not drafting"
    assert result.prefix_cache_speedup is None
    assert any(w.startswith("prefix cache not measured: the first visible token came after hidden") for w in
               result.warnings), result.warnings
    assert "40, finish_reason length, 30 of them never streamed" in bench_table(result)


def measured_acceptance_length(tokens: int, k: int = 2, accepted_per_draft: float = 1.4) -> float:
    """The mean acceptance length of one stand-in request of `tokens` alone (its steps, as server.py drafts)."""
    drafts = accepted = produced = 0
    while produced < tokens:
        n = min(1 + int((drafts + 1) * accepted_per_draft) - int(drafts * accepted_per_draft), tokens - produced)
        drafts, accepted, produced = drafts + 1, accepted + n - 1, produced + n
    return 1 + accepted / drafts


def test_counters_that_land_late_are_read_once_settled(tmp_path):
    """Simulated: every counter and histogram of /metrics lands 1 s after the engine counted it (a metrics
    thread, a scrape behind a proxy). Read at once, the snapshots around the measured request hold the
    warm-up's and calibration's drafts (a 4-token request drafts at 2.0) instead of the measurement's."""
    with standin(tmp_path, *SPEC, standin_metrics_lag_s="1.0", **FAST) as url:
        result = run_bench(url, "m", prompt_tokens=64, output_tokens=41, seed=3)
    assert result.passed, failed(result)
    assert result.acceptance_status == "measured"
    assert result.acceptance_length == pytest.approx(measured_acceptance_length(41), abs=1e-9)
    assert result.server_decode_s is not None  # the histograms, read settled too


def test_counters_that_never_settle_leave_acceptance_unknown(tmp_path, monkeypatch):
    """Simulated: counters 3 s late against a 0.5 s bound on waiting for them."""
    import rigkit.verify.client as client

    monkeypatch.setattr(client, "METRICS_SETTLE_S", 0.5)
    with standin(tmp_path, *SPEC, standin_metrics_lag_s="3.0", **FAST) as url:
        result = run_bench(url, "m", prompt_tokens=64, output_tokens=41, seed=3)
    assert result.acceptance_status == "unknown" and result.acceptance_length is None
    assert result.acceptance_source.startswith("/metrics had not settled after 0.5 s"), result.acceptance_source
    assert "vllm:generation_tokens_total had counted" in result.acceptance_source
    assert result.server_decode_s is None and result.prefill_source.startswith(PREFILL_FROM_TTFT)


@pytest.mark.parametrize("label", ["application/json", "text/event-stream"])
def test_a_stream_answered_with_one_json_body_fails_as_not_streamed(tmp_path, label):
    """Simulated: `stream: true` answered with one JSON body holding the tokens and usage, once the whole
    answer was generated (a buffering gateway, a response cache), labelled as JSON or, wrongly, as SSE."""
    result = bench(tmp_path, standin_fault="not_streamed", standin_body_content_type=label)
    message = failed(result)["tokens_produced"]
    assert message.startswith("not streamed: asked for stream: true, the server answered with one "
                              f"{label} body"), message
    assert "4 completion tokens in its usage" in message  # the warm-up's answer, the first request
    assert "[DONE]" not in message


def test_an_upper_case_scheme_is_a_url_like_any_other(tmp_path, capsys):
    """URL schemes are case-insensitive (RFC 3986): `HTTP://` is benchmarked, not refused with a wrong hint."""
    with standin(tmp_path, **FAST) as url:
        code = main(["bench", "--url", url.replace("http://", "HTTP://"), "--model", "m", "--prompt-tokens", "64",
                     "--output-tokens", "16"])
    assert code == 0, capsys.readouterr()


def test_a_client_read_far_from_the_servers_decode_time_reports_the_servers():
    """Pure: a controller too loaded to read the stream in time (its first token read late, the rest in a
    catch-up) once read a 12% slower config 30% faster; the server's own decode time is the instrument then.
    Within 10% the client's reading stands; hidden reasoning tokens keep the client's (the server's time
    holds tokens the client never saw)."""
    from rigkit.verify.client import _client_or_server_decode
    from rigkit.verify.stream import StreamResult

    single = StreamResult(requested_prompt_tokens=2048, requested_output_tokens=256, completion_tokens=256)
    server_s = 255 / 880.0
    assert _client_or_server_decode(879.7, single, server_s) == (879.7, [])
    rate, [warning] = _client_or_server_decode(1300.0, single, server_s)
    assert rate == pytest.approx(880.0) and "the server's figure is reported" in warning and "+48%" in warning
    assert _client_or_server_decode(1300.0, single, None) == (1300.0, [])
    reasoning = StreamResult(requested_prompt_tokens=2048, requested_output_tokens=256, completion_tokens=256,
                             reasoning_tokens=100)
    assert reasoning.hidden_tokens == 100 and _client_or_server_decode(1300.0, reasoning, server_s) == (1300.0, [])
