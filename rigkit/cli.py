"""The `rigkit` command.

    rigkit check RIG_FILE [RIG_FILE ...] [--catalog DIR]   validate rig files offline
    rigkit deploy INVENTORY [--limit RIG] [--verify-weights] [--no-verify] [--accept-slower MODEL] [--dry] [PYINFRA_FLAGS]
                                                           pyinfra -y INVENTORY deploy.py
    rigkit status INVENTORY [--limit RIG] [--json FILE]   read every rig's state (changes nothing), report drift
    rigkit rollout INVENTORY [--deploy FILE] [--accept-slower MODEL] [PYINFRA_FLAGS]   deploy one rig at a time, stop at the first failure
    rigkit verify INVENTORY [--limit NAME] [PYINFRA_FLAGS]  benchmark each served model, check GPUs under load
    rigkit bench --url URL --model NAME [...]              benchmark any OpenAI-compatible server
    rigkit tune INVENTORY --rig NAME --model NAME [--power-limits 200:350:25 ...] [--hold] [--write]
                                                           measure GPU settings live on a loaded model; propose one
    rigkit windows-bundle RIG_FILE --out DIR               scheduled tasks + scripts + install.ps1 for a Windows rig
    rigkit gateway-config INVENTORY                        print the LiteLLM config of the inventory's gateway

PYINFRA_FLAGS, passed to pyinfra as they are: --diff, -v/-vv/-vvv, --serial or --parallel N.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

from rigkit.config.defaults import DEFAULT_CATALOG_DIR
from rigkit.config.errors import CONFIG_ERROR
from rigkit.plumbing import pyinfra_command

# What each command does lives in its feature's package (docs/architecture.md, "The command line"); here
# are its arguments, pyinfra's command line for deploy and verify, and the call. The rig file schema,
# pyinfra and everything else heavy is imported by the command that needs it, not here.


def check(args: argparse.Namespace) -> int:
    """Each rig file, offline: rigkit/preflight/rig_file_check.py."""
    from rigkit.config.loader import default_catalog_dir
    from rigkit.preflight.rig_file_check import check_rig_file

    passed = [check_rig_file(rig_file, args.catalog or default_catalog_dir(Path(rig_file)), args.topology,
                             _windows_rules) for rig_file in args.rig_files]
    return 0 if all(passed) else CONFIG_ERROR


def _windows_rules(rig) -> None:
    """A Windows rig's task time limits, for `rigkit check` (rigkit.windows is imported only by Windows
    files and this front door)."""
    if rig.spec.os == "windows":
        from rigkit.windows.commands import check_task_time_limits

        check_task_time_limits(rig)


def deploy(args: argparse.Namespace) -> int:
    """deploy.py on the inventory's rigs: pyinfra's command line, run here (rigkit/plumbing/pyinfra_command.py)."""
    from rigkit.config.inventory import accept_slower_data
    from rigkit.preflight.inventory_check import reached_rigs

    names = reached_rigs("deploy", args.inventory, args.limit, whole_fleet=True, accept_slower=args.accept_slower)
    if isinstance(names, int):
        return names
    # `-y` skips pyinfra's confirmation prompt, and with it the change detection that `--dry`
    # is for; a dry run exits before the prompt.
    command = ["--dry"] if args.dry else ["-y"]
    if args.verify_weights:
        command += ["--data", "rigkit_weights_verify=1"]
    if args.no_verify:
        if args.accept_slower:
            print("rigkit deploy: --accept-slower with --no-verify: without verification there is no rollout gate "
                  "to accept a slower config past; leave one of them out", file=sys.stderr)
            return CONFIG_ERROR
        command += ["--data", "rigkit_verify=never"]
    command += accept_slower_data(args.accept_slower)
    return _run_entry(command, args, "deploy")


def verify(args: argparse.Namespace) -> int:
    """verify.py on the inventory's rigs, run as deploy runs deploy.py."""
    from rigkit.preflight.inventory_check import reached_rigs

    names = reached_rigs("verify", args.inventory, args.limit, whole_fleet=True)
    if isinstance(names, int):
        return names
    return _run_entry(["-y", "--data", "rigkit_verify=always"], args, "verify")


