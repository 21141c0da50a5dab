"""Errors written for the person at the rig: where, what, and what is allowed."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class Problem:
    file: Path
    field: str
    value: Any
    message: str
    line: int | None = None

    def __str__(self) -> str:
        where = str(self.file)
        if self.line is not None:
            where += f", line {self.line}"
        what = f"{self.field}: " if self.field else ""
        value = "" if self.value is None else f"{shown(self.value)}: "
        return f"{where}: {what}{value}{self.message}"


VALUE_SHOWN_CHARS = 80  # a value longer than this is cut in messages (a 50 MB scalar is not echoed)


def shown(value: Any, limit: int = VALUE_SHOWN_CHARS) -> str:
    """A value as an error message shows it: its repr (one line: a newline shows as \\n), cut to
    `limit` characters with an ellipsis and the full length."""
    text = repr(value)
    if len(text) <= limit:
        return text
    size = f"{len(value)} characters" if isinstance(value, str) else f"{len(text)} characters as text"
    return f"{text[:limit]}... ({size})"


def one_line(text: str, limit: int = 200) -> str:
    """Free text (an exception's) for a one-line message: control characters escaped, cut to `limit`."""
    import re

    text = re.sub(r"[\x00-\x1f\x7f\x85\u2028\u2029]", lambda m: repr(m.group())[1:-1], text)
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"


class ConfigError(Exception):
    """The rig or model configuration is invalid; nothing has been touched."""

    def __init__(self, problems: list[Problem]):
        self.problems = list(problems)
        super().__init__(self.render())

    def render(self) -> str:
        """One problem: one line. Several: a head line, then one line each."""
        count = len(self.problems)
        if count == 1:
            return f"configuration problem (nothing was changed on any rig): {self.problems[0]}"
        head = f"{count} configuration problem{'s' if count != 1 else ''} (nothing was changed on any rig):"
        return "\n".join([head, *(f"  - {p}" for p in self.problems)])
