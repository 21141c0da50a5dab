"""Benchmark client for any OpenAI-compatible server (vLLM or not), streaming over httpx.

Honest counting, after the field notes:
- tokens come from the API's `usage` (stream_options.include_usage), never from
  chunks: speculative decoding packs several tokens per chunk; the chunk count is
  kept only to report tokens per chunk (and what chunk counting would have said);
- prefill is measured on an uncached prompt (a random prefix busts the prefix
  cache), and the prompt length is read back from usage.prompt_tokens: over 5%
  off the request is a failed check, not a silent figure;
- decode tok/s = (completion_tokens - 1) / (last token time - first token time),
  prefill tok/s = prompt_tokens / time to first token, kept apart;
- speculative acceptance from /metrics deltas: 1 + d(accepted) / d(drafts);
- every request has a timeout: a server whose /health says OK but that produces
  no tokens fails a check within it, never hangs the run.
"""

from __future__ import annotations

import json
import random
import re
import statistics
import threading
import time
from dataclasses import asdict, dataclass, field

import httpx

from rigkit.verify.checks import Check

PROMPT_TOLERANCE = 0.05
ACCEPTANCE_FLOOR = 1.05  # a mean acceptance length below this with drafting on means drafts are all rejected
# Common words that are one token each in the usual tokenizers; a random 6-word prefix busts the prefix cache.
WORDS = (
    "the of and to in is it you that he was for on are as with his they at be this have from or one had by word "
    "but not what all were we when your can said there use an each which she do how their if will up other about "
    "out many then them these so some her would make like him into time has look two more write go see number no way"
).split()
NONCE_WORDS = 6


@dataclass
class StreamResult:
    requested_prompt_tokens: int
    error: str | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    chunks: int = 0
    t_send: float = 0.0
    t_first: float | None = None
    t_last: float | None = None
    chunk_times: list[float] = field(default_factory=list)

    @property
    def ttft_s(self) -> float | None:
        return None if self.t_first is None else self.t_first - self.t_send

    @property
    def decode_tok_s(self) -> float | None:
        if not self.completion_tokens or self.completion_tokens < 2 or not self.t_last or self.t_last <= self.t_first:
            return None
        return (self.completion_tokens - 1) / (self.t_last - self.t_first)

    @property
    def chunk_counted_decode_tok_s(self) -> float | None:
        """What a harness counting chunks as tokens would report (kept to show the error)."""
        if self.chunks < 2 or not self.t_last or self.t_last <= self.t_first:
            return None
        return (self.chunks - 1) / (self.t_last - self.t_first)


@dataclass(frozen=True)
class ConcurrencyLevel:
    concurrency: int
    errors: list[str]
    aggregate_tok_s: float | None
    per_stream_decode_tok_s: float | None


@dataclass(frozen=True)
class BenchResult:
    """One benchmark run: the single-stream figures, each concurrency level and the checks.
    Written out as JSON only at the edge (`to_json`); docs/verification.md describes the fields."""

    url: str
    model: str
    requested_prompt_tokens: int
    requested_output_tokens: int
    prompt_tokens: int | None
    completion_tokens: int | None
    chunks: int
    ttft_s: float | None
    prefill_tok_s: float | None
    decode_tok_s: float | None
    chunk_counted_decode_tok_s: float | None
    tokens_per_chunk: float | None
    itl_p50_ms: float | None
    itl_p99_ms: float | None
    max_stall_ms: float | None
    acceptance_length: float | None
    concurrency: list[ConcurrencyLevel]
    checks: list[Check]

    @property
    def passed(self) -> bool:
        return all(c.passed for c in self.checks)

    def to_json(self) -> dict:
        return {**asdict(self), "passed": self.passed}


def make_prompt(tokens: int, rng: random.Random) -> str:
    nonce = [rng.choice(WORDS) for _ in range(NONCE_WORDS)]
    filler = [WORDS[i % len(WORDS)] for i in range(max(0, tokens - NONCE_WORDS))]
    return " ".join(nonce + filler)


