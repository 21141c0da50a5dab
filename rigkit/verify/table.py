"""Text a person reads at the end of a run: the summary tables."""

from __future__ import annotations

from rigkit.verify.client import BenchResult


def _fmt(value, spec=".1f", unit=""):
    return "-" if value is None else f"{value:{spec}}{unit}"


def bench_table(result: BenchResult) -> str:
    rows = [
        ("model", result.model),
        ("prompt tokens (asked / counted)", f"{result.requested_prompt_tokens} / {_fmt(result.prompt_tokens, 'd')}"),
        ("completion tokens (from usage)", _fmt(result.completion_tokens, "d")),
        ("TTFT", _fmt(result.ttft_s, ".3f", " s")),
        ("prefill", _fmt(result.prefill_tok_s, ".0f", " tok/s")),
        ("decode", _fmt(result.decode_tok_s, ".1f", " tok/s")),
        ("tokens per chunk", _fmt(result.tokens_per_chunk, ".2f")),
        ("ITL p50 / p99", f"{_fmt(result.itl_p50_ms, '.1f')} / {_fmt(result.itl_p99_ms, '.1f')} ms"),
        ("longest stall", _fmt(result.max_stall_ms, ".0f", " ms")),
        ("acceptance length", _fmt(result.acceptance_length, ".2f")),
    ]
    for level in result.concurrency:
        rows.append((f"concurrency {level.concurrency}",
                     f"{_fmt(level.aggregate_tok_s, '.0f')} tok/s aggregate, "
                     f"{_fmt(level.per_stream_decode_tok_s, '.1f')} tok/s per stream"))
    width = max(len(r[0]) for r in rows)
    lines = [f"{label:<{width}}  {value}" for label, value in rows]
    lines += [f"{'PASS' if c.passed else 'FAIL'}  {c.name}: {c.message}" for c in result.checks]
    return "\n".join(lines)
