"""`rigkit tune INVENTORY --rig NAME --model NAME ...`: the command around the sweep.

Order of events: every option and file is checked, the rig is read (nvidia-smi, NVML offsets),
every cell is screened (driver ranges, PSU budget); only then is anything applied. The sweep
restores the rig at the end, on an error and on Ctrl-C; the dead man's switch on the rig
restores it if this process disappears. `--hold` measures the setting in force and changes nothing.
"""

from __future__ import annotations

import argparse
import re
import sys
from dataclasses import dataclass

from rigkit.config.errors import shown
from rigkit.config.output_path import OutputPathError, output_file
from rigkit.tune.grid import GridError, parse_objective, parse_repeats, parse_threshold, parse_values, parse_workload
from rigkit.tune.inputs import TuneInputError

DEADMAN_MIN_S = 5


def ascii_int(text: str) -> int:
    """A whole number in ASCII digits: int() also reads '٣' (Arabic-Indic three), which nobody means here."""
    if not re.fullmatch(r"-?[0-9]{1,30}", text.strip()):
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number (ASCII digits)")
    return int(text)


def add_parser(commands) -> None:
    p = commands.add_parser("tune", help="measure power limits, clock locks and offsets live; propose the best")
    p.add_argument("inventory")
    p.add_argument("--rig", required=True, help="the rig's inventory name")
    p.add_argument("--model", required=True, help="a model the rig serves (its catalog name)")
    p.add_argument("--power-limits", default="", help="W per GPU: 200:350:25 or 200,250,300")
    p.add_argument("--clock-locks", default="", help="lock ceilings in MHz, `none` for unlocked: none,1800,2100")
    p.add_argument("--mem-offsets", default="", help="NVML memory clock offsets in MHz: 0,1800,3600")
    p.add_argument("--core-offsets", default="", help="NVML graphics clock offsets in MHz: 0,100")
    p.add_argument("--repeats", default="4", help="measurements per cell (even; odd is rounded up)")
    p.add_argument("--objective", default="efficiency", help="decode, response-time or efficiency")
    p.add_argument("--keep", default="0.95", help="efficiency: the share of the best decode to keep (0.95 or 95%%)")
    p.add_argument("--workload", help="response-time: input/output tokens per request, e.g. 8000/640")
    p.add_argument("--prompt-tokens", type=ascii_int, default=512, help="per measurement")
    p.add_argument("--output-tokens", type=ascii_int, default=128, help="per measurement")
    p.add_argument("--deadman-s", type=ascii_int, default=0,
                   help="the rig restores its policy this long after the last cell began (default: 60 s + 3x a measurement)")
    p.add_argument("--write", action="store_true", help="apply the proposed change to the rig file (comments kept)")
    p.add_argument("--json", help="write the result here (default: results/<rig>/<model>/tune-<time>.json, + .png)")
    p.add_argument("--hold", action="store_true", help="measure the setting in force --repeats times; change nothing")
    p.set_defaults(func=main)


@dataclass(frozen=True)
class Options:
    power_limits: tuple
    clock_locks: tuple
    mem_offsets: tuple
    core_offsets: tuple
    repeats: int
    objective: str
    keep: float
    workload: object


def parse_options(args) -> Options:
    try:
        options = Options(
            parse_values("--power-limits", args.power_limits) if args.power_limits else (),
            parse_values("--clock-locks", args.clock_locks, allow_unlocked=True) if args.clock_locks else (),
            parse_values("--mem-offsets", args.mem_offsets, allow_negative=True) if args.mem_offsets else (),
            parse_values("--core-offsets", args.core_offsets, allow_negative=True) if args.core_offsets else (),
            parse_repeats(args.repeats), parse_objective(args.objective), parse_threshold(args.keep),
            parse_workload(args.workload) if args.workload else None)
    except GridError as exc:
        raise TuneInputError(str(exc)) from None
    if options.objective == "response-time" and options.workload is None:
        raise TuneInputError("--objective response-time needs --workload INPUT/OUTPUT tokens per request, e.g. 8000/640")
    if not args.hold and not any((options.power_limits, options.clock_locks, options.mem_offsets, options.core_offsets)):
        raise TuneInputError("nothing to sweep: give --power-limits, --clock-locks, --mem-offsets or --core-offsets "
                             "(or --hold to measure the setting in force)")
    for name in ("prompt_tokens", "output_tokens"):
        if not 1 <= getattr(args, name) <= 200_000:
            raise TuneInputError(f"--{name.replace('_', '-')} {getattr(args, name)}: give 1-200000 tokens")
    if args.deadman_s and args.deadman_s < DEADMAN_MIN_S:
        raise TuneInputError(f"--deadman-s {args.deadman_s}: at least {DEADMAN_MIN_S} s (a cell must fit inside it)")
    if args.hold and args.write:
        raise TuneInputError("--hold changes nothing, so there is nothing to --write")
    try:
        output_file("--json", args.json)  # before the run: a sweep is never lost to a path it cannot write
    except OutputPathError as exc:
        raise TuneInputError(str(exc)) from None
    return options