def _run_entry(command: list[str], args: argparse.Namespace, entry: str) -> int:
    """pyinfra with `command`, the rig `--limit`, the pass-through flags and the inventory, on `entry`.py."""
    if args.limit:
        command = [*command, "--limit", args.limit]
    return pyinfra_command.run_here(command + pyinfra_flags(args) + [args.inventory, f"{entry}.py"], entry)


def status(args: argparse.Namespace) -> int:
    """Every rig read at once, nothing changed: rigkit/status/fleet.py."""
    from rigkit.config.output_path import OutputPathError, output_file
    from rigkit.preflight.inventory_check import reached_rigs
    from rigkit.status.fleet import fleet_status

    names = reached_rigs("status", args.inventory, args.limit, whole_fleet=False)
    if isinstance(names, int):
        return names
    try:
        json_path = output_file("--json", args.json)
    except OutputPathError as exc:
        print(f"rigkit status: {exc}", file=sys.stderr)
        return CONFIG_ERROR
    return fleet_status(args.inventory, names, args.limit, json_path)


def rollout(args: argparse.Namespace) -> int:
    """One rig at a time, stopping at the first failure: rigkit/gateway/rollout.py."""
    from rigkit.gateway.rollout import rollout as roll_out
    from rigkit.preflight.inventory_check import reached_rigs

    deploy_file = Path(args.deploy)
    if not deploy_file.is_file() or deploy_file.suffix != ".py":
        print(f"rigkit rollout: --deploy {args.deploy!r}: no such deploy file; give a pyinfra deploy .py file "
              "(default deploy.py, in the current directory)", file=sys.stderr)
        return CONFIG_ERROR
    names = reached_rigs("rollout", args.inventory, None, whole_fleet=True, accept_slower=args.accept_slower)
    if isinstance(names, int):
        return names
    return roll_out(args.inventory, names, args.deploy, args.accept_slower, pyinfra_flags(args))


def bench(args: argparse.Namespace) -> int:
    """Any OpenAI-compatible server: rigkit/verify/bench_command.py."""
    from rigkit.verify.bench_command import bench as run_bench_command

    return run_bench_command(args)


def windows_bundle(args: argparse.Namespace) -> int:
    """The offline install folder of a Windows rig: rigkit/windows/commands.py."""
    from rigkit.windows.commands import windows_bundle as write_bundle_folder

    return write_bundle_folder(args.rig_file, args.out, args.catalog)


def gateway_config(args: argparse.Namespace) -> int:
    """The LiteLLM config of the inventory's gateway, offline: no rig is reached (rigkit/gateway/config.py)."""
    from rigkit.config.inventory import RigConfigError
    from rigkit.gateway.config import inventory_config

    try:
        config = inventory_config(args.inventory)
    except RigConfigError as exc:
        print(f"rigkit gateway-config: {exc}", file=sys.stderr)
        return CONFIG_ERROR
    if config is None:
        print(f"rigkit gateway-config: no host of {args.inventory} has `gateway` data; add it to the host "
              "that runs the gateway (docs/gateway.md)", file=sys.stderr)
        return CONFIG_ERROR
    print(config, end="")
    return 0


def add_pyinfra_flags(parser: argparse.ArgumentParser) -> None:
    """pyinfra's own flags that `rigkit deploy`, `verify` and `rollout` pass through as they are."""
    flags = parser.add_argument_group("pyinfra's flags, passed through")
    flags.add_argument("--diff", action="store_true", help="show the differences of each changed text file")
    flags.add_argument("-v", dest="verbose", action="count", default=0,
                       help="pyinfra's verbosity: -v meta, -vv input, -vvv output of each command")
    order = flags.add_mutually_exclusive_group()
    order.add_argument("--serial", action="store_true", help="run operations host by host")
    order.add_argument("--parallel", type=int, metavar="N", help="run operations on at most N hosts at once")


