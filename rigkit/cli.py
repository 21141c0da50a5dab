"""The `rigkit` command: what can be done without pyinfra's inventory.

    rigkit check RIG_FILE [RIG_FILE ...] [--catalog DIR]   validate rig files offline
"""

from __future__ import annotations

import argparse
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="rigkit", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    check_parser = commands.add_parser("check", help="validate rig files and their model catalog entries")
    check_parser.add_argument("rig_files", nargs="+")
    check_parser.add_argument("--catalog", default=DEFAULT_CATALOG_DIR, help="model catalog folder")
    check_parser.set_defaults(func=check)
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
