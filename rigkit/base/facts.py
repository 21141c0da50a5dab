"""pyinfra facts the base role reads. Read-only, POSIX shell only."""

from __future__ import annotations

import shlex

from pyinfra.api import FactBase


class AptHolds(FactBase):
    """Packages held with `apt-mark hold`, as a set."""

    default = set

    def command(self) -> str:
        return "apt-mark showhold 2>/dev/null; exit 0"

    def process(self, output) -> set[str]:
        return {line.strip().split(":")[0] for line in output if line.strip()}


class TextFile(FactBase):
    """A small text file's content, or None where it does not exist."""

    def command(self, path: str) -> str:
        return f"if [ -f {shlex.quote(path)} ]; then echo present; cat {shlex.quote(path)}; else echo absent; fi"

    def process(self, output) -> str | None:
        lines = list(output)
        return "\n".join(lines[1:]) if lines and lines[0] == "present" else None


class SystemdUnitFile(FactBase):
    """Whether systemd knows a unit file of this name (installed, enabled or not)."""

    def command(self, unit: str) -> str:
        return f"systemctl list-unit-files --no-legend {shlex.quote(unit)} 2>/dev/null | grep -c . ; exit 0"

    def process(self, output) -> bool:
        lines = list(output)
        return bool(lines) and lines[-1].strip() not in ("", "0")
