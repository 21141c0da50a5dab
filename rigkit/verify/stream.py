"""One streamed completion, read to its end: tokens, times, and whether it finished well.

- Every event is read (rigkit.verify.sse parses the wire format); an `error` object
  in any event, or an SSE `event: error`, fails the request with the server's own text.
- Two endpoints, measured by the same rules: `completions` (`/v1/completions`, a `prompt`)
  and `chat` (`/v1/chat/completions`, the prompt as one user message), for chat-only
  servers and gateways.
- The first token is the first generated text of any kind: `text`, `delta.content`,
  `delta.reasoning_content`, `delta.reasoning`, a tool call's name/arguments, or a
  choice-level `reasoning`/`reasoning_content` (some servers put a reasoning model's
  text there on completions). An empty chunk (empty string, role-only delta) is not a token.
- Tokens are counted from `usage`, never from chunks. A stream that carried neither a
  token nor usage (only `data: [DONE]`) is named as such: no tokens came back.
- A stream that ends without finish_reason, with an abnormal one, or with fewer
  tokens than asked (ignore_eos is set) is a problem: its figures are kept, the
  check fails.
- Times are kept twice: monotonic (rates) and wall clock (to line up with GPU telemetry).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field

import httpx

from rigkit.verify import sse

NORMAL_FINISH = ("length", "stop")
ENDPOINTS = {"completions": "/v1/completions", "chat": "/v1/chat/completions"}


@dataclass
class StreamResult:
    requested_prompt_tokens: int
    requested_output_tokens: int = 0
    error: str | None = None  # the request failed: nothing from it is a figure
    problems: list[str] = field(default_factory=list)  # it finished badly: figures kept, checks fail
    finish_reason: str | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    chunks: int = 0  # events that carried generated text
    token_fields: list[str] = field(default_factory=list)  # which fields carried it, in order seen
    t_send: float = 0.0  # time.monotonic()
    t_first: float | None = None
    t_last: float | None = None
    wall_send_s: float = 0.0  # time.time(), the same instants
    wall_first_s: float | None = None
    wall_last_s: float | None = None
    chunk_times: list[float] = field(default_factory=list)

    @property
    def failed(self) -> bool:
        return self.error is not None or bool(self.problems)

    @property
    def ttft_s(self) -> float | None:
        return None if self.t_first is None else self.t_first - self.t_send

    @property
    def arrival_span_s(self) -> float | None:
        return None if self.t_first is None or self.t_last is None else self.t_last - self.t_first

    @property
    def decode_tok_s(self) -> float | None:
        span = self.arrival_span_s
        if not self.completion_tokens or self.completion_tokens < 2 or not span or span <= 0:
            return None
        return (self.completion_tokens - 1) / span

    @property
    def chunk_counted_decode_tok_s(self) -> float | None:
        """What a harness counting chunks as tokens would report (kept to show the error)."""
        span = self.arrival_span_s
        if self.chunks < 2 or not span or span <= 0:
            return None
        return (self.chunks - 1) / span


def generated(choice: dict) -> dict[str, str]:
    """Generated text in one streamed choice, by the field that carried it (empty ones left out)."""
    delta = choice.get("delta") or {}
    found = {"text": choice.get("text"), "content": delta.get("content"),
             "reasoning_content": delta.get("reasoning_content"), "reasoning": delta.get("reasoning"),
             "choice.reasoning_content": choice.get("reasoning_content"), "choice.reasoning": choice.get("reasoning")}
    calls = delta.get("tool_calls") or []
    found["tool_calls"] = "".join(
        str((c.get("function") or {}).get(part) or "") for c in calls if isinstance(c, dict) for part in ("name", "arguments"))
    return {k: v for k, v in found.items() if isinstance(v, str) and v}


def error_text(payload) -> str | None:
    """The server's own error text from an event or a response body; None if there is none."""
    if not isinstance(payload, dict):
        return None
    err = payload.get("error")
    if isinstance(err, dict):
        return str(err.get("message") or json.dumps(err))
    if err:
        return str(err)
    if payload.get("object") == "error":
        return str(payload.get("message") or json.dumps(payload))
    return None


