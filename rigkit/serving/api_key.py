"""The API key every vLLM server on a rig requires: read on the control machine from the rig's
`api_key_file`, refused unless private to its owner, and written to the rig as an env file
that Compose reads in `raw` format, so the key reaches the container byte for byte
(`$`, quotes, `#` and spaces included)."""

from __future__ import annotations

import stat
from pathlib import Path

import yaml

from rigkit.config.schema import RigConfig
from rigkit.config.yamlfile import read_small_file
from rigkit.rigside.keyfile import API_KEY_ENV_NAME

MAX_KEY_FILE_BYTES = 4096  # one key on one line; /dev/zero or a log file is not a key file


class SecretFileError(Exception):
    pass


def read_key_file(path: Path | str, what: str) -> str:
    """One key from a private file: the file's text without its final newline. `what` names
    where the path came from, for the error."""
    path = Path(path).expanduser()
    try:
        mode = path.stat().st_mode
        if not stat.S_ISREG(mode):
            raise SecretFileError(f"{what} {path} is not a regular file; give the path of a file (mode 600) "
                                  "holding the key")
        data = read_small_file(path, MAX_KEY_FILE_BYTES)
    except FileNotFoundError:
        raise SecretFileError(f"{what} {path} does not exist; create it (mode 600) or remove the field") from None
    except OSError as exc:
        raise SecretFileError(f"{what} {path} cannot be read: {exc.strerror or exc}") from None
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise SecretFileError(f"{what} {path} is readable by others; run chmod 600 {path}")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise SecretFileError(f"{what} {path} is not UTF-8 text") from None
    key = text[:-1] if text.endswith("\n") else text
    key = key[:-1] if key.endswith("\r") else key
    if not key:
        raise SecretFileError(f"{what} {path} is empty; it must hold the key on one line")
    if any(ord(c) < 32 or ord(c) == 127 for c in key):
        raise SecretFileError(f"{what} {path} must hold one key on one line (no line breaks or control characters)")
    if not key.isascii():
        # vLLM compares the Authorization header with the key; HTTP header values are ASCII.
        raise SecretFileError(f"{what} {path}: the key has characters outside ASCII; an HTTP header "
                              "(Authorization: Bearer) cannot carry them")
    if key != key.strip():
        # HTTP drops spaces around a header value, so such a key could never be sent.
        raise SecretFileError(f"{what} {path}: the key starts or ends with a space; remove it")
    return key


def api_key_path(rig: RigConfig) -> Path | None:
    """The rig's `api_key_file`: `~` expanded, and a relative path taken from the rig file's folder
    (as the catalog is found beside it), whatever the current directory."""
    if not rig.spec.api_key_file:
        return None
    return Path(rig.file).parent / Path(rig.spec.api_key_file).expanduser()


def read_api_key(rig: RigConfig) -> str | None:
    """The rig's API key from its `api_key_file` (mode 600), or None when the rig has none."""
    path = api_key_path(rig)
    if path is None:
        return None
    return read_key_file(path, f"{rig.file}: api_key_file")


def read_accepted_keys(rig: RigConfig, key: str) -> list[str]:
    """Every key the rig's vLLM servers accept during a rotation: `key` (api_key_file's, the one sent) and
    those of `accept_api_key_files`, sorted, so that swapping which one is sent changes nothing here.
    Empty when the rig names no other key: then the servers take `key` alone, from the env file."""
    extra = []
    for n, name in enumerate(rig.spec.accept_api_key_files):
        what = f"{rig.file}: accept_api_key_files[{n}]"
        other = read_key_file(Path(rig.file).parent / Path(name).expanduser(), what)
        if other == key or other in extra:
            raise SecretFileError(f"{what} {name} holds a key listed already (api_key_file's or another's); "
                                  "list each other key once")
        extra.append(other)
    if not extra:
        return []
    for accepted in (key, *extra):
        if accepted.startswith("-"):
            # vLLM reads its keys as the arguments of --api-key: one starting with - would be an option.
            raise SecretFileError(f"{rig.file}: a key accepted during a rotation starts with '-', which vLLM would "
                                  "read as an option; use a key that does not")
    return sorted({key, *extra})


def accepted_keys_config(keys: list[str]) -> bytes:
    """The vLLM config file (`vllm serve --config`, YAML) that gives the servers every accepted key:
    vLLM takes a list as `--api-key K1 K2`, inside its own process, never on a command line or in a log
    (its log of the arguments redacts api_key)."""
    return yaml.safe_dump({"api-key": list(keys)}, default_flow_style=False).encode()


def api_key_env_file(key: str) -> bytes:
    """The rig's env file. Compose reads it with `format: raw` (see compose.yml.j2): the value
    is the rest of the line, never interpolated or unquoted; rigkit-stack reads it the same way."""
    return f"{API_KEY_ENV_NAME}={key}\n".encode()
