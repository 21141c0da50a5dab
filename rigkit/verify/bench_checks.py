"""Verdicts on a benchmark's streams, with reasons. Pure functions on what the client measured.

- a request that failed, or a stream that did not finish well, fails a check with the server's text;
- a decode rate must be physically plausible: tokens that arrive in a burst (a buffering
  proxy, a non-streaming gateway) give a client-side rate that means nothing;
- acceptance of speculative drafts, from whatever counters the server has;
- every failed request at any concurrency fails the run.
"""

from __future__ import annotations

from collections import Counter

from rigkit.verify.checks import Check
from rigkit.verify.metrics import Acceptance
from rigkit.verify.stream import StreamResult

PROMPT_TOLERANCE = 0.05
ACCEPTANCE_FLOOR = 1.05  # a mean acceptance length below this with drafting on means drafts are all rejected
ACCEPTANCE_RATE_FLOOR = 0.02
BURST_SHARE = 0.5  # tokens that arrive in under half the server's decode time arrived in a burst
BURST_MIN_TOKENS = 8  # fewer tokens say nothing about bursts
MAX_STREAM_TOK_S = 20_000.0  # no single stream decodes this fast: a client-side rate above it is a burst
ROOFLINE_MARGIN = 1.5  # decode above 1.5x the bandwidth bound (per step) is not physical
MAX_TOKENS_PER_STEP = 8  # the most tokens one decode step can carry, when acceptance is unknown
# Tokens per chunk at or above this look like drafting, and are reported as chunking: vLLM 0.32's detokenizer
# alone packed 1.16-1.60 tokens per chunk (a byte-level BPE's partial characters held back) with no drafter,
# ngram drafting gave 2.3, and a relay hiding reasoning shows any number. Drafting is told from counters only.
SEVERAL_PER_CHUNK = 1.3


def check_tokens_produced(single: StreamResult) -> Check:
    if single.error:
        return Check("tokens_produced", False, single.error)
    return Check("tokens_produced", True,
                 f"{single.completion_tokens} tokens counted from usage (finish_reason {single.finish_reason!r})")


def check_stream_finished(single: StreamResult) -> Check:
    if single.problems:
        return Check("stream_finished", False, "; ".join(single.problems))
    return Check("stream_finished", True,
                 f"finish_reason {single.finish_reason!r} after all {single.completion_tokens} tokens asked for")


def check_context_readback(single: StreamResult, template_tokens: int = 0) -> Check:
    """`template_tokens`: what a chat template adds to every prompt (read from the warm-up), taken off first."""
    off = abs(single.prompt_tokens - template_tokens - single.requested_prompt_tokens) / single.requested_prompt_tokens
    template = f", of which {template_tokens} the chat template's" if template_tokens else ""
    return Check("context_readback", off <= PROMPT_TOLERANCE,
                 f"asked for {single.requested_prompt_tokens} prompt tokens, the server counted "
                 f"{single.prompt_tokens}{template} ({off:.1%} off; over {PROMPT_TOLERANCE:.0%} fails)")