def request_body(endpoint: str, model: str, prompt: str, max_tokens: int) -> dict:
    """The streamed request for `endpoint`: the same sampling either way; chat sends the prompt as one user message."""
    if endpoint not in ENDPOINTS:
        raise ValueError(f"endpoint {endpoint!r}: one of {', '.join(ENDPOINTS)}")
    body = {"model": model, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True, "stream": True,
            "stream_options": {"include_usage": True}}
    if endpoint == "chat":
        return {**body, "messages": [{"role": "user", "content": prompt}]}
    return {**body, "prompt": prompt}


def stream_completion(client: httpx.Client, url: str, model: str, prompt: str, requested: int,
                      max_tokens: int, timeout_s: float, endpoint: str = "completions") -> StreamResult:
    result = StreamResult(requested_prompt_tokens=requested, requested_output_tokens=max_tokens)
    body = request_body(endpoint, model, prompt, max_tokens)
    deadline = time.monotonic() + timeout_s
    result.t_send, result.wall_send_s = time.monotonic(), time.time()
    decoder = sse.Decoder()
    try:
        with client.stream("POST", f"{url}{ENDPOINTS[endpoint]}", json=body, timeout=timeout_s) as response:
            if response.status_code != 200:
                result.error = _http_error(response)
                if response.status_code == 404 and endpoint == "completions" and "does not exist" not in result.error:
                    result.error += " (no /v1/completions here: a chat-only server or gateway? try --endpoint chat)"
                return result
            for piece in response.iter_bytes():
                now, wall = time.monotonic(), time.time()
                for event in decoder.feed(piece):
                    _take(result, event, now, wall)
                if now > deadline:
                    result.error = f"stream still running after the {timeout_s:.0f} s timeout"
                    return result
            for event in decoder.finish():
                _take(result, event, time.monotonic(), time.time())
    except httpx.TimeoutException:
        result.error = f"no token within the {timeout_s:.0f} s timeout (a server can answer /health and still be stuck)"
    except httpx.HTTPError as exc:
        result.error = f"request failed: {exc}"
    _judge(result)
    return result


def _http_error(response: httpx.Response) -> str:
    raw = response.read().decode(errors="replace")
    try:
        text = error_text(json.loads(raw)) or raw
    except ValueError:
        text = raw
    return f"HTTP {response.status_code}: {text.strip()[:300]}"


def _take(result: StreamResult, event: sse.Event, now: float, wall: float) -> None:
    if event.data.strip() == "[DONE]":
        return
    try:
        payload = json.loads(event.data)
    except ValueError:
        payload = None
    text = error_text(payload) or (event.data.strip() if event.event == "error" else None)
    if text or payload is None:
        message = f"the server sent an error mid-stream: {text}" if text else \
            f"the server sent data that is not JSON: {event.data[:200]!r}"
        result.error = result.error or message  # the first error is the cause; later events still read
        return
    if payload.get("usage"):
        result.prompt_tokens = payload["usage"].get("prompt_tokens")
        result.completion_tokens = payload["usage"].get("completion_tokens")
    fields = {}
    for choice in payload.get("choices") or []:
        fields.update(generated(choice))
        if choice.get("finish_reason"):
            result.finish_reason = choice["finish_reason"]
    if fields:
        result.chunks += 1
        result.chunk_times.append(now)
        result.token_fields += [f for f in fields if f not in result.token_fields]
        if result.t_first is None:
            result.t_first, result.wall_first_s = now, wall
        result.t_last, result.wall_last_s = now, wall


def _judge(result: StreamResult) -> None:
    if result.error is not None:
        return
    if result.completion_tokens is None and result.t_first is None and result.finish_reason is None:
        result.error = ("no tokens came back: the stream ended with no token, no finish_reason and no usage "
                        "(nothing but [DONE])")
        return
    if result.completion_tokens is None:
        result.error = "the server sent no usage; tokens cannot be counted honestly (needs stream_options.include_usage)"
        return
    asked, got = result.requested_output_tokens, result.completion_tokens
    if result.finish_reason is None:
        result.problems.append("the stream ended without a finish_reason: cut off before the end?")
    elif result.finish_reason not in NORMAL_FINISH:
        result.problems.append(f"finish_reason {result.finish_reason!r}: the server ended the request abnormally")
    if got < asked:
        result.problems.append(
            f"early stop: asked for {asked} tokens with ignore_eos, usage says {got} "
            f"(finish_reason {result.finish_reason!r}); figures are from the {got} that arrived")