def pyinfra_flags(args: argparse.Namespace) -> list[str]:
    """The pass-through flags as pyinfra's command line takes them."""
    flags = ["--diff"] if args.diff else []
    if args.verbose:
        flags.append("-" + "v" * args.verbose)
    if args.serial:
        flags.append("--serial")
    if args.parallel is not None:
        flags += ["--parallel", str(args.parallel)]
    return flags


def _number(kind, low, high, unit: str = "", low_open: bool = False):
    """An argparse type: a number of `kind` from `low` to `high` (above `low` when `low_open`),
    finite, written in ASCII digits; the message names the value and the range."""
    def parse(text: str):
        from rigkit.config.errors import shown

        pattern = r"[+-]?[0-9]{1,12}" if kind is int else r"[+-]?([0-9]{1,12}(\.[0-9]*)?|\.[0-9]+)([eE][+-]?[0-9]{1,3})?"
        value = kind(text) if re.fullmatch(pattern, text.strip()) else None
        inside = value is not None and (low < value if low_open else low <= value) and value <= high
        if not inside:
            what = "a whole number" if kind is int else "a number"
            bound = f"above {low:g}" if low_open else f"from {low:g}"
            raise argparse.ArgumentTypeError(f"{shown(text)}: give {what} {bound} to {high:g}{unit} (ASCII digits)")
        return value
    return parse


def _text(what: str, limit: int = 256):
    """An argparse type: 1 to `limit` characters, none of them a control character."""
    def parse(text: str) -> str:
        from rigkit.config.errors import shown

        if not text or len(text) > limit or re.search(r"[\x00-\x1f\x7f]", text):
            raise argparse.ArgumentTypeError(f"{shown(text)}: give {what} (1-{limit} characters, no control characters)")
        return text
    return parse


class _Parser(argparse.ArgumentParser):
    """argparse with its errors on one line: `rigkit bench: argument --timeout: 'nan': ...`, exit 2."""

    def error(self, message: str):
        self.exit(CONFIG_ERROR, f"{self.prog}: {message} (see {self.prog} --help)\n")


