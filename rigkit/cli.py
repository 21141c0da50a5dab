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
import json
import re
import subprocess
import sys
from pathlib import Path

from rigkit.config.defaults import DEFAULT_CATALOG_DIR

# pyinfra's command line, with rigkit's shorter start (rigkit/plumbing/pyinfra_start.py). The rig file
# schema and everything else heavy is imported by the command that needs it, not here.
PYINFRA = [sys.executable, "-m", "rigkit.plumbing.pyinfra_start"]
# Bad input of any command (a flag, a rig or catalog file, an inventory): one line, nothing done.
CONFIG_ERROR = 2


def check(args: argparse.Namespace) -> int:
    """Everything that can be known without reaching the rig: the files, the PSU budget at the
    reference boards' defaults, the API key file, and the preflight's offline part (each GPU
    model's architecture in each image; the driver minimum against base.driver_version)."""
    from rigkit.config.errors import ConfigError
    from rigkit.config.loader import load_rig
    from rigkit.gpu.policy import reference_budget_problems
    from rigkit.preflight.checks import offline_findings
    from rigkit.serving.api_key import SecretFileError, read_api_key

    failed = 0
    for rig_file in args.rig_files:
        catalog = args.catalog or default_catalog_dir(Path(rig_file))
        try:
            rig = load_rig(rig_file, catalog)
            _check_windows(rig)
        except ConfigError as exc:
            print(exc.render(), file=sys.stderr)
            failed += 1
            continue
        problems, notes = reference_budget_problems(rig.spec)
        preflight_problems, preflight_notes = offline_findings(rig)
        problems, notes = problems + preflight_problems, notes + preflight_notes
        try:
            read_api_key(rig)
        except SecretFileError as exc:
            problems.append(str(exc))
        for note in [*notes, *rig.warnings]:
            print(f"{rig_file}: warning: {note}", file=sys.stderr)
        if problems:
            print("\n".join(f"{rig_file}: {p}" for p in problems), file=sys.stderr)
            failed += 1
            continue
        if args.topology and _check_topology(rig, args.topology):
            failed += 1
            continue
        models = ", ".join(m.name for m in rig.models) or "no models"
        print(f"{rig_file}: ok ({rig.spec.os}, {len(rig.spec.gpus)} GPUs, {models}; catalog {catalog})")
    return CONFIG_ERROR if failed else 0


TOPOLOGY_FILE_BYTES = 1024 * 1024  # the topology fact's output for 8 GPUs is a few KiB


def _check_topology(rig, facts_file: str) -> bool:
    """Print the topology table and verdict of each multi-GPU model from a saved topology fact
    output (docs/topology.md); True when a verdict has errors."""
    from rigkit.config.errors import one_line, shown
    from rigkit.config.yamlfile import read_small_file
    from rigkit.topology.report import read_report
    from rigkit.topology.rig import render_verdict, rig_verdicts

    try:  # the rig files' reader: a regular file, bounded; a FIFO or a device is never read
        text = read_small_file(Path(facts_file), TOPOLOGY_FILE_BYTES).decode("utf-8")
    except OSError as exc:
        print(f"rigkit check: --topology {shown(facts_file)}: cannot read the file: {exc.strerror or exc}",
              file=sys.stderr)
        return True
    except UnicodeDecodeError as exc:
        print(f"rigkit check: --topology {shown(facts_file)}: not UTF-8 text (byte {exc.object[exc.start]:#04x} at "
              f"offset {exc.start}); give the topology fact's output as it was saved", file=sys.stderr)
        return True
    topo, notes = read_report(text.splitlines(), windows=rig.spec.os == "windows")
    if topo is None:  # one line: why the matrix could not be read
        print(f"{rig.file}: topology: no nvidia-smi topo -m read from {shown(facts_file)}: "
              f"{'; '.join(one_line(n) for n in notes) or 'not in the file'}", file=sys.stderr)
        return True
    for note in notes:
        print(f"{rig.file}: topology: not read: {one_line(note)}", file=sys.stderr)
    verdicts = rig_verdicts(rig, topo)
    for verdict in verdicts:
        print(render_verdict(verdict))
    if not verdicts:
        print(f"{rig.file}: topology: no model spans GPUs (tensor x pipeline 1); nothing to decide")
    return any(v.errors for v in verdicts)


