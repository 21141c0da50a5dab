"""Benchmark client for any OpenAI-compatible server (vLLM or not), streaming over httpx.

Honest counting, after the field notes:
- tokens come from the API's `usage`, never from chunks (rigkit.verify.stream reads
  each stream to its end and says whether it finished well);
- either endpoint (`completions` or `chat`), by the same rules; on chat the template's
  own prompt tokens are read from the warm-up request (its usage less its prompt) and
  taken off before the context read-back;
- prefill is measured on an uncached prompt (a random prefix busts the prefix
  cache), and the prompt length is read back from usage.prompt_tokens;
- prompts are sized in the server's own tokens: words are not tokens (a real tokenizer
  counted 300 of the prompt's words as 488-1231 tokens), so one-token calibration
  requests measure the server's tokens per word and what it adds to every prompt (a BOS
  token, a chat template) before the measured prompt is built (_calibrate);
- prefill tok/s from the server's own prefill time when vLLM's per-request
  histograms are in /metrics (queueing reported apart); otherwise prompt / TTFT,
  labelled as including queueing;
- decode tok/s = (completion_tokens - 1) / (last token time - first token time),
  unless the tokens arrived in a burst (then no client-side rate at all);
- prefill excludes the prompt tokens the server took from its prefix cache (usage's
  `prompt_tokens_details.cached_tokens`, else vLLM's `vllm:prefix_cache_hits_total`): a chat
  template's long system message is cached after the warm-up; with under half the prompt
  prefilled, prefill is not measured and the run says why;
- speculative acceptance from whichever /metrics counters exist (rigkit.verify.metrics), read
  only once they have settled: vLLM's generation counter has counted every token this
  benchmark's requests generated (their usage), waited for METRICS_SETTLE_S at most, before
  the measured request and after it; else acceptance is "unknown". Drafting is told from
  counters only: several tokens per chunk is chunking (a detokenizer makes it too);
- reasoning that usage counts and the stream never carried (a relay dropping it) fails
  `tokens_streamed`; decode is then the visible tokens' rate, and neither TTFT nor the
  prefix-cache repeat is judged;
- the prefix cache: the measured prompt is sent once more, after the figures are taken;
  its TTFT against the first (`repeat_ttft_s`, `prefix_cache_speedup`) shows whether the
  server caches prefixes (a warning when a long repeated prompt was not faster);
- every request has a timeout; every failed request, at any concurrency, fails a check.
"""

from __future__ import annotations

import json
import random
import socket
import statistics
import threading
import time
from dataclasses import asdict, dataclass, field, replace

import httpx

from rigkit.verify import bench_checks as judge
from rigkit.verify import metrics, untrusted
from rigkit.verify.checks import Check
from rigkit.verify.stream import StreamResult, stream_completion

PREFILL_FROM_SERVER = "server prefill time (vllm:request_prefill_time_seconds)"
PREFILL_FROM_TTFT = "prompt / TTFT (includes queueing)"
METRICS_SETTLE_S = 5.0  # /metrics read again, METRICS_POLL_S apart, until it has counted the requests sent
METRICS_POLL_S = 0.05
MIN_PREFILLED_SHARE = 0.5  # prefill measured only where at least this share of the prompt was not cached
# Common words, the prompt's filler, in this order and over again (NONCE_POOL's shuffle comes first).
WORDS = (
    "the of and to in is it you that he was for on are as with his they at be this have from or one had by word "
    "but not what all were we when your can said there use an each which she do how their if will up other about "
    "out many then them these so some her would make like him into time has look two more write go see number no way"
).split()
# The random prefix is a shuffle of the same 12 words, not a draw of any: the server's count of a prompt of
# n words is then the same whatever its prefix (vLLM's 1,024-token tokenizer split the common words into
# 1-4 tokens, and 6 words drawn at random moved a prompt's count by up to 20 tokens), and 12! orders keep
# every prompt's first block its own.
NONCE_POOL = ("ask", "bring", "carry", "draw", "earn", "fold", "grow", "hold", "join", "keep", "lend", "mend")
NONCE_WORDS = len(NONCE_POOL)
WARM_PROMPT_TOKENS = 32
CALIBRATION_PROBES = 3  # one-token requests that size a short prompt in the server's tokens
CALIBRATION_TOLERANCE = 0.01  # within 1% of the asked length: the read-back allows 5%
REPEAT_OUTPUT_TOKENS = 4
PREFIX_CACHE_EVIDENT = 2.0  # a repeated prompt's TTFT at least this many times shorter: served from the cache
PREFIX_CACHE_MIN_PROMPT = 256  # on shorter prompts fixed per-request costs hide the prefill
# Small writes wait for a delayed ACK (~40 ms) without TCP_NODELAY: the client's own request would add to TTFT.
NO_DELAY = [(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)]


