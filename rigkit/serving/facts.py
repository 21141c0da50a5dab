"""pyinfra facts about the serving stacks on a Linux rig."""

from __future__ import annotations

from pyinfra.api import FactBase


class RigkitStacks(FactBase):
    """Each vLLM stack rigkit manages on the rig: whether its wanted compose file is
    what runs (`pending` when not), and how many of its containers are running.

    Returns {name: {"pending": bool, "running": int}}.
    """

    def command(self, stacks_dir: str) -> str:
        return (
            f'for d in {stacks_dir}/*/; do [ -f "$d/stack.json" ] || continue; n=$(basename "$d"); '
            'p=0; cmp -s "$d/compose.yml" "$d/compose.next.yml" 2>/dev/null || p=1; '
            'r=$(docker compose -p "rigkit-$n" ps --status running -q 2>/dev/null | wc -l); '
            'echo "$n $p $r"; done'
        )

    def process(self, output) -> dict:
        stacks = {}
        for line in output:
            name, pending, running = line.split()
            stacks[name] = {"pending": pending == "1", "running": int(running)}
        return stacks
