"""Read a YAML file strictly, keeping the line of every value for error messages.

PyYAML silently keeps the last of two equal keys; a repeated key in a rig file
is almost always a typo, so it is an error here.

A hostile file is refused before anything walks it: only a regular file of at most
MAX_FILE_BYTES is read (not a FIFO, a device or a symlink to one), and the node tree is
measured with aliases expanded, without recursion, before the data is built (nine levels of
ten aliases are a billion values for any walk that follows them).
"""

from __future__ import annotations

import os
import re
import stat
from pathlib import Path
from typing import Any

import yaml

from rigkit.config.errors import ConfigError, Problem

Location = tuple[str | int, ...]
MAX_DEPTH = 32  # a rig file nests 4 levels; a deeper document is not one
MAX_FILE_BYTES = 1024 * 1024  # a rig or model file is a few KiB
MAX_NODES = 20_000  # values in the document with every alias expanded; a rig file has a few hundred


class _Loader(yaml.SafeLoader):
    """YAML 1.1's safe loader without its base-60 numbers: `power_limit_w: 4:40` is the text "4:40" (which
    the schema then refuses as not a number), not 280. Nobody writes a power limit in sexagesimal."""


# PyYAML's own int and float patterns (yaml/resolver.py) less their base-60 alternative.
_NO_BASE_60 = {
    "tag:yaml.org,2002:int": re.compile(r"""^(?:[-+]?0b[0-1_]+
                    |[-+]?0[0-7_]+
                    |[-+]?(?:0|[1-9][0-9_]*)
                    |[-+]?0x[0-9a-fA-F_]+)$""", re.X),
    "tag:yaml.org,2002:float": re.compile(r"""^(?:[-+]?(?:[0-9][0-9_]*)\.[0-9_]*(?:[eE][-+][0-9]+)?
                    |\.[0-9][0-9_]*(?:[eE][-+][0-9]+)?
                    |[-+]?\.(?:inf|Inf|INF)
                    |\.(?:nan|NaN|NAN))$""", re.X),
}
_Loader.yaml_implicit_resolvers = {
    first: [(tag, _NO_BASE_60.get(tag, regexp)) for tag, regexp in resolvers]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}


def read_small_file(path: Path, limit: int = MAX_FILE_BYTES) -> bytes:
    """The bytes of a regular file of at most `limit` bytes; OSError (with strerror) otherwise.
    Opened without blocking, so a FIFO neither hangs the open nor gets read."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            kind = "a folder" if stat.S_ISDIR(info.st_mode) else "a FIFO" if stat.S_ISFIFO(info.st_mode) else \
                "a device" if stat.S_ISCHR(info.st_mode) or stat.S_ISBLK(info.st_mode) else "a socket or special file"
            raise OSError(0, f"not a regular file ({kind}); give the path of a regular file", str(path))
        if info.st_size > limit:
            raise OSError(0, f"{info.st_size} bytes; at most {limit} bytes are read", str(path))
        os.set_blocking(fd, True)
        chunks, size = [], 0
        while chunk := os.read(fd, 65536):
            chunks.append(chunk)
            size += len(chunk)
            if size > limit:  # it grew while being read
                raise OSError(0, f"more than {limit} bytes; at most {limit} bytes are read", str(path))
        return b"".join(chunks)
    finally:
        os.close(fd)


def load_yaml(path: Path) -> tuple[Any, dict[Location, int]]:
    """Return the document and a map from field location to 1-based line number."""
    try:
        data_bytes = read_small_file(path)
        text = data_bytes.decode("utf-8")
    except OSError as exc:
        raise ConfigError([Problem(path, "", None, f"cannot read the file: {exc.strerror or exc}")]) from None
    except UnicodeDecodeError as exc:
        line = data_bytes[: exc.start].count(b"\n") + 1
        raise ConfigError([Problem(path, "", None, f"not UTF-8 text (byte {exc.object[exc.start]:#04x} at offset "
                                                   f"{exc.start}); save the file as UTF-8", line)]) from None
    try:
        # One parse: the node tree keeps each value's line, and the data is built from it
        # (what yaml.safe_load does, parsing the text a second time).
        loader = _Loader(text)
        try:
            root = loader.get_single_node()
            if root is not None:
                _check_size(root, path)
            data = loader.construct_document(root) if root is not None else None
        finally:
            loader.dispose()
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark else None
        what = " ".join(str(part) for part in (exc.context, exc.problem) if part)
        raise ConfigError([Problem(path, "", None, f"YAML syntax error: {what}", line)]) from None
    except yaml.YAMLError as exc:
        raise ConfigError([Problem(path, "", None, f"YAML error: {exc}")]) from None
    except RecursionError:
        # PyYAML recurses once per nesting level; no rig file nests more than a few levels.
        raise ConfigError([Problem(path, "", None, "nested too deeply to be a rig or model file")]) from None
    lines: dict[Location, int] = {}
    problems: list[Problem] = []
    if root is not None:
        _walk(root, (), lines, problems, path)
    if problems:
        raise ConfigError(problems)
    return data, lines


def _check_size(root: yaml.Node, path: Path) -> None:
    """Refuse a document deeper than MAX_DEPTH or of more than MAX_NODES values with its aliases
    expanded, without recursion and stopping at the first value over either bound: the walks
    that follow (line numbers, the data's validation) visit every expanded value."""
    count, stack = 0, [(root, 1)]
    while stack:
        node, depth = stack.pop()
        count += 1
        if depth > MAX_DEPTH:
            raise ConfigError([Problem(path, "", None, f"nested more than {MAX_DEPTH} levels deep; "
                                                       "not a rig or model file", node.start_mark.line + 1)])
        if count > MAX_NODES:
            raise ConfigError([Problem(path, "", None, f"more than {MAX_NODES} values with its aliases expanded "
                                                       "(an alias bomb?); a rig or model file has a few hundred",
                                       node.start_mark.line + 1)])
        if isinstance(node, yaml.MappingNode):
            stack.extend((v, depth + 1) for pair in node.value for v in pair)
        elif isinstance(node, yaml.SequenceNode):
            stack.extend((v, depth + 1) for v in node.value)


def _walk(node: yaml.Node, loc: Location, lines: dict, problems: list, path: Path) -> None:
    lines[loc] = node.start_mark.line + 1
    if isinstance(node, yaml.MappingNode):
        seen: dict[str, int] = {}
        for key_node, value_node in node.value:
            key = key_node.value
            line = key_node.start_mark.line + 1
            if key in seen:
                field = format_location(loc + (key,))
                problems.append(
                    Problem(path, field, None, f"key given twice (first on line {seen[key]}); keep one", line)
                )
            seen[key] = line
            _walk(value_node, loc + (key,), lines, problems, path)
    elif isinstance(node, yaml.SequenceNode):
        for index, item in enumerate(node.value):
            _walk(item, loc + (index,), lines, problems, path)


def format_location(loc: Location) -> str:
    """('gpus', 1, 'power_limit_w') -> 'gpus[1].power_limit_w'."""
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out