def _check_windows(rig) -> None:
    """A Windows rig's bootstrap must fit its task's time limit: raise or print why not."""
    if rig.spec.os != "windows":
        return
    from rigkit.config.errors import ConfigError
    from rigkit.windows.timing import timing_findings

    errors, warnings = timing_findings(rig)
    if errors:
        raise ConfigError(errors)
    for warning in warnings:
        print(f"warning: {warning}", file=sys.stderr)


def default_catalog_dir(rig_file: Path) -> Path:
    """The catalog beside the rig file's folder (inventory/rigs/x.yml -> inventory/models), so
    `rigkit check` works from any directory; else the deploy's default, from the current one."""
    beside = rig_file.resolve().parent.parent / "models"
    return beside if rig_file.resolve().parent.name == "rigs" and beside.is_dir() else Path(DEFAULT_CATALOG_DIR)


def _hosts(inventory: str) -> list:
    """The inventory's hosts with their data (group_data included), read offline."""
    from rigkit.config.inventory import load_inventory

    return list(load_inventory(inventory))


def _refused(command: str, inventory: str, limit: str | None, whole_fleet: bool,
             accept_slower: list[str] | None = None) -> list[str] | int:
    """Everything about an inventory command that can be known offline, before pyinfra connects to any
    rig: the inventory loads, --limit selects a rig, each selected rig's files are valid (and, for a
    deploy or a verification, every rig's, which the gateway's config reads). The selected rigs' names,
    or CONFIG_ERROR after one line on stderr."""
    from rigkit.config.errors import shown
    from rigkit.config.inventory import RigConfigError, load_inventory, select_hosts, ssh_target, validate_host
    from rigkit.gateway.plan import gateway_plan

    try:
        loaded = load_inventory(inventory)
        selected = select_hosts(loaded, inventory, limit)
        rigs = {host.name: validate_host(host) for host in selected}
        for host in selected:
            ssh_target(host)  # the port and key file pyinfra would use
        if whole_fleet:
            gateway_plan(list(loaded), rigs)
    except RigConfigError as exc:
        print(f"rigkit {command}: {exc}", file=sys.stderr)
        return CONFIG_ERROR
    served = sorted({m.name for rig in rigs.values() for m in rig.models})
    unknown = [name for name in accept_slower or () if name not in served]
    for name in unknown:
        print(f"rigkit {command}: --accept-slower {shown(name)}: no rig this {command} reaches serves a model of "
              f"that name; models served: {', '.join(served) or 'none'}", file=sys.stderr)
    if unknown:
        return CONFIG_ERROR
    return [host.name for host in selected]


def gateway_config(args: argparse.Namespace) -> int:
    """The LiteLLM config of the inventory's gateway, offline: no rig is reached."""
    from rigkit.config.inventory import RigConfigError
    from rigkit.gateway.plan import gateway_plan
    from rigkit.gateway.config import render_config

    try:
        hosts = _hosts(args.inventory)
        plan = gateway_plan(hosts)
    except RigConfigError as exc:
        print(f"rigkit gateway-config: {exc}", file=sys.stderr)
        return CONFIG_ERROR
    if plan is None:
        print(f"rigkit gateway-config: no host of {args.inventory} has `gateway` data; add it to the host "
              "that runs the gateway (docs/gateway.md)", file=sys.stderr)
        return CONFIG_ERROR
    print(render_config(plan, drain=False), end="")
    return 0


def rollout(args: argparse.Namespace) -> int:
    """Rolling rollout: each rig gets the whole deploy (and its rollback) before the next starts; the
    first is the canary: a failure stops the rollout before the next rig. With a gateway in the
    inventory, each rig's replicas are drained from it first (bounded wait for their in-flight
    requests) and put back once the rig deployed. A rig that fails stays out, unless all that failed
    was the rollout gate refusing new configs, each rolled back to its last proven config and that
    verified (the deploy's outcome file says so): the rig then serves what it served before, proven,
    and is put back."""
    import tempfile

    from rigkit.config.inventory import RigConfigError
    from rigkit.gateway.plan import gateway_plan

    deploy_file = Path(args.deploy)
    if not deploy_file.is_file() or deploy_file.suffix != ".py":
        print(f"rigkit rollout: --deploy {args.deploy!r}: no such deploy file; give a pyinfra deploy .py file "
              "(default deploy.py, in the current directory)", file=sys.stderr)
        return CONFIG_ERROR
    names = _refused("rollout", args.inventory, None, whole_fleet=True, accept_slower=args.accept_slower)
    if isinstance(names, int):
        return names
    accepted = ["--data", f"rigkit_accept_slower={','.join(sorted(set(args.accept_slower)))}"] \
        if args.accept_slower else []
    try:
        plan = gateway_plan(_hosts(args.inventory))
    except RigConfigError as exc:
        print(f"rigkit rollout: {exc}", file=sys.stderr)
        return CONFIG_ERROR
    with tempfile.TemporaryDirectory(prefix="rigkit-rollout-") as outcomes:
        return _roll(args, names, plan, accepted, Path(outcomes))


