"""The part of `rigkit tune` that reaches the rig: read, screen, sweep (or hold), restore, report."""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

from rigkit.gpu.nvsmi import parse_query, query_command
from rigkit.serving.api_key import SecretFileError, read_api_key
from rigkit.tune.inputs import TuneInputError, default_json, elapsed, grid_for, start_cell, write_json
from rigkit.tune.measure import BenchSettings, MeasurementError, hold, hold_text, measure_once
from rigkit.tune.remote import RemoteSampling, RigError, Shell, SshTuneRig, connect, install
from rigkit.tune.sweep import TuneError, plan_sweep, run_sweep


def _say(text: str) -> None:
    print(text, flush=True)


def run_session(args, options, rig, model, target, results_dir: Path) -> int:
    started = time.monotonic()
    gpus = tuple(model.spec.gpus)
    try:
        bench = BenchSettings(args.prompt_tokens, args.output_tokens, api_key=_api_key(rig))
        client = connect(target)
    except (RigError, SecretFileError, OSError) as exc:
        print(f"rigkit tune: {exc}", file=sys.stderr)
        return 1
    shell = Shell(client)
    try:
        install(shell)
        report = parse_query(shell.run(query_command()).splitlines())
        if report.error:
            raise RigError(f"nvidia-smi on the rig: {report.error}")
        probe = SshTuneRig(client, gpus, model.spec.port, model.name, bench, 60, None)
        reading = probe.read()
        start = start_cell(rig, gpus, reading)
        out = Path(args.json) if args.json else default_json(results_dir, rig.name, model.name, args.hold)
        context = {"rig": rig.name, "model": model.name, "gpus": list(gpus), "start": vars(start),
                   "prompt_tokens": args.prompt_tokens, "output_tokens": args.output_tokens}
        if args.hold:
            return _hold(client, shell, gpus, model, bench, options.repeats, out, context, started)
        probe.check_ready()
        plan = plan_sweep(grid_for(options, start), start, rig.spec, report, gpus, options.repeats,
                          probe.offset_ranges(reading))
        for refusal in plan.refused:
            _say(f"refused before applying {refusal.cell.label()}: {'; '.join(refusal.reasons)}")
        if not plan.cells:
            print("rigkit tune: every cell was refused; nothing applied", file=sys.stderr)
            return 2
        measure_s = args.prompt_tokens / 500 + args.output_tokens / 10 + 10  # pessimistic: a slow card
        deadman_s = args.deadman_s or int(60 + 3 * measure_s)
        _say(f"rigkit tune: {len(plan.cells)} cell(s), {len(plan.schedule)} measurements in mirrored order "
             f"(control: {start.label()}); dead man's switch {deadman_s} s")
        tune_rig = SshTuneRig(client, gpus, model.spec.port, model.name, bench, deadman_s, start)
        _Progress(tune_rig, len(plan.schedule))
        try:
            result = run_sweep(tune_rig, plan, options.workload, options.keep)
        except KeyboardInterrupt:
            _say(f"rigkit tune: interrupted; restored: {_restored_text(tune_rig)}")
            return 130
        _say(f"restored: {_restored_text(tune_rig)}")
        if not tune_rig.restored or tune_rig.restored.get("errors"):
            # The measurements are kept, but no setting is proposed or written from a rig whose
            # restore failed; its dead man's switch stays armed and retries the declared policy.
            args.write = False
            _report(args, rig, model, result, plan, context, out, started, tune_rig)
            print("rigkit tune: the rig's original settings were NOT all restored (see above); its dead "
                  "man's switch stays armed and re-applies the declared policy when it fires", file=sys.stderr)
            return 1
    except (RigError, MeasurementError, TuneError, TuneInputError) as exc:
        print(f"rigkit tune: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:  # before the sweep (or in --hold): nothing was applied
        print("rigkit tune: interrupted; no setting had been applied", file=sys.stderr)
        return 130
    finally:
        client.close()
    return _report(args, rig, model, result, plan, context, out, started, tune_rig)


class _Progress:
    """Prints each reading as it is taken: a sweep runs for minutes."""

    def __init__(self, tune_rig: SshTuneRig, total: int):
        measure, self.n, self.total = tune_rig.measure, 0, total

        def wrapped(cell):
            figures = measure(cell)
            self.n += 1
            _say(f"  [{self.n}/{total}] {cell.label()}: decode {figures.decode_tok_s:.2f} tok/s, "
                 f"prefill {figures.prefill_tok_s:.0f} tok/s"
                 + (f", {figures.mean_power_w:.0f} W" if figures.mean_power_w else ""))
            return figures

        tune_rig.measure = wrapped


def _restored_text(tune_rig: SshTuneRig) -> str:
    if not tune_rig.restored:
        return "restore did not report (the dead man's switch restores the policy on its own)"
    gpus = ", ".join(f"GPU {g['index']} {g['enforced_w']:.0f} W" for g in tune_rig.restored["gpus"])
    errors = tune_rig.restored.get("errors") or []
    if errors:
        return gpus + "; " + "; ".join(errors) + "; dead man's switch left armed"
    return gpus + "; dead man's switch disarmed"


def _hold(client, shell, gpus, model, bench, repeats, out, context, started) -> int:
    from rigkit.plumbing.ssh_forward import forward

    _say(f"rigkit tune --hold: {repeats} measurements of the setting in force; nothing is changed")
    with forward(client.get_transport(), model.spec.port) as port:
        result = hold(lambda: measure_once(f"http://127.0.0.1:{port}", model.name, RemoteSampling(shell, gpus), bench),
                      repeats, lambda n, f: _say(f"  [{n}/{repeats}] decode {f.decode_tok_s:.2f} tok/s"))
    _say(hold_text(result))
    write_json(out, {**context, "hold": result.to_json(), "wall_s": elapsed(started)})
    _say(f"result: {out}")
    return 0


def _report(args, rig, model, result, plan, context, out, started, tune_rig) -> int:
    from rigkit.config.errors import ConfigError
    from rigkit.tune.report import draw, table_text, to_json
    from rigkit.tune.rigfile import RigFileError, propose, write_copy

    _say(table_text(result, len(plan.schedule)))
    choice = result.choices.get(args.objective)
    document = to_json(result, {**context, "objective": args.objective, "wall_s": elapsed(started),
                                "apply_s": round(tune_rig.spent_applying_s, 2),
                                "measure_s": round(tune_rig.spent_measuring_s, 2),
                                "sampler_s": round(tune_rig.spent_sampling_s, 2)})
    write_json(out, document)
    draw(out.with_suffix(".png"), result, f"{rig.name} / {model.name}: rigkit tune")
    _say(f"result: {out} (+ .png)")
    if choice is None:
        _say(f"no choice for --objective {args.objective}: nothing measured in effect")
        return 1
    changes = {i: choice.cell for i in model.spec.gpus}
    try:
        change = propose(rig.file, changes)
        for note in change.notes:
            _say(f"note: {note}")
        if not change.diff:
            _say(f"the rig file already says {choice.cell.label()}: no change")
            return 0
        _say(change.diff)
        if args.write:
            catalog = rig.models[0].file.parent if rig.models else Path(".")
            # A copy under the same name (the rig's name is its file's), beside it: the same file system.
            with tempfile.TemporaryDirectory(prefix=".rigkit-tune-", dir=Path(rig.file).parent) as folder:
                copy = Path(folder) / Path(rig.file).name
                write_copy(rig.file, changes, copy, catalog)  # rigkit's loader accepts it, or nothing is written
                copy.replace(rig.file)
            _say(f"wrote {rig.file}; the next `rigkit deploy` persists it through the boot-time GPU policy")
        else:
            _say("rigkit tune: --write applies this change")
    except ConfigError as exc:
        print(f"rigkit tune: the rig file was not changed: {exc.render()}", file=sys.stderr)
        return 1
    except (RigFileError, OSError) as exc:
        print(f"rigkit tune: the rig file was not changed: {exc}", file=sys.stderr)
        return 1
    return 0


def _api_key(rig) -> str | None:
    return read_api_key(rig)
