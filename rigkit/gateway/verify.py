"""Verification through the gateway (docs/gateway.md, "Verification through the gateway"): per model
name the gateway serves, one benchmark through it with rigkit's benchmark client, and the time to
first token it adds against a direct request to one replica of the same model. No pyinfra here:
roles/gateway_verify.py gives the URLs (SSH port forwards) and keys.

- Tokens come from the API's `usage`, as in direct verification (rigkit.verify.stream): a gateway
  whose stream carries no usage fails `gateway_usage`; tokens are never counted from chunks instead.
- Usage must be the server's. When a backend's stream has no usage, LiteLLM 1.103.0 makes one up
  from its own tokenizer (measured: 65 completion and 520 prompt tokens for the stand-in's 64 and
  512), so "some usage arrived" proves nothing. One prompt goes both ways, direct first: the
  gateway's usage must equal the server's own count for it.
- The TTFT comparison alternates direct and gateway requests in ABBA blocks (drift cancels), each a
  short uncached prompt and a few tokens, a fixed number of them within a time budget. The medians
  and their difference are reported; requests through the gateway may land on any replica.
"""

from __future__ import annotations

import random
import statistics
import time
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from rigkit.verify.checks import Check
from rigkit.verify.client import BenchResult, http_client, make_prompt, run_bench
from rigkit.verify.history import write_document
from rigkit.verify.stream import StreamResult, stream_completion

# The benchmark through the gateway. 64 tokens: LiteLLM ends a stream after 100 identical chunks in a
# row (REPEATED_STREAMING_CHUNK_LIMIT, its loop guard), and a model asked to ignore EOS at temperature 0
# may well repeat one token; 64 chunks stay under it whatever the model writes.
PROMPT_TOKENS = 512
OUTPUT_TOKENS = 64
# The TTFT comparison: ABBA blocks of direct (A) and gateway (B) requests.
TTFT_BLOCKS = 3  # 6 requests per path
TTFT_PROMPT_TOKENS = 64  # short: the prefill adds little, the difference is the path's
TTFT_OUTPUT_TOKENS = 4
TTFT_BUDGET_S = 60.0  # the comparison stops starting blocks after this long, and says so
# The usage probe: one prompt sent direct, then through the gateway; their usage must agree.
PROBE_PROMPT_TOKENS = 64
PROBE_OUTPUT_TOKENS = 8
ORDER = ("direct", "gateway", "gateway", "direct")


@dataclass(frozen=True)
class TtftComparison:
    direct_replica: str  # the deployment id (rig.model) the direct requests went to
    direct_samples_ms: list[float]
    gateway_samples_ms: list[float]
    errors: list[str] = field(default_factory=list)  # one line per failed request: "path: what"
    note: str | None = None  # why fewer samples than planned, or why none

    @property
    def ttft_direct_ms(self) -> float | None:
        return statistics.median(self.direct_samples_ms) if self.direct_samples_ms else None

    @property
    def ttft_gateway_ms(self) -> float | None:
        return statistics.median(self.gateway_samples_ms) if self.gateway_samples_ms else None

    @property
    def ttft_added_ms(self) -> float | None:
        if self.ttft_direct_ms is None or self.ttft_gateway_ms is None:
            return None
        return self.ttft_gateway_ms - self.ttft_direct_ms


@dataclass(frozen=True)
class UsageProbe:
    """The same prompt, direct and through the gateway: (prompt_tokens, completion_tokens) of each."""

    direct: tuple[int | None, int | None] | None
    gateway: tuple[int | None, int | None] | None
    error: str | None = None  # a request of the probe failed: "path: what"

    @property
    def agrees(self) -> bool:
        return self.error is None and self.direct is not None and self.direct == self.gateway