def stream_completion(client: httpx.Client, url: str, model: str, prompt: str, requested: int,
                      max_tokens: int, timeout_s: float) -> StreamResult:
    result = StreamResult(requested_prompt_tokens=requested)
    body = {
        "model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
        "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True},
    }
    deadline = time.monotonic() + timeout_s
    result.t_send = time.monotonic()
    try:
        with client.stream("POST", f"{url}/v1/completions", json=body, timeout=timeout_s) as response:
            if response.status_code != 200:
                result.error = f"HTTP {response.status_code}: {response.read().decode(errors='replace')[:200]}"
                return result
            for line in response.iter_lines():
                now = time.monotonic()
                if now > deadline:
                    result.error = f"stream still running after the {timeout_s:.0f} s timeout"
                    return result
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                event = json.loads(line[6:])
                if event.get("usage"):
                    result.prompt_tokens = event["usage"].get("prompt_tokens")
                    result.completion_tokens = event["usage"].get("completion_tokens")
                if any(c.get("text") or (c.get("delta") or {}).get("content") for c in event.get("choices") or []):
                    result.chunks += 1
                    result.chunk_times.append(now)
                    result.t_first = result.t_first or now
                    result.t_last = now
    except httpx.TimeoutException:
        result.error = f"no token within the {timeout_s:.0f} s timeout (a server can answer /health and still be stuck)"
    except httpx.HTTPError as exc:
        result.error = f"request failed: {exc}"
    if result.error is None and result.completion_tokens is None:
        result.error = "the server sent no usage; tokens cannot be counted honestly (needs stream_options.include_usage)"
    return result


def read_spec_counters(client: httpx.Client, url: str) -> tuple[float, float] | None:
    """(drafts, accepted tokens) from vLLM's /metrics, summed over labels; None if not exposed."""
    try:
        text = client.get(f"{url}/metrics", timeout=10).text
    except httpx.HTTPError:
        return None
    totals = {}
    for name in ("vllm:spec_decode_num_drafts_total", "vllm:spec_decode_num_accepted_tokens_total"):
        values = re.findall(rf"^{re.escape(name)}(?:{{[^}}]*}})?\s+([0-9.eE+-]+)", text, re.M)
        if not values:
            return None
        totals[name] = sum(float(v) for v in values)
    return totals["vllm:spec_decode_num_drafts_total"], totals["vllm:spec_decode_num_accepted_tokens_total"]


def _percentile(values: list[float], share: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(share * (len(ordered) - 1))))]


def _itl_ms(result: StreamResult) -> list[float]:
    """Gaps between chunks divided by the mean tokens per chunk: per-token latency."""
    if not result.completion_tokens or result.chunks < 2:
        return []
    per_chunk = result.completion_tokens / result.chunks
    times = result.chunk_times
    return [(b - a) * 1000 / per_chunk for a, b in zip(times, times[1:])]


def run_bench(url: str, model: str, prompt_tokens: int = 512, output_tokens: int = 128,
              concurrency: tuple[int, ...] = (), timeout_s: float = 120.0, api_key: str | None = None,
              expected_min_decode_tok_s: float | None = None, seed: int | None = None) -> BenchResult:
    """Single stream first (the figures), then each concurrency level."""
    rng = random.Random(seed)
    url = url.rstrip("/")
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    with httpx.Client(headers=headers, timeout=timeout_s) as client:
        before = read_spec_counters(client, url)
        warm = stream_completion(client, url, model, make_prompt(32, rng), 32, 4, timeout_s)
        single = warm if warm.error else stream_completion(
            client, url, model, make_prompt(prompt_tokens, rng), prompt_tokens, output_tokens, timeout_s)
        after = read_spec_counters(client, url)
        levels = [_concurrent(url, headers, model, c, prompt_tokens, output_tokens, timeout_s, rng) for c in concurrency]
    return _document(url, model, single, output_tokens, before, after, levels, expected_min_decode_tok_s)


