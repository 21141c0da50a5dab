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


# The exit code of every command given bad input (a flag, a rig, catalog or inventory file): one line
# per problem on stderr, nothing done, no rig reached (docs/configuration.md, "Bad input").
CONFIG_ERROR = 2

VALUE_SHOWN_CHARS = 80  # a value longer than this is cut in messages (a 50 MB scalar is not echoed)


def shown(value: Any, limit: int = VALUE_SHOWN_CHARS) -> str:
    """A value as an error message shows it: its repr (one line: a newline shows as \\n), cut to
    `limit` characters with an ellipsis and the full length."""
    text = repr(value)
    if len(text) <= limit:
        return text
    size = f"{len(value)} characters" if isinstance(value, str) else f"{len(text)} characters as text"
    return f"{text[:limit]}... ({size})"


UNSHOWN = ("Cc", "Cf", "Zl", "Zp")  # control and format characters, line and paragraph separators


def one_line(text: str, limit: int = 200) -> str:
    """Free text (an exception's, a server's) for a one-line message: control and format characters (a
    terminal's escape sequences, a right-to-left override, a line break) escaped, cut to `limit`. Only what
    is shown is escaped: escaping never shortens, so the first `limit` characters are enough."""
    import unicodedata

    shown = "".join(c if unicodedata.category(c) not in UNSHOWN else repr(c)[1:-1] for c in text[:limit])
    return shown if len(text) <= limit and len(shown) <= limit else f"{shown[:limit]}... ({len(text)} characters)"


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