def http_client(headers: dict, timeout_s: float, connections: int = 1, verify=True) -> httpx.Client:
    """The client every benchmark request goes through (also rigkit.gateway.verify's), with TCP_NODELAY. It
    asks for bodies as they are (`Accept-Encoding: identity`): a compressed body is decoded before any bound
    applies, and a gzip of zeros grows a thousandfold (rigkit.verify.untrusted). `verify`: for https, an
    ssl.SSLContext (the gateway's CA, or its deployed certificate) or True (the system's CAs)."""
    transport = httpx.HTTPTransport(socket_options=NO_DELAY, limits=httpx.Limits(max_connections=connections),
                                    verify=verify)
    return httpx.Client(headers={"Accept-Encoding": "identity", **headers}, timeout=timeout_s, transport=transport)


@dataclass(frozen=True)
class ConcurrencyLevel:
    concurrency: int
    errors: list[str]  # one line per failed request
    aggregate_tok_s: float | None  # completion tokens of the requests that succeeded / wall time
    per_stream_decode_tok_s: float | None
    requests: int = 0
    succeeded: int = 0


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
    finish_reason: str | None = None
    token_fields: list[str] = field(default_factory=list)
    prefill_source: str = PREFILL_FROM_TTFT
    queue_s: float | None = None
    server_prefill_s: float | None = None
    server_decode_s: float | None = None
    server_ttft_s: float | None = None
    server_decode_tok_s: float | None = None
    arrival_span_s: float | None = None
    cached_prompt_tokens: int | None = None  # prompt tokens served from the prefix cache, where the server says
    cached_source: str = ""  # where that count came from
    hidden_tokens: int = 0  # reasoning tokens usage counted that the stream never carried
    acceptance_rate: float | None = None
    acceptance_status: str = "not drafting"  # measured | rate only | unknown | not drafting
    acceptance_source: str = ""
    repeat_ttft_s: float | None = None  # the measured prompt sent again: its TTFT (a prefix-cache hit is much shorter)
    prefix_cache_speedup: float | None = None  # ttft_s / repeat_ttft_s
    endpoint: str = "completions"  # completions | chat (rigkit.verify.stream.ENDPOINTS)
    chat_template_tokens: int | None = None  # chat only: prompt tokens the template adds, from the warm-up
    # How the server counted the prompt's words (PromptScale): tokens per word and its own tokens per prompt.
    prompt_scale: dict = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    wall_send_s: float | None = None  # time.time() at send, first and last token: lines up with telemetry
    wall_first_token_s: float | None = None
    wall_last_token_s: float | None = None
    provenance: dict = field(default_factory=dict)

    @property
    def passed(self) -> bool:
        return all(c.passed for c in self.checks)

    def to_json(self) -> dict:
        return {**asdict(self), "passed": self.passed}


def make_prompt(words: int, rng: random.Random) -> str:
    """`words` words: a random prefix (busts the prefix cache), then a fixed filler."""
    nonce = rng.sample(NONCE_POOL, NONCE_WORDS)
    filler = [WORDS[i % len(WORDS)] for i in range(max(0, words - NONCE_WORDS))]
    return " ".join(nonce + filler)


