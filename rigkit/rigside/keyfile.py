"""Reading a key from an env file on the rig, as Docker Compose reads it in `raw` format: the value
is everything after the first `NAME=` up to the end of its line, byte for byte (`$`, quotes, `#`
and spaces included). The vLLM servers' API key and the gateway's keys are kept this way.
And checking a request's key as vLLM checks it: `Authorization: Bearer <key>`, exactly."""

from __future__ import annotations

import hmac
import os

from .names import ACCEPTED_KEYS_ENV, ACCEPTED_KEYS_FILE

API_KEY_ENV_NAME = "VLLM_API_KEY"


def compose_env(accepted_keys_file: str = ACCEPTED_KEYS_FILE) -> dict:
    """The environment of a `docker compose` command for a model's stack: during a key rotation, the keys
    every server accepts (the root-only file), for the compose file's secret that takes them from the
    environment. Compose copies them into the container: nothing on the rig's disk is bind-mounted."""
    env = dict(os.environ)
    try:
        with open(accepted_keys_file, encoding="utf-8") as file:
            env[ACCEPTED_KEYS_ENV] = file.read()
    except FileNotFoundError:
        pass
    return env


def env_value(path: str, name: str) -> str | None:
    """The value of `name` in the env file at `path`, or None when no line sets it.
    An unreadable file raises OSError: the caller says what that means for it."""
    prefix = f"{name}="
    with open(path, encoding="utf-8") as f:
        for line in f:
            if line.startswith(prefix):
                return line[len(prefix):].rstrip("\n")
    return None


def api_key(settings: dict | None, unreadable_is_none: bool = True) -> str | None:
    """The API key a stack's settings or the watchdog's config point at (`api_key_env_file`, and
    `api_key_env_name`, VLLM_API_KEY when absent); None when they name no file. An unreadable
    file is None too, unless `unreadable_is_none` is False (then OSError)."""
    path = (settings or {}).get("api_key_env_file")
    if not path:
        return None
    try:
        return env_value(path, (settings or {}).get("api_key_env_name") or API_KEY_ENV_NAME)
    except OSError:
        if unreadable_is_none:
            return None
        raise


def authorized(header: str | None, key: str) -> bool:
    """Whether an Authorization header carries `key` as vLLM's API server wants it (the header equal
    to "Bearer <key>"), compared in constant time."""
    return header is not None and hmac.compare_digest(header.encode("utf-8", "surrogateescape"),
                                                      f"Bearer {key}".encode("utf-8", "surrogateescape"))