@dataclass(frozen=True)
class GatewayModelResult:
    model: str  # the served name clients ask the gateway for
    replicas: list[str]  # deployment ids behind it
    bench: BenchResult  # through the gateway
    ttft: TtftComparison
    checks: list[Check]
    probe: UsageProbe | None = None  # None: not run (no usage at all through the gateway)

    @property
    def passed(self) -> bool:
        return all(c.passed for c in self.checks)

    def to_json(self) -> dict:
        t = self.ttft
        return {
            "model": self.model, "replicas": self.replicas,
            "usage_passed_through": self.bench.completion_tokens is not None,
            "usage_from_server": self.probe.agrees if self.probe else False,
            "usage_probe": _listed(asdict(self.probe)) if self.probe else None,
            "prompt_tokens": self.bench.prompt_tokens, "completion_tokens": self.bench.completion_tokens,
            "decode_tok_s": self.bench.decode_tok_s,
            "ttft_gateway_ms": t.ttft_gateway_ms, "ttft_direct_ms": t.ttft_direct_ms, "ttft_added_ms": t.ttft_added_ms,
            "ttft_direct_replica": t.direct_replica, "ttft_direct_samples_ms": t.direct_samples_ms,
            "ttft_gateway_samples_ms": t.gateway_samples_ms, "ttft_errors": t.errors, "ttft_note": t.note,
            "bench": self.bench.to_json(), "checks": [asdict(c) for c in self.checks], "passed": self.passed,
        }


def _listed(document: dict) -> dict:
    """Tuples as lists, as the JSON file will have them."""
    return {k: list(v) if isinstance(v, tuple) else v for k, v in document.items()}


def compare_ttft(direct_url: str, direct_key: str | None, gateway_url: str, gateway_key: str, model: str,
                 direct_replica: str, timeout_s: float, blocks: int = TTFT_BLOCKS, budget_s: float = TTFT_BUDGET_S,
                 seed: int | None = None, gateway_verify=True) -> TtftComparison:
    """Time to first token on each path, alternating; one unmeasured warm-up request per path first
    (connections, the proxy's first-call work). A path whose warm-up fails is not measured."""
    rng = random.Random(seed)
    urls = {"direct": direct_url.rstrip("/"), "gateway": gateway_url.rstrip("/")}
    keys = {"direct": direct_key, "gateway": gateway_key}
    samples: dict[str, list[float]] = {"direct": [], "gateway": []}
    errors: list[str] = []
    clients = {p: http_client({"Authorization": f"Bearer {k}"} if k else {}, timeout_s,
                              verify=gateway_verify if p == "gateway" else True) for p, k in keys.items()}
    try:
        def one(path: str) -> StreamResult:
            return stream_completion(clients[path], urls[path], model, make_prompt(TTFT_PROMPT_TOKENS, rng),
                                     TTFT_PROMPT_TOKENS, TTFT_OUTPUT_TOKENS, timeout_s)

        for path in ("direct", "gateway"):
            warm = one(path)
            if warm.error:
                return TtftComparison(direct_replica, [], [], [f"{path}: {warm.error}"],
                                      f"not measured: the warm-up request on the {path} path failed")
        started, note = time.monotonic(), None
        for block in range(blocks):
            if time.monotonic() - started > budget_s:
                note = f"stopped after {block} of {blocks} blocks: the {budget_s:.0f} s budget ran out"
                break
            for path in ORDER:
                result = one(path)
                if result.error or result.ttft_s is None:
                    errors.append(f"{path}: {result.error or 'no token arrived'}")
                else:
                    samples[path].append(result.ttft_s * 1000)
    finally:
        for client in clients.values():
            client.close()
    return TtftComparison(direct_replica, samples["direct"], samples["gateway"], errors, note)