@dataclass(frozen=True)
class PromptScale:
    """How the server counts make_prompt's words: `overhead` tokens on every prompt (a BOS token, a chat
    template's) plus `tokens_per_word` per word. The default (1 and 0) is the guess before any reading."""

    tokens_per_word: float = 1.0
    overhead: float = 0.0
    words: int | None = None  # the word count a calibration request found right, where one did

    @classmethod
    def from_counts(cls, short_words: int, short_tokens: int, long_words: int, long_tokens: int) -> "PromptScale":
        """From two prompts the server counted (usage.prompt_tokens), a short one and a long one."""
        if long_words <= short_words:
            return cls(max(long_tokens, 1) / max(long_words, 1), 0.0)
        per_word = max((long_tokens - short_tokens) / (long_words - short_words), 0.05)
        return cls(per_word, max(0.0, short_tokens - short_words * per_word))

    def words_for(self, tokens: int, template: bool) -> int:
        """Words for a prompt of `tokens` of the server's tokens: on chat, besides the template's (the
        context read-back takes them off); on completions, with the BOS token counted as the server does."""
        if self.words is not None:
            return self.words
        own = tokens if template else tokens - self.overhead
        return max(NONCE_WORDS, round(own / self.tokens_per_word))

    def template_tokens(self) -> int:
        return round(self.overhead)


def read_metrics(client: httpx.Client, url: str) -> metrics.Snapshot | None:
    try:
        status, body = untrusted.get_bounded(client, f"{url}/metrics", untrusted.MAX_METRICS_BYTES, 10)
    except (httpx.HTTPError, untrusted.TooLarge):
        return None
    return metrics.parse(body.decode(errors="replace")) if status == 200 else None


class ServerCounters:
    """vLLM's /metrics, read so that it has counted what this benchmark sent. vLLM's counters can land a
    moment after the last token (a metrics thread, a scrape interval behind a proxy): read too early, the
    snapshot before the measured request still lacks the warm-up's drafts, which then count as the
    measurement's. So every request's completion tokens (its usage) are added up, and a snapshot is taken
    once vllm:generation_tokens_total has grown by that many since the first (METRICS_SETTLE_S at most)."""

    def __init__(self, client: httpx.Client, url: str):
        self.client, self.url = client, url
        self.baseline = read_metrics(client, url)
        self.generated = 0

    def spent(self, result: StreamResult) -> StreamResult:
        self.generated += result.completion_tokens or 0
        return result

    def read(self, before: metrics.Snapshot | None = None) -> tuple[metrics.Snapshot | None, str]:
        """(snapshot, why it is not settled: "" when it is). With `before`: also until the prefill histogram
        has counted one more request than `before` (servers record a finished request a moment later)."""
        histogram = f"{metrics.HISTOGRAMS['prefill_s']}_count"
        deadline = time.monotonic() + METRICS_SETTLE_S
        while True:
            now = read_metrics(self.client, self.url)
            counted = metrics.generated_since(self.baseline, now)
            late = []
            if counted is not None and counted < self.generated:
                late.append(f"{metrics.GENERATED} had counted {counted:.0f} of the {self.generated} tokens sent")
            if before is not None and now is not None and histogram in now.totals and \
                    now.totals[histogram] <= before.totals.get(histogram, 0):
                late.append(f"{metrics.HISTOGRAMS['prefill_s']} had not counted the request")
            if not late or now is None:
                return now, ""
            if time.monotonic() >= deadline:
                return now, f"/metrics had not settled after {METRICS_SETTLE_S:g} s ({'; '.join(late)})"
            time.sleep(METRICS_POLL_S)


def _server_version(client: httpx.Client, url: str) -> str | None:
    try:
        status, body = untrusted.get_bounded(client, f"{url}/version", untrusted.MAX_BODY_BYTES, 10)
        version = json.loads(body).get("version") if status == 200 else None
    except (httpx.HTTPError, untrusted.TooLarge, ValueError, AttributeError):
        return None
    return untrusted.printable(str(version), untrusted.secrets_of(client), 80) if version is not None else None


def _percentile(values: list[float], share: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(share * (len(ordered) - 1))))]


def _itl_ms(result: StreamResult) -> list[float]:
    """Gaps between chunks divided by the mean tokens per chunk: per-token latency."""
    if not result.visible_tokens or result.chunks < 2:
        return []
    per_chunk = result.visible_tokens / result.chunks
    times = result.chunk_times
    return [(b - a) * 1000 / per_chunk for a, b in zip(times, times[1:])]


