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
- Usage's details are kept: `prompt_tokens_details.cached_tokens` (prompt tokens the server
  took from its prefix cache, not prefilled) and `completion_tokens_details.reasoning_tokens`.
  Reasoning that usage counts while no reasoning field ever came down the stream was hidden
  (a relay dropping it): those tokens are `hidden_tokens`, and the decode rate is the visible
  ones' over the span in which they arrived.
- `stream: true` answered without SSE (one `application/json` body: a buffering gateway, a
  response cache) fails as not streamed, with what the body held; the body is read only up
  to untrusted.MAX_BODY_BYTES.
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

from rigkit.verify import sse, untrusted
from rigkit.verify.untrusted import printable

NORMAL_FINISH = ("length", "stop")
REASONING_FIELDS = ("reasoning_content", "reasoning", "choice.reasoning_content", "choice.reasoning")
MAX_COUNT = 10 ** 9  # a token count in usage above this is not one
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
    cached_prompt_tokens: int | None = None  # usage.prompt_tokens_details.cached_tokens, where the server says
    reasoning_tokens: int | None = None  # usage.completion_tokens_details.reasoning_tokens, where the server says
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
    def hidden_tokens(self) -> int:
        """Reasoning tokens usage counts that never came down the stream (no reasoning field was seen)."""
        if not self.reasoning_tokens or any(f in REASONING_FIELDS for f in self.token_fields):
            return 0
        return min(self.reasoning_tokens, self.completion_tokens or 0)

    @property
    def visible_tokens(self) -> int | None:
        """The tokens that arrived in the stream's chunks: usage's count less the hidden ones."""
        return None if self.completion_tokens is None else self.completion_tokens - self.hidden_tokens

    @property
    def decode_tok_s(self) -> float | None:
        """The visible tokens over the span in which they arrived (hidden ones were generated before it)."""
        span, tokens = self.arrival_span_s, self.visible_tokens
        if not tokens or tokens < 2 or not span or span <= 0:
            return None
        return (tokens - 1) / span

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
    secrets = untrusted.secrets_of(client)
    try:
        with client.stream("POST", f"{url}{ENDPOINTS[endpoint]}", json=body, timeout=timeout_s) as response:
            if response.status_code != 200:
                result.error = _http_error(response, secrets)
                if response.status_code == 404 and endpoint == "completions" and "does not exist" not in result.error:
                    result.error += " (no /v1/completions here: a chat-only server or gateway? try --endpoint chat)"
                return result
            content_type = response.headers.get("content-type", "")
            if "json" in content_type.lower():
                result.error = _not_streamed(untrusted.read_bounded(response), content_type, secrets)
                return result
            head, events, received = bytearray(), 0, 0  # head: what came before any event (a whole body?)
            for piece in response.iter_bytes():
                now, wall = time.monotonic(), time.time()
                received += len(piece)
                if received > untrusted.MAX_STREAM_BYTES:
                    result.error = f"the stream passed {untrusted.MAX_STREAM_BYTES >> 20} MiB: not read further"
                    return result
                if not events and len(head) < untrusted.MAX_BODY_BYTES:
                    head += piece[:untrusted.MAX_BODY_BYTES - len(head)]
                for event in decoder.feed(piece):
                    events += 1
                    _take(result, event, now, wall, secrets)
                if now > deadline:
                    result.error = f"stream still running after the {timeout_s:.0f} s timeout"
                    return result
            for event in decoder.finish():
                events += 1
                _take(result, event, time.monotonic(), time.time(), secrets)
            if not events and _json_object(bytes(head)) is not None:
                result.error = _not_streamed(bytes(head), content_type or "unlabelled", secrets)
    except sse.EventTooLong as exc:
        result.error = f"the server sent {exc}: not a stream of events"
    except httpx.TimeoutException:
        result.error = f"no token within the {timeout_s:.0f} s timeout (a server can answer /health and still be stuck)"
    except httpx.HTTPError as exc:
        result.error = f"request failed: {printable(str(exc), secrets)}"
    _judge(result)
    return result


def _json_object(body: bytes) -> dict | None:
    try:
        payload = json.loads(body)
    except ValueError:
        return None
    return payload if isinstance(payload, dict) else None


def _not_streamed(body: bytes, content_type: str, secrets: tuple[str, ...]) -> str:
    """What one body sent for `stream: true` held (read up to its bound): it says the answer came whole."""
    payload = _json_object(body)
    held = f"{len(body)} bytes"
    if payload is not None:
        usage = payload.get("usage") if isinstance(payload.get("usage"), dict) else {}
        if error_text(payload):
            held += f", an error: {printable(error_text(payload), secrets, 200)}"
        elif _count(usage, "completion_tokens") is not None:
            held += f", {usage['completion_tokens']} completion tokens in its usage"
    return (f"not streamed: asked for stream: true, the server answered with one "
            f"{printable(content_type.split(';')[0], secrets, 80)} body "
            f"({held}) instead of server-sent events; a buffering gateway or a response cache in between? "
            "Nothing in it can be timed")


def _http_error(response: httpx.Response, secrets: tuple[str, ...]) -> str:
    raw = untrusted.read_bounded(response).decode(errors="replace")
    try:
        text = error_text(json.loads(raw)) or raw
    except ValueError:
        text = raw
    return f"HTTP {response.status_code}: {printable(text.strip(), secrets)}"


def _take(result: StreamResult, event: sse.Event, now: float, wall: float, secrets: tuple[str, ...] = ()) -> None:
    if event.data.strip() == "[DONE]":
        return
    try:
        payload = json.loads(event.data)
    except ValueError:
        payload = None
    text = error_text(payload) or (event.data.strip() if event.event == "error" else None)
    if text or not isinstance(payload, dict):
        message = f"the server sent an error mid-stream: {printable(text, secrets)}" if text else \
            f"the server sent data that is not a JSON object: {printable(event.data, secrets, 200)}"
        result.error = result.error or message  # the first error is the cause; later events still read
        return
    if isinstance(payload.get("usage"), dict) and payload["usage"]:
        usage = payload["usage"]
        result.prompt_tokens, result.completion_tokens = _count(usage, "prompt_tokens"), _count(usage, "completion_tokens")
        for name in ("prompt_tokens", "completion_tokens"):
            if usage.get(name) is not None and _count(usage, name) is None:
                result.error = result.error or (f"usage.{name} is not a token count: "
                                                f"{printable(json.dumps(usage.get(name)), secrets, 60)}")
        result.cached_prompt_tokens = _detail(usage, "prompt_tokens_details", "cached_tokens")
        result.reasoning_tokens = _detail(usage, "completion_tokens_details", "reasoning_tokens")
    fields = {}
    choices = payload.get("choices") if isinstance(payload.get("choices"), list) else []
    for choice in (c for c in choices if isinstance(c, dict)):
        fields.update(generated(choice))
        if choice.get("finish_reason"):
            result.finish_reason = printable(str(choice["finish_reason"]), secrets, 40)
    if fields:
        result.chunks += 1
        result.chunk_times.append(now)
        result.token_fields += [f for f in fields if f not in result.token_fields]
        if result.t_first is None:
            result.t_first, result.wall_first_s = now, wall
        result.t_last, result.wall_last_s = now, wall


def _count(usage: dict, name: str) -> int | None:
    """A token count of usage: a whole number from 0 to MAX_COUNT, else None."""
    value = usage.get(name)
    return value if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_COUNT else None


def _detail(usage: dict, section: str, name: str) -> int | None:
    details = usage.get(section)
    return _count(details, name) if isinstance(details, dict) else None


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
