"""A real completion from a vLLM server on the rig, with a deadline: readiness is a one-token
completion answered, never /health (which stays 200 while a stuck engine answers nothing)."""

from __future__ import annotations

import json
import socket
import ssl
import time
import urllib.error
import urllib.request


def pinned_context(chain_pem: str, where: str = "the chain") -> ssl.SSLContext:
    """For the gateway, whose certificate chain (PEM) rigkit deployed: trust exactly its first certificate,
    the leaf (OpenSSL's partial-chain flag), whatever name it is reached by (an SSH forward, this rig's
    loopback). Not the CA after it: another certificate of the same CA is not the one deployed. Used on
    the rig (pinned_file) and by the control machine's clients. Raises ssl.SSLError."""
    end = chain_pem.find("-----END CERTIFICATE-----")
    if end < 0:
        raise ssl.SSLError(f"{where} holds no certificate")
    context = ssl.create_default_context(cadata=chain_pem[:end + len("-----END CERTIFICATE-----")] + "\n")
    context.check_hostname = False
    context.verify_flags |= ssl.VERIFY_X509_PARTIAL_CHAIN
    return context


def pinned_file(chain_path: str) -> ssl.SSLContext:
    """pinned_context of the chain file rigkit deployed at `chain_path`. Raises OSError, ssl.SSLError."""
    with open(chain_path) as file:
        return pinned_context(file.read(), chain_path)


class NoAnswer(Exception):
    """No completion: str() is the cause's own words, `reason` its short form (URLError's reason),
    `http_status` the HTTP status when the server refused, `no_choices` when it answered without
    choices, `seconds` how long the attempt took, `timed_out` when the deadline passed with no answer
    (the request was in flight: a server that took it and said nothing, not one that refused it)."""

    def __init__(self, cause: BaseException, seconds: float, http_status: int | None = None,
                 no_choices: bool = False):
        super().__init__(str(cause))
        underlying = getattr(cause, "reason", cause)  # urllib wraps a connect or header timeout in URLError
        self.reason = str(underlying)
        self.seconds, self.http_status, self.no_choices = seconds, http_status, no_choices
        self.timed_out = isinstance(underlying, (socket.timeout, TimeoutError))


def complete_at(base_url: str, model: str, key: str | None, prompt: str, max_tokens: int, timeout_s: float,
                require_choices: bool = True, context=None):
    """One /v1/completions request to `base_url` (a server, or the gateway in front of several)
    answered within `timeout_s` (the bound on the connection and on each read), with choices unless
    `require_choices` is False: the response's headers. `context`: the ssl.SSLContext of an https
    URL (the gateway's). Raises NoAnswer."""
    body = json.dumps({"model": model, "prompt": prompt, "max_tokens": max_tokens}).encode()
    request = urllib.request.Request(f"{base_url}/v1/completions", data=body,
                                     headers={"Content-Type": "application/json"}, method="POST")
    if key:
        request.add_header("Authorization", f"Bearer {key}")
    started = time.monotonic()
    try:
        with urllib.request.urlopen(request, timeout=timeout_s, context=context) as response:
            data, headers = response.read(), response.headers
            payload = json.loads(data) if require_choices else {}
    except urllib.error.HTTPError as exc:
        raise NoAnswer(exc, time.monotonic() - started, http_status=exc.code) from None
    except (urllib.error.URLError, OSError, ValueError) as exc:
        raise NoAnswer(exc, time.monotonic() - started) from None
    if require_choices and not payload.get("choices"):
        raise NoAnswer(RuntimeError(f"completion without choices: {payload}"), time.monotonic() - started,
                       no_choices=True)
    return headers


def complete(port: int, served_model_name: str, key: str | None, prompt: str, max_tokens: int,
             timeout_s: float) -> float:
    """A completion from the model served on this rig's `port`: the seconds it took. Raises NoAnswer."""
    started = time.monotonic()
    complete_at(f"http://127.0.0.1:{int(port)}", served_model_name, key, prompt, max_tokens, timeout_s)
    return time.monotonic() - started


def one_token(port: int, served_model_name: str, key: str | None, timeout_s: float) -> float:
    """The readiness probe: a one-token completion within `timeout_s`. Raises NoAnswer."""
    return complete(port, served_model_name, key, "ping", 1, timeout_s)