def run_bench(url: str, model: str, prompt_tokens: int = 512, output_tokens: int = 128,
              concurrency: tuple[int, ...] = (), timeout_s: float = 120.0, api_key: str | None = None,
              expected_min_decode_tok_s: float | None = None, seed: int | None = None,
              roofline_tok_s: float | None = None, draft_tokens_per_step: int | None = None,
              endpoint: str = "completions", verify=True) -> BenchResult:
    """Single stream first (the figures, with /metrics read around it), then each concurrency level.
    `verify`: how an https URL's certificate is checked (http_client)."""
    rng = random.Random(seed)
    url = url.rstrip("/")
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    before = after = repeat = None
    unsettled = ""
    with http_client(headers, timeout_s, verify=verify) as client:
        version = _server_version(client, url)
        counters = ServerCounters(client, url)
        warm = counters.spent(stream_completion(client, url, model, make_prompt(WARM_PROMPT_TOKENS, rng),
                                                WARM_PROMPT_TOKENS, 4, timeout_s, endpoint))
        single, scale = warm, PromptScale()
        if not warm.error:
            scale = _calibrate(client, url, model, prompt_tokens, warm, timeout_s, endpoint, rng, counters)
            single, single_prompt, before, after, unsettled, bursts = _single_stream(
                client, url, model, scale.words_for(prompt_tokens, endpoint == "chat"), prompt_tokens,
                output_tokens, timeout_s, endpoint, rng, counters)
            if not single.error:
                repeat = _repeat(client, url, model, single_prompt, prompt_tokens, timeout_s, endpoint, single,
                                 warm.ttft_s if warm is not single else None)
        runs = [(c, _concurrent(url, headers, model, c, prompt_tokens, output_tokens, timeout_s, rng, endpoint,
                                scale, verify)) for c in concurrency]
    template = scale.template_tokens() if endpoint == "chat" and warm.prompt_tokens is not None else None
    provenance = {"prompt_tokens": prompt_tokens, "output_tokens": output_tokens,
                  "concurrency": [1, *concurrency], "server_version": version, "endpoint": endpoint}
    result = _document(url, model, prompt_tokens, output_tokens, single, before, after, runs,
                       expected_min_decode_tok_s, roofline_tok_s, draft_tokens_per_step, provenance, template, repeat,
                       warm.ttft_s if warm is not single else None, unsettled)
    measured_again = [f"the measured request's tokens arrived in a burst ({b}) and it was measured again: "
                      "a client not scheduled in time (a loaded controller) bursts once, a buffering proxy every time"
                      for b in (bursts if not warm.error else [])]
    return replace(result, prompt_scale={"tokens_per_word": round(scale.tokens_per_word, 4),
                                         "overhead_tokens": round(scale.overhead, 2)},
                   warnings=[*measured_again, *result.warnings])


# The client's decode rate and the server's own (vllm:request_decode_time_seconds) agree within a few
# percent when the client is scheduled in time (879.7 against 880.0 tok/s, a stand-in on a loaded machine).
# Further apart, the client read its first token late and the rest in a catch-up (a starved controller:
# a run 12% slower was read 30% faster once): the server's figure is the instrument then.
CLIENT_SERVER_DECODE_SPLIT = 0.10


def _client_or_server_decode(client_tok_s: float | None, single: StreamResult,
                             server_decode_s: float | None) -> tuple[float | None, list[str]]:
    """The decode rate a result reports, and a warning when the server's replaced the client's."""
    n = single.completion_tokens
    if client_tok_s is None or not server_decode_s or not n or n < 2 or single.hidden_tokens:
        return client_tok_s, []  # hidden reasoning: the server's time holds tokens the client never saw
    server_tok_s = (n - 1) / server_decode_s
    if abs(client_tok_s / server_tok_s - 1) <= CLIENT_SERVER_DECODE_SPLIT:
        return client_tok_s, []
    return server_tok_s, [f"decode: the client read {client_tok_s:.1f} tok/s and the server's decode time gives "
                          f"{server_tok_s:.1f} tok/s ({client_tok_s / server_tok_s - 1:+.0%}): the client was not "
                          "scheduled in time (a loaded controller) or sits behind a proxy; the server's figure is "
                          "reported"]