def _roll(args: argparse.Namespace, names: list[str], plan, accepted: list[str], outcomes: Path) -> int:
    for position, name in enumerate(names, 1):
        print(f"rigkit rollout: rig {position}/{len(names)}: {name}", flush=True)
        drained = False
        if plan is not None and plan.replicas_of(name):
            code = _gateway(args.inventory, plan, "drain", name)
            if code not in (0, NOT_INSTALLED):
                print(f"rigkit rollout: STOPPED before {name}: the gateway could not drain it (nothing changed on "
                      f"{name}); rigs not started: {', '.join(names[position - 1:])}", file=sys.stderr)
                return 1
            drained = code == 0
        outcome = outcomes / f"{position}.json"
        command = [*PYINFRA, "-y", *accepted, "--data", f"rigkit_rollout_outcome={outcome}", *pyinfra_flags(args),
                   "--limit", name, args.inventory, args.deploy]
        if subprocess.run(command).returncode != 0:
            untouched = ", ".join(names[position:]) or "none"
            refused = _refused_and_proven(outcome, name)
            if refused is None:
                out = f"; {name} stays out of the gateway" if drained else ""
                print(f"rigkit rollout: STOPPED: {name} failed{out}; rigs not started: {untouched}", file=sys.stderr)
                return 1
            back = ""
            if drained:
                back = ("; it is back in the gateway" if _gateway(args.inventory, plan, "undrain", name) == 0
                        else "; the gateway did NOT take it back (see above)")
            print(f"rigkit rollout: STOPPED: the rollout gate refused {refused} on {name}, rolled back to the last "
                  f"proven config and verified{back}; rigs not started: {untouched}", file=sys.stderr)
            return 1
        if drained and _gateway(args.inventory, plan, "undrain", name) != 0:
            print(f"rigkit rollout: STOPPED: {name} deployed, but the gateway did not take it back", file=sys.stderr)
            return 1
    print(f"rigkit rollout: all {len(names)} rigs deployed")
    return 0


NOT_INSTALLED = 9  # the gateway helper is not on its rig yet (a first rollout) or not running: nothing to drain


def _refused_and_proven(outcome: Path, name: str) -> str | None:
    """The models the rollout gate refused on rig `name`, when its deploy's outcome file says every one was
    rolled back and verified and nothing else failed (roles/verify.py writes it last); else None."""
    try:
        said = json.loads(outcome.read_text())
    except (OSError, ValueError):
        return None  # not written: the deploy failed before or apart from the gate's refusals
    if not isinstance(said, dict) or said.get("rig") != name or said.get("serving_proven") is not True:
        return None
    return ", ".join(str(r.get("model")) for r in said.get("refused") or []) or None


def _gateway(inventory: str, plan, *action: str) -> int:
    """Run the rig-side gateway helper on the gateway's rig (pyinfra exec); its exit code, or
    NOT_INSTALLED."""
    import shlex

    from rigkit.rigside.names import GATEWAY_HELPER_PATH

    helper = " ".join(shlex.quote(part) for part in (GATEWAY_HELPER_PATH, *action))
    command = (f"if [ -x {GATEWAY_HELPER_PATH} ]; then {helper}; else echo 'rigkit-gateway: not installed yet; "
               f"nothing to drain'; exit {NOT_INSTALLED}; fi")
    run = subprocess.run([*PYINFRA, "-y", "--limit", plan.host, inventory, "exec", "--",
                          command], capture_output=True, text=True)
    said = [line.split("rigkit-gateway:", 1)[1].strip() for line in (run.stdout + run.stderr).splitlines()
            if "rigkit-gateway:" in line]
    for line in said:
        print(f"rigkit rollout: gateway on {plan.host}: {line}", flush=True)
    if run.returncode != 0 and not said:
        print(f"rigkit rollout: gateway on {plan.host}: `{' '.join(action)}` failed:\n"
              f"{(run.stdout + run.stderr)[-2000:]}", file=sys.stderr)
    # Not installed yet, or its container stopped: nothing is routed through it, so there is
    # nothing to drain (a stopped gateway must not block the rollout that may bring it back).
    if run.returncode != 0 and any("not installed yet" in line or "container is not running" in line
                                   for line in said):
        return NOT_INSTALLED
    return run.returncode or 0