def _concurrent(url, headers, model, streams, prompt_tokens, output_tokens, timeout_s, rng) -> ConcurrencyLevel:
    prompts = [make_prompt(prompt_tokens, rng) for _ in range(streams)]
    results: list[StreamResult | None] = [None] * streams
    with httpx.Client(headers=headers, timeout=timeout_s, limits=httpx.Limits(max_connections=streams)) as client:
        def one(n):
            results[n] = stream_completion(client, url, model, prompts[n], prompt_tokens, output_tokens, timeout_s)

        threads = [threading.Thread(target=one, args=(n,)) for n in range(streams)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    done = [r for r in results if r and not r.error]
    errors = [r.error for r in results if r and r.error]
    aggregate = per_stream = None
    if done:
        span = max(r.t_last for r in done) - min(r.t_send for r in done)
        aggregate = sum(r.completion_tokens for r in done) / span if span > 0 else None
        rates = [r.decode_tok_s for r in done if r.decode_tok_s]
        per_stream = statistics.mean(rates) if rates else None
    return ConcurrencyLevel(streams, errors, aggregate, per_stream)


def _document(url, model, single: StreamResult, requested_output, before, after, levels, expected_min) -> BenchResult:
    checks: list[Check] = []
    ok = single.error is None
    checks.append(Check("tokens_produced", ok, single.error or f"{single.completion_tokens} tokens counted from usage"))
    acceptance = None
    if before and after and after[0] > before[0]:
        acceptance = 1 + (after[1] - before[1]) / (after[0] - before[0])
        passed = acceptance >= ACCEPTANCE_FLOOR
        checks.append(Check("spec_decode_acceptance", passed,
                            f"mean acceptance length {acceptance:.2f}" + ("" if passed else
                            " with drafting on: every draft is rejected, decode is slower than without it; "
                            "check --dtype (half with a bfloat16 drafter accepts nothing)")))
    if ok and single.prompt_tokens is not None:
        off = abs(single.prompt_tokens - single.requested_prompt_tokens) / single.requested_prompt_tokens
        checks.append(Check("context_readback", off <= PROMPT_TOLERANCE,
                            f"asked for {single.requested_prompt_tokens} prompt tokens, the server counted "
                            f"{single.prompt_tokens} ({off:.1%} off; over {PROMPT_TOLERANCE:.0%} fails)"))
    decode = single.decode_tok_s if ok else None
    if expected_min is not None:
        passed = decode is not None and decode >= expected_min
        checks.append(Check("decode_min", passed,
                            f"decode {decode:.1f} tok/s vs expected >= {expected_min:g}" if decode else
                            f"no decode rate measured; expected >= {expected_min:g} tok/s"))
    itl = _itl_ms(single) if ok else []
    gaps = [(b - a) * 1000 for a, b in zip(single.chunk_times, single.chunk_times[1:])]
    return BenchResult(
        url=url,
        model=model,
        requested_prompt_tokens=single.requested_prompt_tokens,
        requested_output_tokens=requested_output,
        prompt_tokens=single.prompt_tokens,
        completion_tokens=single.completion_tokens,
        chunks=single.chunks,
        ttft_s=single.ttft_s if ok else None,
        prefill_tok_s=single.prompt_tokens / single.ttft_s if ok and single.prompt_tokens and single.ttft_s else None,
        decode_tok_s=decode,
        chunk_counted_decode_tok_s=single.chunk_counted_decode_tok_s if ok else None,
        tokens_per_chunk=single.completion_tokens / single.chunks if ok and single.chunks else None,
        itl_p50_ms=_percentile(itl, 0.50),
        itl_p99_ms=_percentile(itl, 0.99),
        max_stall_ms=max(gaps) if gaps else None,
        acceptance_length=acceptance,
        concurrency=levels,
        checks=checks,
    )
