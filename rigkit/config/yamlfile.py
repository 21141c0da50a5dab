"""Read a YAML file strictly, keeping the line of every value for error messages.

PyYAML silently keeps the last of two equal keys; a repeated key in a rig file
is almost always a typo, so it is an error here.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from rigkit.config.errors import ConfigError, Problem

Location = tuple[str | int, ...]
MAX_DEPTH = 32  # a rig file nests 4 levels; a deeper document is not one


def load_yaml(path: Path) -> tuple[Any, dict[Location, int]]:
    """Return the document and a map from field location to 1-based line number."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError([Problem(path, "", None, f"cannot read the file: {exc.strerror}")]) from None
    except UnicodeDecodeError as exc:
        line = path.read_bytes()[: exc.start].count(b"\n") + 1
        raise ConfigError([Problem(path, "", None, f"not UTF-8 text (byte {exc.object[exc.start]:#04x} at offset "
                                                   f"{exc.start}); save the file as UTF-8", line)]) from None
    try:
        # One parse: the node tree keeps each value's line, and the data is built from it
        # (what yaml.safe_load does, parsing the text a second time).
        loader = yaml.SafeLoader(text)
        try:
            root = loader.get_single_node()
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
        if _depth(root) > MAX_DEPTH:
            raise ConfigError([Problem(path, "", None, f"nested more than {MAX_DEPTH} levels deep; "
                                                       "not a rig or model file")])
        _walk(root, (), lines, problems, path)
    if problems:
        raise ConfigError(problems)
    return data, lines


def _depth(root: yaml.Node) -> int:
    """Nesting depth, without recursion (a hostile file must not exhaust the stack here)."""
    deepest, stack = 0, [(root, 1)]
    while stack:
        node, depth = stack.pop()
        deepest = max(deepest, depth)
        if depth > MAX_DEPTH:
            break
        if isinstance(node, yaml.MappingNode):
            stack.extend((v, depth + 1) for _, v in node.value)
        elif isinstance(node, yaml.SequenceNode):
            stack.extend((v, depth + 1) for v in node.value)
    return deepest


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