class BadInput(Exception):
    """A command-line value that cannot be used: one line for the person, exit code 2."""


def _api_key(path: str | None) -> str | None:
    """The key for `rigkit bench --api-key-file`, read by the same rules as a rig's key file."""
    if not path:
        return None
    from rigkit.serving.api_key import SecretFileError, read_key_file

    try:
        return read_key_file(path, "--api-key-file")
    except SecretFileError as exc:
        raise BadInput(str(exc)) from None


MAX_CONCURRENCY = 256
MAX_TOKENS = 200_000  # as `rigkit tune`: a prompt is built in memory (1e9 tokens would be ~2.7 GB)


def _positive_ints(option: str, text: str | None) -> tuple[int, ...]:
    from rigkit.config.errors import shown

    values = []
    for part in (text or "").split(",") if text else []:
        # ASCII digits only: int() also reads '٣' (Arabic-Indic three), which nobody means here.
        if not re.fullmatch(r"[0-9]{1,6}", part.strip()) or not 1 <= int(part) <= MAX_CONCURRENCY:
            raise BadInput(f"{option} {shown(text)}: {shown(part.strip())} is not a whole number from 1 to "
                           f"{MAX_CONCURRENCY} (ASCII digits, comma-separated, e.g. 4,8)")
        values.append(int(part))
    return tuple(values)


def _url_problem(url: str) -> str | None:
    """Why `url` cannot be a server's base URL, or None."""
    from urllib.parse import urlsplit

    if re.search(r"[\s\x00-\x1f\x7f]", url):
        return "has a space, a line break or another control character"
    if not url.lower().startswith(("http://", "https://")):
        return "give the scheme too, e.g. http://127.0.0.1:8000"
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 (raises on a port out of range or not a number)
        import httpx

        httpx.URL(url)
    except Exception as exc:  # urllib and httpx each raise their own kind
        return f"not a URL ({exc}); e.g. http://127.0.0.1:8000 or http://[::1]:8000"
    if not parts.hostname:
        return "has no host; e.g. http://127.0.0.1:8000"
    if re.search(r"/v1/*$", parts.path):
        return ("ends in /v1: give the server's base URL (rigkit adds /v1/completions or /v1/chat/completions), "
                "e.g. http://127.0.0.1:8000")
    return None


def output_file(option: str, value: str | None) -> Path | None:
    """rigkit.config.output_path.output_file, its refusal as bad input (exit 2)."""
    from rigkit.config.output_path import OutputPathError
    from rigkit.config.output_path import output_file as checked

    try:
        return checked(option, value)
    except OutputPathError as exc:
        raise BadInput(str(exc)) from None


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
    def parse(text: str) -> str:
        from rigkit.config.errors import shown

        if not text or len(text) > limit or re.search(r"[\x00-\x1f\x7f]", text):
            raise argparse.ArgumentTypeError(f"{shown(text)}: give {what} (1-{limit} characters, no control characters)")
        return text
    return parse


def bench(args: argparse.Namespace) -> int:
    from rigkit.config.errors import shown
    from rigkit.verify.client import run_bench
    from rigkit.verify.table import bench_table

    try:
        if problem := _url_problem(args.url):
            raise BadInput(f"--url {shown(args.url)}: {problem}")
        scheme, _, rest = args.url.partition("://")
        args.url = f"{scheme.lower()}://{rest}"  # schemes are case-insensitive (RFC 3986); httpx wants lower case
        levels = tuple(c for c in _positive_ints("--concurrency", args.concurrency) if c > 1)
        json_path = output_file("--json", args.json)
        api_key = _api_key(args.api_key_file)
    except BadInput as exc:
        print(f"rigkit bench: {exc}", file=sys.stderr)
        return CONFIG_ERROR
    result = run_bench(args.url, args.model, args.prompt_tokens, args.output_tokens, levels, args.timeout, api_key,
                       args.expect_decode, roofline_tok_s=args.roofline_tok_s,
                       draft_tokens_per_step=args.draft_tokens, endpoint=args.endpoint)
    print(bench_table(result))
    if json_path:
        json_path.write_text(json.dumps(result.to_json(), indent=2) + "\n")
    return 0 if result.passed else 1


