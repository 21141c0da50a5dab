"""What a server sends, made safe to hold and to print: read only up to a bound, its text printable,
and never with rigkit's own secrets in it.

- Bodies are read through `read_bounded`: a server (or anything between) can send a body of any size,
  and a gzip body of zeros grows a thousandfold when httpx decodes it; the client asks for no encoding
  (`Accept-Encoding: identity`, in rigkit.verify.client.http_client) and reads at most a bound of
  decoded bytes whatever it gets.
- Text from a server is shown through `printable`: control and format characters (a terminal's escape
  sequences, a right-to-left override) become visible escapes, the API key the request carried (a
  server may echo the Authorization header in its error) becomes "[redacted]", and it is cut short.
"""

from __future__ import annotations

import httpx

from rigkit.config.errors import one_line

MAX_BODY_BYTES = 1 << 20  # an error body, /version, one body sent instead of a stream
MAX_METRICS_BYTES = 16 << 20  # vLLM's /metrics is ~60 KB with one model; a fleet's gateway more
MAX_STREAM_BYTES = 64 << 20  # a stream of 32k tokens is ~10 MB of events
SHOWN_CHARS = 300
REDACTED = "[redacted]"


class TooLarge(ValueError):
    pass


def read_bounded(response: httpx.Response, limit: int = MAX_BODY_BYTES, strict: bool = False) -> bytes:
    """The decoded body up to `limit` bytes; with `strict`, TooLarge when there is more."""
    body = bytearray()
    for piece in response.iter_bytes():
        if len(body) + len(piece) > limit:
            if strict:
                raise TooLarge(f"a body of more than {limit:,} bytes")
            body += piece[:limit - len(body)]
            break
        body += piece
    return bytes(body)


def get_bounded(client: httpx.Client, url: str, limit: int, timeout: float) -> tuple[int, bytes]:
    """(status, body) of a GET whose body is at most `limit` bytes; httpx.HTTPError or TooLarge otherwise."""
    with client.stream("GET", url, timeout=timeout) as response:
        return response.status_code, read_bounded(response, limit, strict=True)


def secrets_of(client: httpx.Client) -> tuple[str, ...]:
    """The API key a client sends (its Authorization header), as a server could echo it back."""
    value = client.headers.get("authorization", "")
    key = value.partition(" ")[2].strip() if value.lower().startswith("bearer ") else value.strip()
    return tuple(s for s in (value.strip(), key) if len(s) >= 4)


def printable(text: str, secrets: tuple[str, ...] = (), limit: int = SHOWN_CHARS) -> str:
    """`text` as it may be shown: secrets redacted (before it is cut: a cut never shows part of one), then
    as every one-line message shows free text (rigkit.config.errors.one_line), at most `limit`."""
    for secret in sorted(secrets, key=len, reverse=True):
        text = text.replace(secret, REDACTED)
    return one_line(text, limit)
