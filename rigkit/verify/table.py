"""Text a person reads at the end of a run: the summary table. Every row is a field of the JSON."""

from __future__ import annotations

from rigkit.verify.client import BenchResult, ConcurrencyLevel


def _fmt(value, spec=".1f", unit=""):
    return "-" if value is None else f"{value:{spec}}{unit}"


def _acceptance(result: BenchResult) -> str:
    status = result.acceptance_status
    if status == "measured":
        rate = "" if result.acceptance_rate is None else f", acceptance rate {result.acceptance_rate:.2f}"
        return f"{result.acceptance_length:.2f} mean length{rate}"
    if status == "rate only":
        return f"acceptance rate {result.acceptance_rate:.2f} (mean length unknown: {result.acceptance_source})"
    if status == "unknown":
        return f"unknown ({result.acceptance_source or 'no spec-decode counters'})"
    return "- (not drafting)"


def _level(level: ConcurrencyLevel) -> str:
    failed = level.requests - level.succeeded
    text = (f"{_fmt(level.aggregate_tok_s, '.0f')} tok/s aggregate from {level.succeeded} of {level.requests} "
            f"requests, {_fmt(level.per_stream_decode_tok_s, '.1f')} tok/s per stream")
    return text + (f"; {failed} FAILED" if failed else "")


def bench_table(result: BenchResult) -> str:
    rows = [
        ("model", result.model),
        ("endpoint", "/v1/chat/completions" if result.endpoint == "chat" else "/v1/completions"),
        ("prompt tokens (asked / counted)", f"{result.requested_prompt_tokens} / {_fmt(result.prompt_tokens, 'd')}"
         + (f", {result.cached_prompt_tokens} from the prefix cache" if result.cached_prompt_tokens else "")),
        ("completion tokens (asked / from usage)",
         f"{result.requested_output_tokens} / {_fmt(result.completion_tokens, 'd')}, "
         f"finish_reason {result.finish_reason or '-'}"
         + (f", {result.hidden_tokens} of them never streamed" if result.hidden_tokens else "")),
        ("first token in", ", ".join(result.token_fields) or "-"),
        ("TTFT (client)", _fmt(result.ttft_s, ".3f", " s")),
        ("TTFT, same prompt again (prefix cache)",
         f"{_fmt(result.repeat_ttft_s, '.3f', ' s')} (x{_fmt(result.prefix_cache_speedup, '.1f')} faster)"),
        ("queue (server)", _fmt(result.queue_s, ".3f", " s")),
        (f"prefill ({result.prefill_source})", _fmt(result.prefill_tok_s, ".0f", " tok/s")),
        ("decode (client)", _fmt(result.decode_tok_s, ".1f", " tok/s")),
        ("decode (server decode time)", _fmt(result.server_decode_tok_s, ".1f", " tok/s")),
        ("tokens per chunk", _fmt(result.tokens_per_chunk, ".2f")),
        ("ITL p50 / p99", f"{_fmt(result.itl_p50_ms, '.1f')} / {_fmt(result.itl_p99_ms, '.1f')} ms"),
        ("longest stall", _fmt(result.max_stall_ms, ".0f", " ms")),
        ("speculative decoding", _acceptance(result)),
    ]
    rows += [(f"concurrency {level.concurrency}", _level(level)) for level in result.concurrency]
    width = max(len(r[0]) for r in rows)
    lines = [f"{label:<{width}}  {value}" for label, value in rows]
    lines += [f"WARN  {w}" for w in result.warnings]
    lines += [f"{'PASS' if c.passed else 'FAIL'}  {c.name}: {c.message}" for c in result.checks]
    return "\n".join(lines)