def deploy(args: argparse.Namespace) -> int:
    refused = _refused("deploy", args.inventory, args.limit, whole_fleet=True, accept_slower=args.accept_slower)
    if isinstance(refused, int):
        return refused
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
    if args.accept_slower:
        command += ["--data", f"rigkit_accept_slower={','.join(sorted(set(args.accept_slower)))}"]
    if args.limit:
        command += ["--limit", args.limit]
    return _pyinfra_here(command + pyinfra_flags(args) + [args.inventory, "deploy.py"], "deploy")


def verify(args: argparse.Namespace) -> int:
    refused = _refused("verify", args.inventory, args.limit, whole_fleet=True)
    if isinstance(refused, int):
        return refused
    command = ["-y", "--data", "rigkit_verify=always"]
    if args.limit:
        command += ["--limit", args.limit]
    return _pyinfra_here(command + pyinfra_flags(args) + [args.inventory, "verify.py"], "verify")


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


def _pyinfra_here(argv: list[str], command: str) -> int:
    """pyinfra's command line, in this process when it can be (a second Python start is ~0.1 s
    of a ~1.5 s converged deploy); it ends this command, so it is the last thing `rigkit` does."""
    from rigkit.plumbing.pyinfra_start import main as pyinfra_main

    if not Path(argv[-1]).is_file():
        print(f"rigkit {command}: no {argv[-1]} in {Path.cwd()}: run `rigkit {command}` from the rigkit checkout "
              f"(its {argv[-1]} and roles/ are not in the installed package)", file=sys.stderr)
        return CONFIG_ERROR
    here = Path("rigkit")
    if here.is_dir() and here.resolve() != Path(__file__).resolve().parent:
        # This folder has its own rigkit (another checkout): deploy.py and roles/ come from here,
        # so rigkit must too. `python -m` puts this folder first on the import path.
        return subprocess.run([*PYINFRA, *argv]).returncode
    try:
        pyinfra_main(argv)
    except SystemExit as done:
        return done.code if isinstance(done.code, int) else (0 if done.code is None else 1)
    return 0


STATUS_DEADLINE_S = 120  # the whole `rigkit status` run; a rig past it is reported without an answer


def _decoded(data) -> str:
    return data.decode(errors="replace") if isinstance(data, bytes) else (data or "")


def status(args: argparse.Namespace) -> int:
    """Fleet status: status.py on every rig at once (read-only), one table per rig, one JSON document."""
    import tempfile
    import time
    from datetime import datetime, timezone

    from rigkit.status.collect import document_path
    from rigkit.status.report import unreachable
    from rigkit.status.table import status_table

    names = _refused("status", args.inventory, args.limit, whole_fleet=False)
    if isinstance(names, int):
        return names
    try:
        json_path = output_file("--json", args.json)
    except BadInput as exc:
        print(f"rigkit status: {exc}", file=sys.stderr)
        return CONFIG_ERROR
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="rigkit-status-") as folder:
        command = [*PYINFRA, "-y", "--data", f"rigkit_status_dir={folder}",
                   "--data", f"rigkit_status_inventory={args.inventory}"]
        if args.limit:
            command += ["--limit", args.limit]
        late = False
        try:  # every read on a rig is bounded (rigkit.plumbing.rig_reads); this bounds the whole run too
            run = subprocess.run(command + [args.inventory, "status.py"], capture_output=True, text=True,
                                 timeout=STATUS_DEADLINE_S)
        except subprocess.TimeoutExpired as expired:  # subprocess.run killed pyinfra
            late, run = True, subprocess.CompletedProcess(expired.cmd, 0, _decoded(expired.stdout), _decoded(expired.stderr))
        output = run.stdout + run.stderr
        now = datetime.now(timezone.utc)
        rigs = []
        for name in names:
            path = document_path(Path(folder), name)
            why = f"no answer within {STATUS_DEADLINE_S} s" if late else _why(output, name)
            rigs.append(json.loads(path.read_text()) if path.is_file() else unreachable(name, why, now))
    if all(not r["reachable"] for r in rigs) and "No hosts remaining" not in output and run.returncode != 0:
        print(output[-3000:], file=sys.stderr)  # not a connection problem: a config error, a bug
        return 2
    document = {"inventory": args.inventory, "checked_at": now.isoformat(timespec="seconds"),
                "wall_s": round(time.monotonic() - started, 2), "ok": all(r["ok"] for r in rigs), "rigs": rigs}
    for rig in rigs:
        print(status_table(rig) + "\n")
    drift = sum(len(r["drift"]) for r in rigs)
    failed = sum(len(r["failures"]) for r in rigs)
    print(f"rigkit status: {len(rigs)} rig(s), {sum(not r['reachable'] for r in rigs)} unreachable, "
          f"{drift} drift, {failed} failure(s) in {document['wall_s']:.1f} s")
    if json_path:
        json_path.write_text(json.dumps(document, indent=2) + "\n")
    return 0 if document["ok"] else 1