def main(argv: list[str] | None = None) -> int:
    from rigkit.tune.command import add_parser as add_tune_parser
    from rigkit.verify.bench_command import MAX_CONCURRENCY, MAX_TOKENS

    parser = _Parser(prog="rigkit", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    check_parser = commands.add_parser("check", help="validate rig files and their model catalog entries")
    check_parser.add_argument("rig_files", nargs="+")
    check_parser.add_argument("--catalog", help="model catalog folder (default: ../models beside the rig file's "
                              f"folder, else {DEFAULT_CATALOG_DIR})")
    check_parser.add_argument("--topology", metavar="FACT_OUTPUT",
                              help="a saved output of the topology fact's command (docs/topology.md): print each "
                              "multi-GPU model's links, P2P and vLLM flags; its errors fail the check")
    check_parser.set_defaults(func=check)
    deploy_parser = commands.add_parser("deploy", help="run deploy.py on every rig of an inventory")
    deploy_parser.add_argument("inventory")
    deploy_parser.add_argument("--verify-weights", action="store_true",
                               help="re-hash every weights volume against its manifest; copy again what differs")
    deploy_parser.add_argument("--limit", help="only this rig (inventory name or glob)")
    deploy_parser.add_argument("--no-verify", action="store_true",
                               help="skip the benchmark and GPU checks after a deploy that changed the rig "
                               "(and with them the rollout gate: a new serving config is promoted once ready)")
    deploy_parser.add_argument("--accept-slower", action="append", metavar="MODEL", type=_text("a model name", 63),
                               help="promote this model's new serving config even when the rollout gate finds it "
                               "slower (recorded in the result's provenance); repeat for several models")
    deploy_parser.add_argument("--dry", action="store_true",
                               help="only read: show what would change, change nothing on any rig")
    add_pyinfra_flags(deploy_parser)
    deploy_parser.set_defaults(func=deploy)
    rollout_parser = commands.add_parser("rollout", help="deploy one rig at a time, stop at the first failure")
    rollout_parser.add_argument("inventory")
    rollout_parser.add_argument("--deploy", default="deploy.py")
    rollout_parser.add_argument("--accept-slower", action="append", metavar="MODEL", type=_text("a model name", 63),
                                help="as for deploy: each rig's rollout gate promotes this model's slower config")
    add_pyinfra_flags(rollout_parser)
    rollout_parser.set_defaults(func=rollout)
    verify_parser = commands.add_parser("verify", help="benchmark each served model and check GPUs under load")
    verify_parser.add_argument("inventory")
    verify_parser.add_argument("--limit", help="only this rig (inventory name)")
    add_pyinfra_flags(verify_parser)
    verify_parser.set_defaults(func=verify)
    status_parser = commands.add_parser("status", help="read every rig's state without changing it; report drift")
    status_parser.add_argument("inventory")
    status_parser.add_argument("--limit", help="only this rig (inventory name or glob)")
    status_parser.add_argument("--json", help="write the whole report here")
    status_parser.set_defaults(func=status)
    bench_parser = commands.add_parser("bench", help="benchmark any OpenAI-compatible server, no rig config needed")
    bench_parser.add_argument("--url", required=True, help="base URL, e.g. http://127.0.0.1:8000")
    bench_parser.add_argument("--model", required=True, type=_text("the served model name"),
                              help="the served model name")
    bench_parser.add_argument("--prompt-tokens", type=_number(int, 1, MAX_TOKENS, " tokens"), default=512)
    bench_parser.add_argument("--output-tokens", type=_number(int, 1, MAX_TOKENS, " tokens"), default=128)
    bench_parser.add_argument("--concurrency", help=f"extra concurrency levels, e.g. 4,8 (single stream always runs; "
                              f"each 1-{MAX_CONCURRENCY})")
    bench_parser.add_argument("--timeout", type=_number(float, 0, 86_400, " s", low_open=True), default=120.0,
                              help="per request, seconds")
    bench_parser.add_argument("--expect-decode", type=_number(float, 0, 1e6, " tok/s", low_open=True),
                              help="fail below this decode tok/s")
    bench_parser.add_argument("--api-key-file", help="file holding the server's API key")
    bench_parser.add_argument("--ca-file", help="an https server's CA (a rigkit gateway's ca.pem); default: the system's")
    bench_parser.add_argument("--roofline-tok-s", type=_number(float, 0, 1e6, " tok/s", low_open=True),
                              help="memory-bandwidth bound on decode; a rate far above it fails as a burst")
    bench_parser.add_argument("--draft-tokens", type=_number(int, 1, 16, " tokens"),
                              help="num_speculative_tokens, for acceptance length from servers without num_drafts")
    bench_parser.add_argument("--endpoint", choices=("completions", "chat"), default="completions",
                              help="/v1/completions (default) or /v1/chat/completions, for chat-only servers and gateways")
    bench_parser.add_argument("--json", help="write the result here")
    bench_parser.set_defaults(func=bench)
    add_tune_parser(commands)
    bundle_parser = commands.add_parser("windows-bundle", help="offline install folder for a Windows rig")
    bundle_parser.add_argument("rig_file")
    bundle_parser.add_argument("--out", required=True)
    bundle_parser.add_argument("--catalog", help="model catalog folder (default as for check)")
    bundle_parser.set_defaults(func=windows_bundle)
    gateway_parser = commands.add_parser("gateway-config", help="print the LiteLLM config of the inventory's gateway "
                                         "(offline; no rig is reached)")
    gateway_parser.add_argument("inventory")
    gateway_parser.set_defaults(func=gateway_config)
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