def probe_usage(direct_url: str, direct_key: str | None, gateway_url: str, gateway_key: str, model: str,
                timeout_s: float, seed: int | None = None, gateway_verify=True) -> UsageProbe:
    """One prompt direct, then through the gateway; the usage each reported."""
    prompt = make_prompt(PROBE_PROMPT_TOKENS, random.Random(None if seed is None else -seed))  # not compare_ttft's
    counted = {}
    for path, url, key, verify in (("direct", direct_url, direct_key, True),
                                   ("gateway", gateway_url, gateway_key, gateway_verify)):
        with http_client({"Authorization": f"Bearer {key}"} if key else {}, timeout_s, verify=verify) as client:
            result = stream_completion(client, url.rstrip("/"), model, prompt, PROBE_PROMPT_TOKENS,
                                       PROBE_OUTPUT_TOKENS, timeout_s)
        if result.error:
            return UsageProbe(counted.get("direct"), None, f"{path}: {result.error}")
        counted[path] = (result.prompt_tokens, result.completion_tokens)
    return UsageProbe(counted["direct"], counted["gateway"])


def check_usage(bench: BenchResult, probe: UsageProbe | None) -> Check:
    """Did the server's usage reach the client through the gateway's stream? Without it nothing is counted."""
    if bench.completion_tokens is None:
        return Check("gateway_usage", False,
                     "no usage reached the client through the gateway's stream (stream_options.include_usage was "
                     "asked): tokens cannot be counted honestly, and rigkit does not count chunks instead. Check that "
                     "the gateway passes usage through streaming (LiteLLM does; a callback or proxy in front of it may "
                     f"drop it). The request said: {_first_error(bench)}")
    if probe is None or probe.error:
        return Check("gateway_usage", False, "could not tell whether the gateway's usage is the server's: the same "
                     f"prompt sent both ways failed ({probe.error if probe else 'not run'})")
    if not probe.agrees:
        return Check("gateway_usage", False,
                     f"the gateway's usage is not the server's: for one prompt the server counted {_pair(probe.direct)} "
                     f"directly, the gateway reported {_pair(probe.gateway)}. A gateway that gets no usage from the "
                     "server makes its own (LiteLLM estimates with its tokenizer); check that it forwards "
                     "stream_options.include_usage to the server")
    return Check("gateway_usage", True,
                 f"usage passed through the gateway's stream: {bench.completion_tokens} completion and "
                 f"{bench.prompt_tokens} prompt tokens counted from it; one prompt sent both ways got the server's "
                 f"own count through the gateway ({_pair(probe.gateway)})")


def _pair(counts) -> str:
    return "nothing" if counts is None else f"{counts[0]} prompt + {counts[1]} completion tokens"


def check_ttft(comparison: TtftComparison, max_added_ms: float | None = None) -> Check:
    """Passes when both paths answered and the gateway added at most `max_added_ms` (None: no limit)."""
    t = comparison
    if t.errors:
        return Check("gateway_ttft", False, f"{len(t.errors)} TTFT request(s) failed: {'; '.join(t.errors[:3])}")
    if t.ttft_added_ms is None:
        return Check("gateway_ttft", False, t.note or "no TTFT measured on one of the paths")
    if max_added_ms is not None and t.ttft_added_ms > max_added_ms:
        return Check("gateway_ttft", False,
                     f"the gateway adds {t.ttft_added_ms:.1f} ms to the first token (TTFT {t.ttft_gateway_ms:.1f} ms "
                     f"through it vs {t.ttft_direct_ms:.1f} ms direct to {t.direct_replica}), more than "
                     f"max_added_ttft_ms {max_added_ms:g}: is it buffering, retrying or queueing requests?")
    return Check("gateway_ttft", True,
                 f"TTFT {t.ttft_gateway_ms:.1f} ms through the gateway vs {t.ttft_direct_ms:.1f} ms direct to "
                 f"{t.direct_replica} ({t.ttft_added_ms:+.1f} ms; medians of {len(t.gateway_samples_ms)} and "
                 f"{len(t.direct_samples_ms)} requests, alternating){'; ' + t.note if t.note else ''}")


def _first_error(bench: BenchResult) -> str:
    failed = [c.message for c in bench.checks if not c.passed]
    return failed[0] if failed else "nothing failed"


