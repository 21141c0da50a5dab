"""`rigkit bench --url URL --model NAME ...`: benchmark any OpenAI-compatible server, no rig config
needed. Every input is checked before the first request (the URL, the concurrency levels, `--json`'s
folder, the API key file): bad input is one line and exit 2; a run with a failed check exits 1.
Light to import: the client (httpx) is loaded by the run that needs it."""

from __future__ import annotations

import argparse
import json
import re
import sys

from rigkit.config.errors import CONFIG_ERROR, shown
from rigkit.config.output_path import OutputPathError, output_file

MAX_CONCURRENCY = 256
MAX_TOKENS = 200_000  # as `rigkit tune`: a prompt is built in memory (1e9 tokens would be ~2.7 GB)


class BadInput(Exception):
    """A command-line value that cannot be used: one line for the person, exit code 2."""


def bench(args: argparse.Namespace) -> int:
    """The parsed `rigkit bench` arguments in, its exit code out: the table printed, the JSON written."""
    from rigkit.verify.client import run_bench
    from rigkit.verify.table import bench_table

    try:
        if problem := url_problem(args.url):
            raise BadInput(f"--url {shown(args.url)}: {problem}")
        scheme, _, rest = args.url.partition("://")
        url = f"{scheme.lower()}://{rest}"  # schemes are case-insensitive (RFC 3986); httpx wants lower case
        levels = tuple(c for c in positive_ints("--concurrency", args.concurrency) if c > 1)
        json_path = output_file("--json", args.json)
        api_key = _api_key(args.api_key_file)
        verify = _trust(args.ca_file, scheme.lower())
    except (BadInput, OutputPathError) as exc:
        print(f"rigkit bench: {exc}", file=sys.stderr)
        return CONFIG_ERROR
    result = run_bench(url, args.model, args.prompt_tokens, args.output_tokens, levels, args.timeout, api_key,
                       args.expect_decode, roofline_tok_s=args.roofline_tok_s,
                       draft_tokens_per_step=args.draft_tokens, endpoint=args.endpoint, verify=verify)
    print(bench_table(result))
    if json_path:
        json_path.write_text(json.dumps(result.to_json(), indent=2) + "\n")
    return 0 if result.passed else 1


def _api_key(path: str | None) -> str | None:
    """The key for `--api-key-file`, read by the same rules as a rig's key file."""
    if not path:
        return None
    from rigkit.serving.api_key import SecretFileError, read_key_file

    try:
        return read_key_file(path, "--api-key-file")
    except SecretFileError as exc:
        raise BadInput(str(exc)) from None


def _trust(path: str | None, scheme: str):
    """How an https server's certificate is checked: against `--ca-file` (a rigkit gateway's fleet CA, its
    ca.pem), else the system's CAs; the host name always."""
    if not path:
        return True
    if scheme != "https":
        raise BadInput(f"--ca-file {shown(path)}: the URL is not https; a CA checks only an https server")
    import ssl

    try:
        return ssl.create_default_context(cafile=path)
    except FileNotFoundError:
        raise BadInput(f"--ca-file {shown(path)}: no such file") from None
    except (ssl.SSLError, OSError, ValueError) as exc:
        raise BadInput(f"--ca-file {shown(path)}: not a PEM certificate file ({exc})") from None


def positive_ints(option: str, text: str | None) -> tuple[int, ...]:
    """`4,8` -> (4, 8): each a whole number from 1 to MAX_CONCURRENCY, or BadInput."""
    values = []
    for part in (text or "").split(",") if text else []:
        # ASCII digits only: int() also reads '٣' (Arabic-Indic three), which nobody means here.
        if not re.fullmatch(r"[0-9]{1,6}", part.strip()) or not 1 <= int(part) <= MAX_CONCURRENCY:
            raise BadInput(f"{option} {shown(text)}: {shown(part.strip())} is not a whole number from 1 to "
                           f"{MAX_CONCURRENCY} (ASCII digits, comma-separated, e.g. 4,8)")
        values.append(int(part))
    return tuple(values)


def url_problem(url: str) -> str | None:
    """Why `url` cannot be a server's base URL, or None."""
    from urllib.parse import urlsplit

    if re.search(r"[\s\x00-\x1f\x7f]", url):
        return "has a space, a line break or another control character"
    if not url.lower().startswith(("http://", "https://")):
        return "give the scheme too, e.g. http://127.0.0.1:8000"
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 (raises on a port out of range or not a number)
        import httpx

        httpx.URL(url)
    except Exception as exc:  # urllib and httpx each raise their own kind
        return f"not a URL ({exc}); e.g. http://127.0.0.1:8000 or http://[::1]:8000"
    if not parts.hostname:
        return "has no host; e.g. http://127.0.0.1:8000"
    if re.search(r"/v1/*$", parts.path):
        return ("ends in /v1: give the server's base URL (rigkit adds /v1/completions or /v1/chat/completions), "
                "e.g. http://127.0.0.1:8000")
    return None