def _why(output: str, name: str) -> str:
    """pyinfra's own words about a rig it could not reach."""
    said = [line.strip() for line in output.splitlines() if f"[{name}]" in line and "Ready" not in line]
    return " ".join(said)[-400:] or "no answer (pyinfra did not reach it; run pyinfra with -v to see why)"


def windows_bundle(args: argparse.Namespace) -> int:
    from rigkit.config.errors import ConfigError
    from rigkit.config.loader import load_rig
    from rigkit.windows.bundle import write_bundle

    try:
        rig = load_rig(args.rig_file, args.catalog or default_catalog_dir(Path(args.rig_file)))
        if rig.spec.os != "windows":
            print(f"{args.rig_file}: os is {rig.spec.os}; the bundle is for Windows rigs", file=sys.stderr)
            return CONFIG_ERROR
        _check_windows(rig)
    except ConfigError as exc:
        print(exc.render(), file=sys.stderr)
        return CONFIG_ERROR
    out = Path(args.out)
    if problem := bundle_folder_problem(args.out):
        print(f"rigkit windows-bundle: --out {args.out!r}: {problem}", file=sys.stderr)
        return CONFIG_ERROR
    try:
        if out.exists() and not out.is_dir():
            raise NotADirectoryError("it is a file, not a folder")
        written = write_bundle(rig, out)
    except OSError as exc:
        reason = exc.strerror or str(exc)
        where = f" ({exc.filename})" if exc.filename and str(exc.filename) != str(out) else ""
        print(f"rigkit windows-bundle: cannot write the bundle to {out}: {reason}{where}; "
              "give --out a folder you can write to", file=sys.stderr)
        return 2
    for path in written:
        print(path)
    if rig.spec.gpu_policy == "remove":
        print(f"gpu_policy is remove: copy {args.out} to the rig and run uninstall.ps1 from an elevated PowerShell")
    else:
        print(f"copy {args.out} to the rig and run install.ps1 from an elevated PowerShell")
    return 0


def bundle_folder_problem(out: str) -> str | None:
    """Why `--out` cannot take a bundle, or None: it must be named, and be new, empty, or an earlier
    bundle (install.ps1 and scripts/ in it; write_bundle then replaces its stacks)."""
    from rigkit.windows.bundle import is_bundle

    if not out.strip() or re.search(r"[\x00-\x1f\x7f]", out):
        return "give the folder to write the bundle to (not empty, no control characters), e.g. --out bundle-win"
    folder = Path(out)
    if folder.is_dir() and any(folder.iterdir()) and not is_bundle(folder):
        return ("a folder with other files in it, not an earlier bundle (no install.ps1 and scripts/); give a new or "
                "empty folder")
    return None


class _Parser(argparse.ArgumentParser):
    """argparse with its errors on one line: `rigkit bench: argument --timeout: 'nan': ...`, exit 2."""

    def error(self, message: str):
        self.exit(CONFIG_ERROR, f"{self.prog}: {message} (see {self.prog} --help)\n")


def main(argv: list[str] | None = None) -> int:
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
    bench_parser.add_argument("--roofline-tok-s", type=_number(float, 0, 1e6, " tok/s", low_open=True),
                              help="memory-bandwidth bound on decode; a rate far above it fails as a burst")
    bench_parser.add_argument("--draft-tokens", type=_number(int, 1, 16, " tokens"),
                              help="num_speculative_tokens, for acceptance length from servers without num_drafts")
    bench_parser.add_argument("--endpoint", choices=("completions", "chat"), default="completions",
                              help="/v1/completions (default) or /v1/chat/completions, for chat-only servers and gateways")
    bench_parser.add_argument("--json", help="write the result here")
    bench_parser.set_defaults(func=bench)
    from rigkit.tune.command import add_parser as add_tune_parser

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