def measure_model(gateway_url: str, gateway_key: str, direct_url: str, direct_key: str | None, model: str,
                  replicas: list[str], direct_replica: str, timeout_s: float, seed: int | None = None,
                  max_added_ttft_ms: float | None = None, gateway_verify=True) -> GatewayModelResult:
    """The benchmark through the gateway, then (if it got tokens) the TTFT comparison. `gateway_verify`:
    how the gateway's certificate is checked (rigkit.rigside.probe.pinned_context: the one deployed)."""
    bench = run_bench(gateway_url, model, PROMPT_TOKENS, OUTPUT_TOKENS, timeout_s=timeout_s, api_key=gateway_key,
                      seed=seed, verify=gateway_verify)
    if bench.completion_tokens is None:
        ttft = TtftComparison(direct_replica, [], [], [], "not measured: the benchmark through the gateway got no usage")
        return GatewayModelResult(model, replicas, bench, ttft, [*bench.checks, check_usage(bench, None)])
    probe = probe_usage(direct_url, direct_key, gateway_url, gateway_key, model, timeout_s, seed, gateway_verify)
    ttft = compare_ttft(direct_url, direct_key, gateway_url, gateway_key, model, direct_replica, timeout_s, seed=seed,
                        gateway_verify=gateway_verify)
    checks = [*bench.checks, check_usage(bench, probe), check_ttft(ttft, max_added_ttft_ms)]
    return GatewayModelResult(model, replicas, bench, ttft, checks, probe)


def summary_line(result: GatewayModelResult) -> str:
    """One line per model for the deploy's output; every figure is in the result JSON."""
    b, t = result.bench, result.ttft
    if b.completion_tokens is None:
        tokens = "NO USAGE through the gateway"
    elif result.probe is None or not result.probe.agrees:
        tokens = f"usage NOT the server's ({b.completion_tokens} of {b.requested_output_tokens} tokens reported)"
    else:
        tokens = f"{b.completion_tokens} of {b.requested_output_tokens} tokens counted from the server's usage"
    decode = f", decode {b.decode_tok_s:.1f} tok/s" if b.decode_tok_s else ""
    if t.ttft_added_ms is not None:
        ttft = (f"; TTFT gateway {t.ttft_gateway_ms:.1f} ms vs direct {t.ttft_direct_ms:.1f} ms to {t.direct_replica} "
                f"(added {t.ttft_added_ms:+.1f} ms, medians of {len(t.gateway_samples_ms)}/{len(t.direct_samples_ms)})")
    else:
        ttft = f"; TTFT not compared: {t.note or 'requests failed'}"
    return f"{'PASS' if result.passed else 'FAIL'}  gateway {result.model}: {tokens}{decode}{ttft}"


# Beside the per-model folders of results/<rig>/: a leading `_` is never a catalog model's name.
RESULTS_FOLDER = "_gateway"


def document(gateway_host: str, rig: str, url: str, results: list[GatewayModelResult],
             now: datetime | None = None) -> dict:
    """The verification result JSON (docs/verification.md, "Through the gateway")."""
    return {
        "kind": "gateway", "gateway_host": gateway_host, "rig": rig, "url": url,
        "time": (now or datetime.now(timezone.utc)).isoformat(timespec="seconds"),
        "workload": {"prompt_tokens": PROMPT_TOKENS, "output_tokens": OUTPUT_TOKENS,
                     "ttft_prompt_tokens": TTFT_PROMPT_TOKENS, "ttft_output_tokens": TTFT_OUTPUT_TOKENS,
                     "ttft_order": "ABBA (direct, gateway, gateway, direct)", "ttft_blocks": TTFT_BLOCKS},
        "models": [r.to_json() for r in results],
        "passed": all(r.passed for r in results),
    }


def save(results_dir: Path, rig: str, doc: dict) -> Path:
    folder = Path(results_dir) / rig / RESULTS_FOLDER
    return write_document(folder / f"{doc['time'].replace(':', '').replace('+0000', 'Z').replace('+00:00', 'Z')}.json", doc)
