"""What vLLM's /metrics says about one request: snapshots before and after it, and their deltas.

Owns the Prometheus text format (summed over labels, per label where needed) and the
arithmetic on it, so the client never guesses:
- per-request histograms (`_sum` and `_count` are enough for one request): queue
  time, prefill time, decode time and TTFT as the server measured them; used only
  when exactly one request finished between the snapshots;
- speculative decoding from whichever counters this vLLM version has: drafts,
  draft tokens, accepted tokens, or accepted tokens per draft position.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

HISTOGRAMS = {
    "queue_s": "vllm:request_queue_time_seconds",
    "prefill_s": "vllm:request_prefill_time_seconds",
    "decode_s": "vllm:request_decode_time_seconds",
    "ttft_s": "vllm:time_to_first_token_seconds",
}
GENERATED = "vllm:generation_tokens_total"
PREFIX_CACHE_HITS = "vllm:prefix_cache_hits_total"  # in tokens: the prompt tokens served from the prefix cache
DRAFTS = "vllm:spec_decode_num_drafts_total"
DRAFT_TOKENS = "vllm:spec_decode_num_draft_tokens_total"
ACCEPTED = "vllm:spec_decode_num_accepted_tokens_total"
ACCEPTED_PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos_total"
_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)")
_POSITION = re.compile(r'position="(\d+)"')


@dataclass(frozen=True)
class Snapshot:
    totals: dict[str, float]  # metric sample name -> value summed over labels
    accepted_per_pos: dict[int, float] = field(default_factory=dict)


def parse(text: str) -> Snapshot:
    totals: dict[str, float] = {}
    per_pos: dict[int, float] = {}
    for line in text.splitlines():
        match = _SAMPLE.match(line)
        if not match:
            continue  # comments (# HELP, # TYPE) and blank lines
        name, labels, raw = match.groups()
        try:
            value = float(raw)
        except ValueError:
            continue
        totals[name] = totals.get(name, 0.0) + value
        position = _POSITION.search(labels or "")
        if name == ACCEPTED_PER_POS and position:
            per_pos[int(position.group(1))] = per_pos.get(int(position.group(1)), 0.0) + value
    return Snapshot(totals, per_pos)


@dataclass(frozen=True)
class ServerTimes:
    """One request's times from the server's histograms (None where the histogram is absent)."""

    queue_s: float | None
    prefill_s: float | None
    decode_s: float | None
    ttft_s: float | None


def request_times(before: Snapshot | None, after: Snapshot | None) -> tuple[ServerTimes | None, str]:
    """(times, why not) for the one request that ran between the snapshots."""
    if before is None or after is None:
        return None, "/metrics could not be read"
    found, counts = {}, set()
    for key, name in HISTOGRAMS.items():
        if f"{name}_sum" in after.totals and f"{name}_count" in after.totals:
            counts.add(round(after.totals[f"{name}_count"] - before.totals.get(f"{name}_count", 0.0)))
            found[key] = after.totals[f"{name}_sum"] - before.totals.get(f"{name}_sum", 0.0)
    if "prefill_s" not in found:
        return None, "no vllm:request_prefill_time_seconds histogram in /metrics"
    if counts != {1}:
        return None, f"{sorted(counts)} requests finished while one was measured: other traffic on the server"
    return ServerTimes(**{k: found.get(k) for k in HISTOGRAMS}), ""


def generated_since(earlier: Snapshot | None, later: Snapshot | None) -> float | None:
    """Tokens vLLM counted as generated between two snapshots; None where it has no such counter."""
    if earlier is None or later is None or GENERATED not in later.totals:
        return None
    return later.totals[GENERATED] - earlier.totals.get(GENERATED, 0.0)


def cached_prompt_tokens(before: Snapshot | None, after: Snapshot | None) -> int | None:
    """Prompt tokens the one request between the snapshots took from the prefix cache (vLLM counts hits in tokens)."""
    if before is None or after is None or PREFIX_CACHE_HITS not in after.totals:
        return None
    return round(after.totals[PREFIX_CACHE_HITS] - before.totals.get(PREFIX_CACHE_HITS, 0.0))


@dataclass(frozen=True)
class Acceptance:
    length: float | None  # mean acceptance length: 1 + accepted / drafts
    rate: float | None  # accepted / draft tokens
    source: str  # the counters it came from, or why there is no figure
    idle: bool = False  # the spec-decode counters are there and did not move: no drafting during the request


def acceptance(before: Snapshot | None, after: Snapshot | None, draft_tokens_per_step: int | None = None) -> Acceptance:
    """From any sufficient set of counters; None figures when drafting did not happen or is unreadable."""
    if before is None or after is None:
        return Acceptance(None, None, "/metrics could not be read")

    def delta(name):
        return after.totals[name] - before.totals.get(name, 0.0) if name in after.totals else None

    accepted, source = delta(ACCEPTED), ACCEPTED
    if accepted is None and after.accepted_per_pos:
        accepted = sum(after.accepted_per_pos.values()) - sum(before.accepted_per_pos.values())
        source = ACCEPTED_PER_POS
    drafts, draft_tokens = delta(DRAFTS), delta(DRAFT_TOKENS)
    k = len(after.accepted_per_pos) or draft_tokens_per_step
    if accepted is not None and (drafts is not None or draft_tokens is not None) and not (drafts or draft_tokens):
        return Acceptance(None, None, "spec-decode counters did not move: no drafting during the request", idle=True)
    if accepted is None or not (drafts or draft_tokens):
        names = ", ".join(n for n in (DRAFTS, DRAFT_TOKENS, ACCEPTED, ACCEPTED_PER_POS) if n in after.totals)
        return Acceptance(None, None, f"no sufficient spec-decode counters (found: {names or 'none'})")
    rate = accepted / draft_tokens if draft_tokens else None
    if drafts:
        return Acceptance(1 + accepted / drafts, rate, f"{source} / {DRAFTS}")
    if k:  # every draft proposes k tokens: drafts = draft tokens / k
        return Acceptance(1 + accepted / (draft_tokens / k), rate, f"{source} / ({DRAFT_TOKENS} / {k} per draft)")
    return Acceptance(None, rate, f"{source} / {DRAFT_TOKENS} (no {DRAFTS}: rate only)")


def engine_without_drafting(snapshot: Snapshot | None) -> bool:
    """vLLM's /metrics (its request counters are there) with no spec-decode counter: not drafting.
    vLLM registers the spec-decode counters only when a speculative config is given (seen on 0.32)."""
    if snapshot is None or "vllm:generation_tokens_total" not in snapshot.totals:
        return False
    return not any(name.startswith("vllm:spec_decode_") for name in snapshot.totals)