def check_decode_plausible(single: StreamResult, server_decode_s: float | None, roofline_tok_s: float | None,
                           tokens_per_step: float | None) -> Check | None:
    """None when too few tokens arrived to tell."""
    tokens = single.visible_tokens or 0  # hidden reasoning arrived in no chunk: it has no arrival time
    if tokens < BURST_MIN_TOKENS or single.t_first is None:
        return None
    if server_decode_s and single.hidden_tokens:  # the server's decode time holds the hidden tokens too
        server_decode_s *= tokens / single.completion_tokens
    span_s = single.arrival_span_s or 0.0
    rate = (tokens - 1) / span_s if span_s > 0 else float("inf")
    why = None
    if server_decode_s and span_s < BURST_SHARE * server_decode_s:
        why = (f"{tokens} tokens arrived within {span_s * 1000:.1f} ms, while the server spent "
               f"{server_decode_s:.2f} s decoding them (vllm:request_decode_time_seconds)")
    elif rate > MAX_STREAM_TOK_S:
        pace = f"{rate:,.0f} tok/s" if span_s > 0 else "all at once"
        why = (f"{tokens} tokens arrived within {span_s * 1000:.1f} ms ({pace}): faster than any single "
               f"stream decodes (limit {MAX_STREAM_TOK_S:,.0f} tok/s)")
    elif roofline_tok_s:
        steps = min(tokens_per_step or 1.0, MAX_TOKENS_PER_STEP)
        bound = ROOFLINE_MARGIN * roofline_tok_s * max(1.0, steps)
        if rate > bound:
            why = (f"decode {rate:,.0f} tok/s is above {ROOFLINE_MARGIN}x the memory-bandwidth bound "
                   f"{roofline_tok_s:,.1f} tok/s x {max(1.0, steps):.2f} tokens per step")
    if why:
        return Check("decode_plausible", False,
                     f"tokens arrived in a burst: {why}. A buffering proxy or non-streaming gateway sits between "
                     "client and server; the client-side decode rate and ITL are meaningless and not reported")
    return Check("decode_plausible", True, f"{tokens} tokens arrived over {span_s:.2f} s")


def acceptance_status(acc: Acceptance, engine_without_drafting: bool = False) -> str:
    """From counters alone, never from chunk sizes: "measured" or "rate only" where they give a figure;
    "not drafting" where they say so (the spec-decode counters did not move, or `engine_without_drafting`:
    the server's /metrics is vLLM's with no spec-decode counter at all, which vLLM registers only with a
    speculative config); "unknown" where they cannot tell (none readable, or not settled in time)."""
    if acc.length is not None:
        return "measured"
    if acc.rate is not None:
        return "rate only"
    if acc.idle or engine_without_drafting:
        return "not drafting"
    return "unknown"


def check_tokens_streamed(single: StreamResult) -> Check | None:
    """None unless usage counts reasoning tokens that no chunk carried."""
    if not single.hidden_tokens:
        return None
    return Check("tokens_streamed", False,
                 f"usage counts {single.reasoning_tokens} reasoning tokens (completion_tokens_details) and no "
                 f"reasoning came down the stream: {single.hidden_tokens} of {single.completion_tokens} tokens were "
                 "hidden (a relay dropping reasoning?); decode is measured over the "
                 f"{single.visible_tokens} that arrived, and the first token's time holds the hidden ones")


def check_acceptance(acc: Acceptance) -> Check | None:
    hint = (" with drafting on: every draft is rejected, decode is slower than without it; "
            "check --dtype (half with a bfloat16 drafter accepts nothing)")
    if acc.length is not None:
        ok = acc.length >= ACCEPTANCE_FLOOR
        rate = "" if acc.rate is None else f", acceptance rate {acc.rate:.2f}"
        return Check("spec_decode_acceptance", ok,
                     f"mean acceptance length {acc.length:.2f}{rate} (from {acc.source})" + ("" if ok else hint))
    if acc.rate is not None:
        ok = acc.rate >= ACCEPTANCE_RATE_FLOOR
        return Check("spec_decode_acceptance", ok,
                     f"acceptance rate {acc.rate:.2f} (from {acc.source})" + ("" if ok else hint))
    return None


def check_concurrency(concurrency: int, results: list[StreamResult]) -> Check:
    failed = [r for r in results if r.failed]
    name = f"concurrency_{concurrency}"
    if not failed:
        return Check(name, True, f"all {len(results)} requests succeeded")
    causes = Counter(r.error or "; ".join(r.problems) for r in failed)
    listed = "; ".join(f"{n}x {cause}" for cause, n in causes.most_common(3))
    return Check(name, False, f"{len(failed)} of {len(results)} requests failed at concurrency {concurrency}: {listed}")