def _host(inventory: str, name: str):
    from rigkit.config.inventory import RigConfigError, load_inventory

    try:
        hosts = list(load_inventory(inventory))
    except RigConfigError as exc:  # one line: the file, the line of it that raised, the error
        raise TuneInputError(str(exc)) from None
    names = [h.name for h in hosts]
    for host in hosts:
        if host.name == name:
            return host
    raise TuneInputError(f"--rig {shown(name)}: not in {inventory}; its rigs: {', '.join(names) or 'none'}")


def _field_range(spec, name: str) -> tuple[int, int]:
    """The bounds the rig file's schema gives a field (its pydantic Ge and Le)."""
    bounds = {type(m).__name__: m for m in spec.model_fields[name].metadata}
    return bounds["Ge"].ge, bounds["Le"].le


def _within_what_the_rig_file_allows(options, rig, model) -> None:
    """Each swept value within the range the rig file itself would accept (rigkit.config.schema, read from
    it) and, for a GPU model rigkit knows, its power-limit range; refused before SSH. The rig's own ranges
    are read again on the rig before anything is applied."""
    from rigkit.config import gpu_models
    from rigkit.config.schema import CLOCK_LOCK_CEILING_MHZ, ClockOffsets, GpuSpec

    def check(option: str, values, low: int, high: int, unit: str, whose: str = "") -> None:
        outside = [v for v in values if v is not None and not low <= v <= high]
        if outside:
            raise TuneInputError(f"{option}: {outside[0]} {unit} is outside {low}-{high} {unit}{whose}")
    check("--power-limits", options.power_limits, *_field_range(GpuSpec, "power_limit_w"), "W")
    check("--clock-locks", options.clock_locks, *CLOCK_LOCK_CEILING_MHZ, "MHz")
    check("--mem-offsets", options.mem_offsets, *_field_range(ClockOffsets, "memory"), "MHz")
    check("--core-offsets", options.core_offsets, *_field_range(ClockOffsets, "graphics"), "MHz")
    for gpu in (g for g in rig.spec.gpus if g.index in model.spec.gpus):
        if known := gpu_models.lookup(gpu.model):
            check("--power-limits", options.power_limits, known.power_min_w, known.power_max_w, "W",
                  f", the power-limit range of GPU {gpu.index} ({known.name})")


def main(args: argparse.Namespace) -> int:
    from rigkit.config.inventory import RigConfigError, rig_config, run_options, ssh_target

    try:
        options = parse_options(args)
        host = _host(args.inventory, args.rig)
        rig = rig_config(host)
        if rig.spec.os != "linux":
            raise TuneInputError(f"rig {args.rig} ({rig.file}) is a {rig.spec.os} rig; `rigkit tune` drives Linux rigs")
        model = next((m for m in rig.models if m.name == args.model), None)
        if model is None:
            raise TuneInputError(f"--model {shown(args.model)}: rig {args.rig} ({rig.file}) serves "
                                 f"{', '.join(m.name for m in rig.models) or 'no models'}")
        _within_what_the_rig_file_allows(options, rig, model)
        target = ssh_target(host)
        results_dir = run_options(host).results_dir
    except (TuneInputError, RigConfigError) as exc:  # a bad option, rig file or inventory value: one line
        print(f"rigkit tune: {exc}", file=sys.stderr)
        return 2
    from rigkit.tune.session import run_session

    _ctrl_c_to_main_greenlet()
    return run_session(args, options, rig, model, target, results_dir)


def _ctrl_c_to_main_greenlet() -> None:
    """Reading the inventory imports pyinfra_cli, which patches the standard library with gevent:
    paramiko's transport and the port forwards then run as greenlets in this one thread, and
    Python raises KeyboardInterrupt in whichever greenlet runs when Ctrl-C arrives. Raised in the
    transport's, it ends the SSH connection without a word, and the restore that should follow
    waits on a dead connection. So Ctrl-C is delivered to the main greenlet only, where the
    sweep's `finally` restores the rig."""
    import signal

    import greenlet

    main = greenlet.getcurrent()

    def interrupt(signum, frame):
        if greenlet.getcurrent() is main:
            raise KeyboardInterrupt
        import gevent

        gevent.get_hub().loop.run_callback(main.throw, KeyboardInterrupt)

    signal.signal(signal.SIGINT, interrupt)
