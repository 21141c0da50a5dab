"""pyinfra facts the preflight reads. Read-only, POSIX shell only (a bare OS may have no python3).
The driver's (NvidiaDriver) lives with the GPU facts, rigkit.gpu.facts."""

from __future__ import annotations

import shlex

from pyinfra.api import FactBase

from rigkit.gpu.facts import NvidiaDriver  # noqa: F401 (the driver fact lives with the GPU facts)
from rigkit.plumbing.rig_reads import DOCKER_S, bounded


class DockerDiskFree(FactBase):
    """Free bytes where Docker keeps its volumes: `docker info`'s root dir (/var/lib/docker where
    Docker is not installed yet), measured on its nearest existing folder.
    Returns {"dir": str, "free_bytes": int | None}."""

    def command(self) -> str:
        return (
            f"d=$({bounded('docker', DOCKER_S)} info --format '{{{{.DockerRootDir}}}}' 2>/dev/null) || d=; "
            '[ -n "$d" ] || d=/var/lib/docker; [ -d "$d/volumes" ] && d="$d/volumes"; p="$d"; n=0; '
            'while [ ! -e "$p" ] && [ $n -lt 64 ]; do p=$(dirname "$p"); n=$((n+1)); done; '
            'echo "dir=$d"; df -P -B1 "$p" 2>/dev/null | tail -n 1'
        )

    def process(self, output) -> dict:
        lines = list(output)
        folder = next((line[4:] for line in lines if line.startswith("dir=")), "/var/lib/docker")
        cells = lines[-1].split() if lines else []
        free = int(cells[3]) if len(cells) >= 4 and cells[3].isdigit() else None
        return {"dir": folder, "free_bytes": free}


class WeightsBytes(FactBase):
    """Bytes of a model's weights source (symlinks followed, as the copier reads them) and bytes
    already on its volume. Returns {"source_bytes": int | None, "volume_bytes": int}."""

    def command(self, source: str, volume: str) -> str:
        return (
            f"s=$(du -s -b -L -- {shlex.quote(source)} 2>/dev/null | cut -f1); echo \"source=$s\"; "
            f"mp=$({bounded('docker', DOCKER_S)} volume inspect --format '{{{{.Mountpoint}}}}' {shlex.quote(volume)} 2>/dev/null) "
            '&& [ -d "$mp" ] && echo "volume=$(du -s -b -- "$mp" 2>/dev/null | cut -f1)"; exit 0'
        )

    def process(self, output) -> dict:
        values = dict(line.split("=", 1) for line in output if "=" in line)
        source = values.get("source", "").strip()
        volume = values.get("volume", "").strip()
        return {"source_bytes": int(source) if source.isdigit() else None,
                "volume_bytes": int(volume) if volume.isdigit() else 0}