# A burst is measured again, after a pause, at most this many times: a starved client bursts now and then, a
# buffering proxy always. Two were not enough on a 2-core machine serving vLLM's CPU build: the demo's gate
# read a burst in each of its 3 runs and three in a row in one (256 tokens within 3.6-6.0 ms for 0.22 s of
# server decode; the engine's threads and the SSH tunnel the client reads through share both cores).
BURST_RETRIES = 4
BURST_PAUSE_S = 1.0


def _single_stream(client, url, model, prompt_words, prompt_tokens, output_tokens, timeout_s, endpoint, rng,
                   counters: ServerCounters):
    """The measured request with /metrics read around it, each read once settled (ServerCounters):
    (result, its prompt, before, after, why not settled, bursts). A
    result whose tokens arrived in a burst (bench_checks.check_decode_plausible, without the roofline) is
    measured again with a new prompt, up to BURST_RETRIES times: on vLLM 0.32's CPU build, a 2-core machine
    once read all 256 tokens of a 0.18 s decode within 1 ms, the client starved by the engine beside it,
    while a proxy that buffers does it every time. `bursts`: what each burst measured again looked like."""
    bursts: list[str] = []
    while True:
        before, unsettled = counters.read()
        prompt = make_prompt(prompt_words, rng)
        single = counters.spent(stream_completion(client, url, model, prompt, prompt_tokens, output_tokens,
                                                  timeout_s, endpoint))
        after, unsettled_after = counters.read(before)
        unsettled = unsettled or unsettled_after
        if single.error or len(bursts) == BURST_RETRIES:
            return single, prompt, before, after, unsettled, bursts
        times, _ = metrics.request_times(before, after)
        plausible = judge.check_decode_plausible(single, times.decode_s if times else None, None, None)
        if plausible is None or plausible.passed:
            return single, prompt, before, after, unsettled, bursts
        decode = f" for {times.decode_s:.2f} s of server decode" if times and times.decode_s else ""
        bursts.append(f"{single.completion_tokens} tokens within {(single.arrival_span_s or 0) * 1000:.1f} ms{decode}")
        time.sleep(BURST_PAUSE_S)  # what starved the client now may be gone in a moment


def _calibrate(client, url, model, prompt_tokens, warm: StreamResult, timeout_s, endpoint, rng,
               counters: ServerCounters) -> PromptScale:
    """How the server counts make_prompt's words, from one-token requests. A long prompt repeats the filler's
    WORDS cycle, so the tokens per word come from two prompts one whole cycle apart (one and two cycles;
    a 2048-token probe would cost a whole prefill per benchmark) and hold for any number of cycles. A prompt
    of two cycles or less is then tried at the word count the scale predicts, up to CALIBRATION_PROBES
    times, until one is within CALIBRATION_TOLERANCE (the filler's words differ in length). A server that
    reports no usage keeps the guess (the measured request then fails on its missing usage anyway)."""
    chat, cycle = endpoint == "chat", len(WORDS)

    def counted(words: int) -> int | None:
        probe = counters.spent(stream_completion(client, url, model, make_prompt(words, rng), words, 1, timeout_s,
                                                 endpoint))
        return None if probe.error else probe.prompt_tokens

    one = NONCE_WORDS + cycle
    if warm.prompt_tokens is None or (at_one := counted(one)) is None:
        return PromptScale()
    scale = PromptScale.from_counts(WARM_PROMPT_TOKENS, warm.prompt_tokens, one, at_one)
    if scale.words_for(prompt_tokens, chat) > one:
        if (at_two := counted(one + cycle)) is None:
            return scale
        scale = PromptScale.from_counts(one, at_one, one + cycle, at_two)
        if scale.words_for(prompt_tokens, chat) > one + cycle:
            return scale
    for _ in range(CALIBRATION_PROBES):
        words = scale.words_for(prompt_tokens, chat)
        if (tokens := counted(words)) is None:
            return scale
        if abs(tokens - (scale.template_tokens() if chat else 0) - prompt_tokens) <= CALIBRATION_TOLERANCE * prompt_tokens:
            return replace(scale, words=words)
        scale = PromptScale.from_counts(WARM_PROMPT_TOKENS, warm.prompt_tokens, words, tokens)
    return scale


