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
        value = "" if self.value is None else f"{self.value!r}: "
        return f"{where}: {what}{value}{self.message}"


class ConfigError(Exception):
    """The rig or model configuration is invalid; nothing has been touched."""

    def __init__(self, problems: list[Problem]):
        self.problems = list(problems)
        super().__init__(self.render())

    def render(self) -> str:
        count = len(self.problems)
        head = f"{count} configuration problem{'s' if count != 1 else ''} (nothing was changed on any rig):"
        return "\n".join([head, *(f"  - {p}" for p in self.problems)])
