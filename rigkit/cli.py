"""The `rigkit` command.

    rigkit check RIG_FILE [RIG_FILE ...] [--catalog DIR]   validate rig files offline
    rigkit rollout INVENTORY [--deploy FILE]               deploy one rig at a time, stop at the first failure
"""

from __future__ import annotations

import argparse
import subprocess
import sys

from rigkit.config import load_rig
from rigkit.errors import ConfigError
from rigkit.hostconfig import DEFAULT_CATALOG_DIR


def check(args: argparse.Namespace) -> int:
    failed = 0
    for rig_file in args.rig_files:
        try:
            rig = load_rig(rig_file, args.catalog)
        except ConfigError as exc:
            print(exc.render(), file=sys.stderr)
            failed += 1
            continue
        models = ", ".join(m.name for m in rig.models) or "no models"
        print(f"{rig_file}: ok ({rig.spec.os}, {len(rig.spec.gpus)} GPUs, {models})")
    return 1 if failed else 0


def rig_names(inventory: str) -> list[str]:
    from pyinfra.api import State
    from pyinfra.context import ctx_state
    from pyinfra_cli.inventory import make_inventory

    with ctx_state.use(State()):
        return [host.name for host in make_inventory(inventory, cwd=".")]


def rollout(args: argparse.Namespace) -> int:
    """Rolling rollout: each rig gets the whole deploy (and its rollback) before the next starts."""
    names = rig_names(args.inventory)
    for position, name in enumerate(names, 1):
        print(f"rigkit rollout: rig {position}/{len(names)}: {name}", flush=True)
        command = [sys.executable, "-m", "pyinfra", "-y", "--limit", name, args.inventory, args.deploy]
        if subprocess.run(command).returncode != 0:
            untouched = ", ".join(names[position:]) or "none"
            print(f"rigkit rollout: STOPPED: {name} failed; rigs not started: {untouched}", file=sys.stderr)
            return 1
    print(f"rigkit rollout: all {len(names)} rigs deployed")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="rigkit", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    check_parser = commands.add_parser("check", help="validate rig files and their model catalog entries")
    check_parser.add_argument("rig_files", nargs="+")
    check_parser.add_argument("--catalog", default=DEFAULT_CATALOG_DIR, help="model catalog folder")
    check_parser.set_defaults(func=check)
    rollout_parser = commands.add_parser("rollout", help="deploy one rig at a time, stop at the first failure")
    rollout_parser.add_argument("inventory")
    rollout_parser.add_argument("--deploy", default="deploy.py")
    rollout_parser.set_defaults(func=rollout)
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
