"""pyinfra facts about the serving stacks on a Linux rig."""

from __future__ import annotations

import shlex

from pyinfra.api import FactBase

from rigkit.rigread import DOCKER_S, bounded
from rigkit.rigside.names import PROJECT_PREFIX


class RigkitStacks(FactBase):
    """Each vLLM stack rigkit manages on the rig: whether its wanted files (compose.next.yml,
    stack.next.json) are the last ones proven ready (compose.yml, stack.json) -- `pending`
    when not, as after an interrupted or failed rollout -- and how many of its containers run.

    Returns {name: {"pending": bool, "running": int}}.
    """

    def command(self, stacks_dir: str) -> str:
        # One `docker ps` for every stack (its containers carry Compose's project label): a
        # `docker compose ps` per stack costs a Compose start-up each, about 150 ms. None at all
        # on a rig without stacks (a Docker CLI start is ~40 ms of the rig's CPU).
        return (
            "asked=0; "
            f"for d in {shlex.quote(stacks_dir)}/*/; do "
            '[ -f "$d/stack.next.json" ] || [ -f "$d/stack.json" ] || continue; n=$(basename "$d"); '
            '[ "$asked" = 1 ] || { asked=1; running=$(' + bounded('docker', DOCKER_S) + ' ps --filter label=com.docker.compose.project '
            "--format '{{.Label \"com.docker.compose.project\"}}' 2>/dev/null); }; "
            'p=0; { cmp -s "$d/compose.yml" "$d/compose.next.yml" && cmp -s "$d/stack.json" "$d/stack.next.json"; } '
            "2>/dev/null || p=1; "
            f'r=$(printf "%s\\n" "$running" | grep -cx "{PROJECT_PREFIX}$n"); '
            'echo "$n $p $r"; done'
        )

    def process(self, output) -> dict:
        stacks = {}
        for line in output:
            name, pending, running = line.split()
            stacks[name] = {"pending": pending == "1", "running": int(running)}
        return stacks