def _concurrent(url, headers, model, streams, prompt_tokens, output_tokens, timeout_s, rng,
                endpoint="completions", scale: PromptScale = PromptScale(), verify=True) -> list[StreamResult]:
    prompts = [make_prompt(scale.words_for(prompt_tokens, endpoint == "chat"), rng) for _ in range(streams)]
    results: list[StreamResult] = [StreamResult(prompt_tokens, output_tokens, error="never ran")] * streams
    with http_client(headers, timeout_s, streams, verify) as client:
        def one(n):
            results[n] = stream_completion(client, url, model, prompts[n], prompt_tokens, output_tokens, timeout_s,
                                           endpoint)

        threads = [threading.Thread(target=one, args=(n,)) for n in range(streams)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    return results


def _level(streams: int, results: list[StreamResult]) -> ConcurrencyLevel:
    done = [r for r in results if not r.failed and r.t_last is not None]
    errors = [r.error or "; ".join(r.problems) for r in results if r.failed]
    aggregate = per_stream = None
    if done:
        span = max(r.t_last for r in done) - min(r.t_send for r in done)
        aggregate = sum(r.completion_tokens for r in done) / span if span > 0 else None
        rates = [r.decode_tok_s for r in done if r.decode_tok_s]
        per_stream = statistics.mean(rates) if rates else None
    return ConcurrencyLevel(streams, errors, aggregate, per_stream, requests=len(results), succeeded=len(done))


def _repeat(client, url, model, prompt, prompt_tokens, timeout_s, endpoint, single: StreamResult,
            warm_ttft_s: float | None) -> StreamResult:
    """The measured prompt sent again (the prefix cache's test), once more where the first repeat looks
    uncached: the faster of the two. A cached prompt stays cached, and a loaded machine only ever adds
    time: one repeat of vLLM's CPU build read 0.066 s against 0.102 s first (a "cache off" warning with
    the cache on), where a prefill share of 80 ms left no room for a few tens of ms of noise."""
    first = stream_completion(client, url, model, prompt, prompt_tokens, REPEAT_OUTPUT_TOKENS, timeout_s, endpoint)
    if first.error or first.ttft_s is None or not single.ttft_s or not _looks_uncached(single, first, warm_ttft_s):
        return first
    again = stream_completion(client, url, model, prompt, prompt_tokens, REPEAT_OUTPUT_TOKENS, timeout_s, endpoint)
    return again if not again.error and again.ttft_s is not None and again.ttft_s < first.ttft_s else first


def _looks_uncached(single: StreamResult, repeat: StreamResult, warm_ttft_s: float | None) -> bool:
    """Did the repeat save less than half the first request's prefill (x2 where the warm-up is not known)?"""
    if warm_ttft_s:
        return repeat.ttft_s > (single.ttft_s + warm_ttft_s) / 2
    return single.ttft_s / repeat.ttft_s < PREFIX_CACHE_EVIDENT if repeat.ttft_s > 0 else False


def _prefix_cache(single: StreamResult, repeat: StreamResult | None, warnings: list[str],
                  warm_ttft_s: float | None = None):
    """(repeat TTFT, speedup) of the measured prompt sent again; a warning when a long one was not faster.
    `warm_ttft_s`: the warm-up's TTFT (a 32-token prompt), the server's cost per request apart from
    prefill, which no cache removes. Where it is known, a cache must have saved at least half of the
    rest (the prefill's share of the first TTFT); a prompt whose first TTFT was under PREFIX_CACHE_EVIDENT
    times it had too little prefill to show a cache, and gets no verdict. Measured on vLLM 0.32's CPU
    build with a tiny model: a 2048-token prompt at 0.055 s, its cached repeat at 0.028 s (x1.9, the
    cache working), a 488-token one slower on repeat on noise alone. Where it is not known: x2 or more."""
    if repeat is None:
        return None, None
    if single.hidden_tokens or repeat.hidden_tokens:
        warnings.append("prefix cache not measured: the first visible token came after hidden reasoning tokens, "
                        "so TTFT holds their decode too")
        return None, None
    if repeat.error or repeat.ttft_s is None:
        warnings.append(f"prefix cache not measured: the repeated prompt failed ({repeat.error or 'no token'})")
        return None, None
    speedup = single.ttft_s / repeat.ttft_s if single.ttft_s and repeat.ttft_s > 0 else None
    prefill_shows = single.ttft_s >= PREFIX_CACHE_EVIDENT * warm_ttft_s if warm_ttft_s and single.ttft_s else True
    not_cached = bool(single.ttft_s) and _looks_uncached(single, repeat, warm_ttft_s)
    if speedup is not None and not_cached and prefill_shows and single.requested_prompt_tokens >= PREFIX_CACHE_MIN_PROMPT:
        warnings.append(f"prefix cache: the same {single.requested_prompt_tokens}-token prompt sent again took "
                        f"{repeat.ttft_s:.3f} s to its first token, {single.ttft_s:.3f} s the first time "
                        f"(x{speedup:.1f}); is prefix caching off (--no-enable-prefix-caching)?")
    return repeat.ttft_s, speedup


def _document(url, model, requested_prompt, requested_output, single: StreamResult, before, after, runs,
              expected_min, roofline_tok_s, draft_tokens_per_step, provenance, template_tokens=None,
              repeat: StreamResult | None = None, warm_ttft_s: float | None = None,
              unsettled: str = "") -> BenchResult:
    ok = single.error is None
    checks = [judge.check_tokens_produced(single)]
    warnings = []
    if ok:
        checks.append(judge.check_stream_finished(single))
        checks += [c for c in [judge.check_tokens_streamed(single)] if c]
        if single.prompt_tokens is not None:
            checks.append(judge.check_context_readback(single, template_tokens or 0))
    if not ok:
        times, why_not = None, "the request failed"
        acc = metrics.Acceptance(None, None, "")
    elif unsettled:
        times, why_not = None, unsettled
        acc = metrics.Acceptance(None, None, unsettled)
    else:
        times, why_not = metrics.request_times(before, after)
        acc = metrics.acceptance(before, after, draft_tokens_per_step)
    tokens_per_chunk = single.visible_tokens / single.chunks if ok and single.chunks else None
    status = judge.acceptance_status(acc, metrics.engine_without_drafting(after))
    if status == "unknown" and tokens_per_chunk and tokens_per_chunk >= judge.SEVERAL_PER_CHUNK:
        warnings.append(f"acceptance unknown: {acc.source}. {tokens_per_chunk:.2f} tokens per chunk is chunking "
                        "(drafting makes it, and so does a detokenizer holding back partial characters), not "
                        "evidence of drafting")
    checks += [c for c in [judge.check_acceptance(acc)] if c]
    server_decode_s = times.decode_s if times else None
    plausible = judge.check_decode_plausible(single, server_decode_s, roofline_tok_s,
                                             acc.length or tokens_per_chunk) if ok else None
    checks += [plausible] if plausible else []
    believable = ok and (plausible is None or plausible.passed)
    decode = single.decode_tok_s if believable else None
    decode, lag = _client_or_server_decode(decode, single, server_decode_s)
    warnings += lag
    if expected_min is not None:
        passed = decode is not None and decode >= expected_min
        checks.append(Check("decode_min", passed,
                            f"decode {decode:.1f} tok/s vs expected >= {expected_min:g}" if decode else
                            f"no decode rate measured; expected >= {expected_min:g} tok/s"))
    if single.problems:
        warnings += single.problems
    repeat_ttft, speedup = _prefix_cache(single, repeat, warnings, warm_ttft_s) if ok else (None, None)
    prefill_s = times.prefill_s if times else None
    cached, cached_source = _cached(single, before, after, times) if ok else (None, "")
    prefilled = single.prompt_tokens - (cached or 0) if ok and single.prompt_tokens else None
    if ok and single.prompt_tokens and prefill_s and prefill_s > 0:
        prefill, source = prefilled / prefill_s, PREFILL_FROM_SERVER
    else:
        prefill = prefilled / single.ttft_s if prefilled and single.ttft_s else None
        source = PREFILL_FROM_TTFT + (f" ({why_not})" if why_not else "")
        if ok and not believable:  # the first token arrived with the burst: TTFT holds the decode too
            prefill, source = None, "not measured: tokens arrived in a burst and the server has no prefill histogram"
        elif ok and single.hidden_tokens:
            prefill, source = None, (f"not measured: the first visible token came after {single.hidden_tokens} "
                                     "hidden reasoning tokens and the server has no prefill histogram")
    if cached and prefilled is not None:
        if prefilled < MIN_PREFILLED_SHARE * single.prompt_tokens:
            prefill, source = None, (f"not measured: {cached} of the {single.prompt_tokens} prompt tokens came from "
                                     f"the prefix cache ({cached_source}); only {prefilled} were prefilled")
        warnings.append(f"prefix cache: {cached} of the {single.prompt_tokens} prompt tokens were served from the "
                        f"cache ({cached_source}; a chat template's system message, say): prefill is counted over "
                        f"the {prefilled} prefilled")
    levels = []
    for streams, results in runs:
        levels.append(_level(streams, results))
        checks.append(judge.check_concurrency(streams, results))
    itl = _itl_ms(single) if believable else []
    gaps = [(b - a) * 1000 for a, b in zip(single.chunk_times, single.chunk_times[1:])] if believable else []
    n = single.completion_tokens
    return BenchResult(
        url=url, model=model,
        requested_prompt_tokens=requested_prompt, requested_output_tokens=requested_output,
        prompt_tokens=single.prompt_tokens, completion_tokens=n, chunks=single.chunks,
        ttft_s=single.ttft_s if ok else None,
        prefill_tok_s=prefill, decode_tok_s=decode,
        chunk_counted_decode_tok_s=single.chunk_counted_decode_tok_s if believable else None,
        tokens_per_chunk=tokens_per_chunk,
        itl_p50_ms=_percentile(itl, 0.50), itl_p99_ms=_percentile(itl, 0.99), max_stall_ms=max(gaps) if gaps else None,
        acceptance_length=acc.length, concurrency=levels, checks=checks,
        finish_reason=single.finish_reason, token_fields=single.token_fields, prefill_source=source,
        queue_s=times.queue_s if times else None, server_prefill_s=prefill_s, server_decode_s=server_decode_s,
        server_ttft_s=times.ttft_s if times else None,
        server_decode_tok_s=(n - 1) / server_decode_s if n and n > 1 and server_decode_s else None,
        arrival_span_s=single.arrival_span_s if ok else None,
        acceptance_rate=acc.rate, acceptance_status=status, acceptance_source=acc.source, warnings=warnings,
        wall_send_s=single.wall_send_s if ok else None, wall_first_token_s=single.wall_first_s if ok else None,
        wall_last_token_s=single.wall_last_s if ok else None, provenance=provenance,
        endpoint=provenance.get("endpoint", "completions"), chat_template_tokens=template_tokens,
        repeat_ttft_s=repeat_ttft, prefix_cache_speedup=speedup,
        cached_prompt_tokens=cached, cached_source=cached_source, hidden_tokens=single.hidden_tokens if ok else 0,
    )


def _cached(single: StreamResult, before, after, times) -> tuple[int | None, str]:
    """(prompt tokens the measured request took from the prefix cache, where that count came from): usage's
    own count first, else vLLM's hit counter over the request (only where one request ran: `times`)."""
    if single.cached_prompt_tokens is not None:
        return min(single.cached_prompt_tokens, single.prompt_tokens or 0), "usage.prompt_tokens_details.cached_tokens"
    hits = metrics.cached_prompt_tokens(before, after) if times else None
    if hits is not None and single.prompt_tokens:
        return max(0, min(hits, single.prompt_tokens)), metrics.PREFIX_CACHE_HITS
    return None, ""
