"""pyinfra fact: is a model's weights volume complete and the source's copy? Read-only.

Runs the copier's `check` (templates/weights/rigkit-copy.py) on the rig itself, as root,
against the volume's mountpoint: it reads the completion marker, the manifest and the
source's metadata (paths, sizes, mtimes; never file contents) and starts no container,
so planning a deploy (`--dry` too) changes nothing and costs one short command. Where the
mountpoint is not reachable from the rig's shell (Docker Desktop keeps volumes inside its
VM) or python3 is missing, it says `unreachable` and the copy operation checks through a
helper container instead.
"""

from __future__ import annotations

import json
import shlex

from pyinfra.api import FactBase

from rigkit.render import template_text
from rigkit.weights.layout import source_layout


class WeightsVolumeState(FactBase):
    """{"status": "unchanged" | "needed" | "missing" | "unreachable" | "error", ...} where
    `error` carries the copier's reason (a missing or empty source, a dangling symlink)."""

    def command(self, volume: str, source: str) -> str:
        root, inside = source_layout(source)
        src = shlex.quote(f"{root}/{inside}" if inside != "." else source)
        script = shlex.quote(template_text("weights/rigkit-copy.py"))
        missing, unreachable = shlex.quote('{"status": "missing"}'), shlex.quote('{"status": "unreachable"}')
        return (
            f"mp=$(timeout 30 docker volume inspect --format '{{{{.Mountpoint}}}}' {shlex.quote(volume)} 2>/dev/null)"
            f" || {{ echo {missing}; exit 0; }}; "
            f'if [ -d "$mp" ] && command -v python3 >/dev/null; then '
            f'python3 -c {script} check {src} "$mp" {shlex.quote(root)}; '
            f"else echo {unreachable}; fi; exit 0"
        )

    def process(self, output) -> dict:
        lines = [line for line in output if line.strip()]
        try:
            return json.loads(lines[-1])
        except (IndexError, ValueError):
            return {"status": "error", "error": "unreadable answer from the rig: " + " ".join(lines)[-300:]}
