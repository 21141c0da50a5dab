"""pyinfra facts about the serving stacks on a Linux rig."""

from __future__ import annotations

import shlex

from pyinfra.api import FactBase

from rigkit.plumbing.rig_reads import DOCKER_S, bounded
from rigkit.rigside.names import PROJECT_PREFIX
from rigkit.rigside.stack import PROVEN_COMPOSE_FILE, PROVEN_SETTINGS_FILE, WANTED_COMPOSE_FILE, WANTED_SETTINGS_FILE


class RigkitStacks(FactBase):
    """Each vLLM stack rigkit manages on the rig: whether its wanted files (compose.next.yml,
    stack.next.json) are the last ones proven ready (compose.yml, stack.json) -- `pending`
    when not, as after an interrupted or failed rollout -- and how many of its containers run.

    Returns {name: {"pending": bool, "running": int, "created": seconds since the epoch of its oldest
    running container's creation, or None}}: a container created before its weights volume was completed
    serves the weights the volume held then (roles/serving.py restarts it).
    """

    def command(self, stacks_dir: str) -> str:
        # One `docker ps` for every stack (its containers carry Compose's project label): a
        # `docker compose ps` per stack costs a Compose start-up each, about 150 ms. None at all
        # on a rig without stacks (a Docker CLI start is ~40 ms of the rig's CPU).
        return (
            "asked=0; "
            f"for d in {shlex.quote(stacks_dir)}/*/; do "
            f'[ -f "$d/{WANTED_SETTINGS_FILE}" ] || [ -f "$d/{PROVEN_SETTINGS_FILE}" ] || continue; n=$(basename "$d"); '
            '[ "$asked" = 1 ] || { asked=1; running=$(' + bounded('docker', DOCKER_S) + ' ps --filter label=com.docker.compose.project '
            "--format '{{.Label \"com.docker.compose.project\"}} {{.CreatedAt}}' 2>/dev/null); }; "
            f'p=0; {{ cmp -s "$d/{PROVEN_COMPOSE_FILE}" "$d/{WANTED_COMPOSE_FILE}" '
            f'&& cmp -s "$d/{PROVEN_SETTINGS_FILE}" "$d/{WANTED_SETTINGS_FILE}"; }} '
            "2>/dev/null || p=1; "
            f'mine=$(printf "%s\\n" "$running" | grep "^{PROJECT_PREFIX}$n "); '
            'r=$(printf "%s" "$mine" | grep -c .); c=$(printf "%s\\n" "$mine" | sort -k2 | head -n 1 | cut -d" " -f2-); '
            'echo "$n $p $r ${c:--}"; done'
        )

    def process(self, output) -> dict:
        stacks = {}
        for line in output:
            name, pending, running, created = line.split(" ", 3)
            stacks[name] = {"pending": pending == "1", "running": int(running), "created": _docker_time(created)}
        return stacks


def _docker_time(text: str) -> float | None:
    """`docker ps`'s CreatedAt ("2026-12-03 16:53:42 +0000 UTC") as seconds since the epoch; None for "-"."""
    from datetime import datetime

    try:
        return datetime.strptime(text.strip().rsplit(" ", 1)[0], "%Y-%m-%d %H:%M:%S %z").timestamp()
    except ValueError:
        return None


class P2pVerdicts(FactBase):
    """The keys of the P2P checks passed on the rig (rigkit.rigside.p2p keeps one file per key in
    `verdict_dir`): a model spanning GPUs whose key is among them is not checked again.

    Returns a set of keys (hex); an empty set where the folder does not exist.
    """

    @staticmethod
    def default() -> set:
        return set()  # pyinfra's answer when the command printed nothing: no folder, or an empty one

    def command(self, verdict_dir: str) -> str:
        return f"ls -1 {shlex.quote(verdict_dir)} 2>/dev/null; true"

    def process(self, output) -> set:
        return {line[:-5] for line in output if line.endswith(".json") and len(line) == 69}
