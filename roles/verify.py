"""Role verify: benchmark each served model and check the GPUs under load.

Installs the telemetry sampler (rigkit/verify/telemetry.py, with a copy of pynvml.py
for rigs without nvidia-ml-py), then per model: starts the sampler on the rig
for the model's GPUs (on a Windows rig: the same sampler in a short-lived
container with GPU access, through Docker Desktop's Engine;
rigkit.verify.container_sampler), benchmarks the model from the control machine
through an SSH port forward (the server binds the rig's 127.0.0.1), stops the sampler,
brings its samples back and judges. Writes results/<rig>/<model>/<time>.json
and .png, prints a table, and fails the deploy when a check fails.

Runs when this deploy changed the rig (`after`), or `always` (`rigkit verify`).
"""

from __future__ import annotations

import io
import json
import shlex
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from pyinfra import host, logger
from pyinfra.api import deploy
from pyinfra.api.exceptions import OperationError
from pyinfra.operations import python

from rigkit.config.schema import ModelConfig, RigConfig
from rigkit.plumbing.facts_once import Read
from rigkit.plumbing.files import FileStates, put
from rigkit.plumbing.render import module_source
from rigkit.rigside import sampler, stack
from rigkit.rigside.metrics import verification_summary
from rigkit.rigside.names import (
    RUN_DIR,
    SAMPLER_NVML_DIR,
    SAMPLER_NVML_PATH,
    SAMPLER_PATH,
    VERIFY_SUMMARY_DIR,
)
from rigkit.serving.api_key import read_api_key
from rigkit.rigside.names import served_name
from rigkit.serving.compose import vllm_args
from rigkit.topology.decide import Verdict
from rigkit.topology.rig import compose_additions
from rigkit.plumbing.ssh_forward import forward
from rigkit.weights.engine import dial_command, rig_engine
from rigkit.plumbing.ssh import rig_call

if TYPE_CHECKING:
    from rigkit.verify.result import VerificationResult

# Defaults
PROMPT_TOKENS = 2048  # long enough that the SSH forward's latency is a small share of TTFT
OUTPUT_TOKENS = 256
REQUEST_TIMEOUT_S = 120
COMMAND_TIMEOUT_S = 60  # each short command of the sampler's start and stop
PROMOTE_TIMEOUT_S = 60  # rigkit-stack promote: a one-token probe (30 s at most) and two file copies
RESTART_TIMEOUT_S = 240  # rigkit-stack restart: `compose restart` (its own 120 s bound) and the warm-up, plus the ready timeout
UP_TIMEOUT_S = 1800  # rigkit-stack rollback: `compose up` (its own bound), then the ready timeout
TELEMETRY_FILES = (SAMPLER_PATH, SAMPLER_NVML_PATH)  # read in one command
SAMPLER_NAMES = {"nvml-host": "NVML sampler on the rig", "nvml-container": "NVML sampler in a container with GPU access"}


def verify_reads(rig: RigConfig) -> list[Read]:
    """What the role asks the rig while planning (deploy.py reads them ahead, all at once)."""
    return [(FileStates, {"paths": TELEMETRY_FILES})] if rig.models and rig.spec.os == "linux" else []


@deploy("Verify")
def verify(rig: RigConfig, results_dir: Path, always: bool = False, after=(), rollouts: dict | None = None,
           accept_slower: frozenset[str] = frozenset(), rollout_outcome: Path | None = None,
           topology: dict | None = None) -> None:
    """`after`: the deploy's operations; verification runs if any changed, or `always`.
    `rollouts`: {model: its rollout op} of a deploy whose rollouts hold a new config for the gate
    (roles/serving.py with gate=True): where one ran, the model is gated first; a gated model's
    verification is the gate's own runs. `accept_slower`: models whose gate waives speed.
    A refused model fails the deploy only after every model of the rig was gated or verified, so that
    no other model is left serving a candidate the gate never judged; `rollout_outcome` (set by
    `rigkit rollout`): where that last step writes what the refusals left serving (_refused).
    `topology`: the preflight's {model: Verdict}: what it added to a model's compose file is recorded
    in the result's provenance with the rest of its command line."""
    topology = topology or {}
    if not rig.models:
        return
    gated: set[str] = set()
    refusals: list[dict] = []
    installed = []
    if rig.spec.os == "linux":  # on Windows the sampler's container gets them through the Engine API
        paths = TELEMETRY_FILES
        installed = [
            put(name="Install the telemetry sampler", data=module_source("rigkit.verify.telemetry"),
                dest=SAMPLER_PATH, mode="755", batch=paths),
            put(name="Ship pynvml for rigs without nvidia-ml-py", data=module_source("pynvml"),
                dest=SAMPLER_NVML_PATH, mode="644", batch=paths),
        ]
    for model in rig.models:
        rolled = (rollouts or {}).get(model.name)
        if rolled is not None:
            python.call(
                name=f"Gate {model.name}: a new config against the last proven result, promoted or rolled back",
                function=rig_call(_gate_model), rig=rig, model=model, results_dir=results_dir,
                topology_verdict=topology.get(model.name),
                accept_slower=model.name in accept_slower, gated=gated, refusals=refusals, _if=rolled.did_change,
            )
        python.call(
            name=f"Verify {model.name}: benchmark and GPUs under load",
            function=rig_call(_verify_model), rig=rig, model=model, results_dir=results_dir,
            topology_verdict=topology.get(model.name),
            _if=lambda m=model.name: m not in gated and (always or any(op.did_change() for op in [*after, *installed])),
        )
    if rollouts:
        python.call(
            name="Rollout gate: fail the deploy for each refused model (rolled back)",
            function=rig_call(_refused), refusals=refusals, outcome=rollout_outcome, _if=lambda: bool(refusals),
        )


def _run(command: str) -> str:
    ok, output = host.run_shell_command(command=command, _timeout=COMMAND_TIMEOUT_S)
    text = "\n".join(output.stdout_lines + output.stderr_lines)
    if not ok:
        raise OperationError(f"on the rig, `{command}` failed: {text}")
    return text


def _measure(rig: RigConfig, model: ModelConfig, folder: Path, runs: int = 1,
             workload: dict | None = None, topology_verdict: Verdict | None = None) -> tuple[list[VerificationResult], dict]:
    """`runs` benchmarks of the model as it serves now, one sampler around them all: one verification
    result per run (not saved), and the telemetry. `workload`: {prompt_tokens, output_tokens, concurrency}."""
    # The benchmark client (httpx) and result writer (matplotlib) are imported only when a model is
    # verified: a converged deploy skips verification and should not pay for the imports.
    from rigkit.fit.roofline import roofline_tok_s
    from rigkit.verify.client import run_bench
    from rigkit.verify.result import build_result, earlier_results

    workload = workload or {"prompt_tokens": PROMPT_TOKENS, "output_tokens": OUTPUT_TOKENS, "concurrency": []}
    shape = _shape(rig, model)
    sampling = _sampling_in_container(model) if rig.spec.os == "windows" else _sampling_on_host(model)
    with sampling as sampled:
        with forward(host.connector.client.get_transport(), model.spec.port) as local_port:
            benches = [run_bench(
                f"http://127.0.0.1:{local_port}", served_name(model), workload["prompt_tokens"],
                workload["output_tokens"], tuple(workload["concurrency"]), timeout_s=REQUEST_TIMEOUT_S,
                api_key=read_api_key(rig), expected_min_decode_tok_s=model.spec.expected_min_decode_tok_s,
                roofline_tok_s=roofline_tok_s(rig, model, shape), draft_tokens_per_step=_draft_tokens(model),
            ) for _ in range(runs)]
    telemetry = sampled["telemetry"]
    # The image as the catalog names it; its digest stays null until the serving role records one.
    serving = served_with(rig, model, topology_verdict)
    earlier = earlier_results(folder)
    return [build_result(rig, model, bench, telemetry, earlier, serving=serving, shape=shape)
            for bench in benches], telemetry


_SHAPES: dict[tuple, dict] = {}  # per (run, rig, model): a gate's runs and the verification after it ask once


def _shape(rig: RigConfig, model: ModelConfig) -> dict:
    """What the rig says of the model's files (its config.json's keys, its weights' bytes), for the roofline:
    read when verification first runs in this deploy, after the weights role."""
    from rigkit.fit.check import shapes_reads

    key = (id(host.state), host.name, model.name)
    if key not in _SHAPES:
        found = {}
        for fact, kwargs in shapes_reads(replace(rig, models=(model,))):
            found = host.get_fact(fact, **kwargs) or {}
        _SHAPES[key] = found.get(model.name) or {}
    return _SHAPES[key]


def served_with(rig: RigConfig, model: ModelConfig, topology_verdict: Verdict | None) -> dict:
    """The image as the catalog names it (its digest stays null until the serving role records one) and
    the command line and topology environment the compose file carries (the serving role's own
    functions, with the preflight's additions: rigkit.topology.rig.compose_additions)."""
    added = compose_additions(topology_verdict)
    publish = rig.spec.os == "windows"  # Windows rigs publish the port, vLLM listening on 0.0.0.0 inside
    return {"image": model.spec.image, "image_digest": None,
            "vllm_args": vllm_args(model, "0.0.0.0" if publish else rig.spec.serve_address,
                                   added.get("topology_args", ())),
            "vllm_env": {k: v for k, v in added.get("topology_env", {}).items() if k not in model.spec.env} or None}


def _verify_model(rig: RigConfig, model: ModelConfig, results_dir: Path,
                  topology_verdict: Verdict | None = None) -> None:
    from rigkit.verify.result import results_folder

    folder = results_folder(results_dir, rig.name, model.name)
    results, telemetry = _measure(rig, model, folder, topology_verdict=topology_verdict)
    _save_and_judge(rig, model, folder, results[0], telemetry)


def _save_and_judge(rig: RigConfig, model: ModelConfig, folder: Path, result: VerificationResult, telemetry: dict,
                    fail: bool = True) -> Path:
    from rigkit.verify.result import save_result

    if rig.spec.os == "linux":  # rigkit-stack's rigs
        result = _with_start(model, result)
    path = save_result(folder, result)
    from rigkit.verify.chart import (
        draw,  # matplotlib costs ~0.35 s to import: only when a chart is drawn
    )

    draw(path.with_suffix(".png"), rig, model.name, telemetry)
    if rig.spec.monitoring.enabled and rig.spec.os == "linux":
        _summary_to_rig(model, result)
    logger.info(f"{host.print_prefix}{_summary(result, path)}")
    if fail and not result.passed:
        failed = "; ".join(f"{c.name}: {c.message}" for c in result.failed_checks)
        raise OperationError(f"verification of {model.name} failed: {failed} (details: {path})")
    return path


def _with_start(model: ModelConfig, result: VerificationResult) -> VerificationResult:
    """The result with the start it follows: the table rigkit-stack kept for the model's last proven start,
    when that start came after the earlier verification, judged against the catalog's ready_budget_s."""
    from rigkit.verify.checks import check_time_to_ready

    ok, output = host.run_shell_command(command=f"cat {shlex.quote(stack.stack_file(model.name, stack.STARTUP_FILE))}",
                                        _timeout=COMMAND_TIMEOUT_S)
    try:
        start = json.loads("\n".join(output.stdout_lines)) if ok else None
    except ValueError:
        start = None
    earlier = (result.previous or {}).get("time")
    if not isinstance(start, dict) or (earlier and _iso_epoch(earlier) >= (start.get("started_at") or 0)):
        return result
    checks = list(result.checks)
    if model.spec.ready_budget_s is not None:
        checks.append(check_time_to_ready(start, model.spec.ready_budget_s))
    return replace(result, startup=start, checks=checks)


def _iso_epoch(text: str) -> float:
    from datetime import datetime

    try:
        return datetime.fromisoformat(text).timestamp()
    except ValueError:
        return 0.0


def _gate_model(rig: RigConfig, model: ModelConfig, results_dir: Path, accept_slower: bool, gated: set,
                refusals: list, topology_verdict: Verdict | None = None) -> None:
    """The rollout gate (docs/serving.md, "The rollout gate"): the candidate `rigkit-stack rollout NAME gate`
    holds is benchmarked GATE_RUNS times with the proven result's workload, judged against it
    (rigkit.verify.gate), then promoted, or rolled back and the rollback verified the same way (a refusal
    is added to `refusals`: the deploy fails once every model was gated). `topology_verdict`: the
    preflight's for this model, so that the runs' provenance records what its compose file carries."""
    from rigkit.verify.gate import decide, from_result
    from rigkit.verify.gate_record import (
        anchor_result,
        gate_document,
        proven_history,
        refusal_screen,
        run_summary,
        save_gate,
        summary_line,
        workload_of,
    )
    from rigkit.verify.result import results_folder

    def in_stack(file_name: str) -> str:
        return shlex.quote(stack.stack_file(model.name, file_name))

    # The held candidate's sha, then whether the rig holds a proven config of the model (rigkit-stack's files).
    said = _run(f"cat {in_stack(stack.GATE_PENDING_FILE)} 2>/dev/null; echo; "
                f"test -f {in_stack(stack.PROVEN_COMPOSE_FILE)} && test -f {in_stack(stack.PROVEN_SETTINGS_FILE)} "
                "&& echo proven-on-rig || true").split()
    held = said[0] if said else ""
    if not stack.is_sha256(held):
        logger.info(f"{host.print_prefix}{model.name}: no new config held for the gate (the proven one was "
                    "restarted); verification follows")
        return
    gated.add(model.name)
    folder = results_folder(results_dir, rig.name, model.name)
    history = proven_history(folder)  # read once: the baseline is its newest, the anchor one of its results
    baseline = history[0] if history else None
    workload = workload_of(baseline)
    if baseline and "proven-on-rig" not in said:
        # A refusal here would have nothing to roll back to and stop the model: a rebuilt rig's first rollout
        # of a config proven before must serve. It establishes the proven result again, on this rig as it is now.
        logger.info(f"{host.print_prefix}{model.name}: the rig holds no proven config of it (a new or rebuilt rig, "
                    f"or the stack was taken down), so this rollout establishes the proven result again; the last "
                    f"one on record ({baseline.get('time')}) is not compared")
        baseline = None
    caps = {g.index: g.power_limit_w for g in rig.spec.gpus if g.index in model.spec.gpus and g.power_limit_w}
    anchor = anchor_result(history) if baseline else None
    if anchor is not None and anchor.get("time") == baseline.get("time"):
        anchor = None  # the anchor is the last proven result: compared already

    def judge(measured, starts):
        return decide(from_result(baseline) if baseline else None, [from_result(r.to_json()) for r in measured],
                      caps, accept_slower=accept_slower, anchor=from_result(anchor) if anchor else None,
                      anchor_label=f"{anchor.get('kind') or 'verification'} of {anchor.get('time')}" if anchor else "",
                      starts=starts)
    verdict, runs, telemetries = _judged(rig, model, folder, workload, topology_verdict, judge,
                                         stack.restart_command(model.name, held), "the candidate")
    if verdict.waived:  # promoted slower on purpose: recorded in the provenance of what is saved
        runs = [replace(r, provenance={**r.provenance, "accepted_slower": True}) for r in runs]
    documents = [r.to_json() for r in runs]
    if verdict.promote:
        ok, output = host.run_shell_command(command=stack.promote_command(model.name, held), _timeout=PROMOTE_TIMEOUT_S)
        said = "\n".join(output.stdout_lines + output.stderr_lines)
        document = gate_document(rig.name, model.name, baseline, workload, documents, verdict, ok,
                                 bool(verdict.waived), held, {"said": said.strip()} if not ok else None)
        path = save_gate(folder, document)
        if not ok:
            raise OperationError(f"{model.name}: the rollout gate passed the candidate, but rigkit-stack did not "
                                 f"promote it:\n{said}\n(details: {path})")
        # The candidate's verification: the run nearest the mean decode, saved as this deploy's verification.
        at = sorted(range(len(runs)), key=lambda n: runs[n].figures.get("decode_tok_s") or 0)[len(runs) // 2]
        _save_and_judge(rig, model, folder, replace(runs[at], runs=run_summary(documents)), telemetries[at], fail=False)
        logger.info(f"{host.print_prefix}rollout gate of {model.name}:\n{verdict.reason}\n(details: {path})")
        return
    ok, output = host.run_shell_command(command=stack.rollback_command(model.name, held),
                                        _timeout=UP_TIMEOUT_S + model.spec.ready_timeout_s + COMMAND_TIMEOUT_S)
    said = _stack_said(output)
    rolled_back = any(line.startswith(stack.ROLLED_BACK) for line in said)
    rollback = {"said": said[-1] if said else "rigkit-stack said nothing", "rolled_back": rolled_back}
    if rolled_back:
        # The rollback verified the same way: the restored config's runs against the proven result.
        check, again, telemetries = _judged(
            rig, model, folder, workload, topology_verdict,
            lambda measured, starts: decide(from_result(baseline) if baseline else None,
                                            [from_result(r.to_json()) for r in measured], caps, starts=starts),
            stack.restart_command(model.name, stack.PROVEN), "the restored config")
        restored = run_summary([r.to_json() for r in again])
        rollback.update(verified=check.promote, reason=check.reason, runs=restored)
        failed = ", ".join(c.name for c in check.failed)
        rollback["said"] = (f"ROLLED BACK to the last proven config; its verification "
                            f"{'passed' if check.promote else f'FAILED ({failed})'}: {len(again)} runs, "
                            f"{summary_line(restored)}")
        if check.promote:
            at = sorted(range(len(again)), key=lambda n: again[n].figures.get("decode_tok_s") or 0)[len(again) // 2]
            _save_and_judge(rig, model, folder, replace(again[at], runs=restored), telemetries[at], fail=False)
    document = gate_document(rig.name, model.name, baseline, workload, documents, verdict, False, False, held,
                             rollback)
    path = save_gate(folder, document)
    logger.info(f"{host.print_prefix}{refusal_screen(model.name, document, path, stack.stack_dir(model.name))}")
    refusals.append({"model": model.name, "rolled_back": rolled_back, "verified": bool(rollback.get("verified"))})


def _stack_said(output) -> list[str]:
    """What rigkit-stack said (its `rigkit-stack: ...` lines, the prefix off), in order."""
    return stack.said_lines(output.stdout_lines + output.stderr_lines)


def _judged(rig: RigConfig, model: ModelConfig, folder: Path, workload: dict, topology_verdict: Verdict | None,
            judge, restart: str, what: str):
    """GATE_RUNS runs of what serves now, judged (`judge(runs, starts)`, rigkit.verify.gate.decide); a verdict
    that asks for a second look (near the line on one start: the engine's level moves between starts) gets
    one: `restart` (a rigkit-stack restart) and as many runs again, judged together. (verdict, the runs, each
    run's telemetry, so that a saved run is drawn with its own start's.) `what`: what is measured, in words."""
    from rigkit.verify.gate_record import GATE_RUNS
    runs, telemetry = _measure(rig, model, folder, GATE_RUNS, workload, topology_verdict)
    telemetries = [telemetry] * len(runs)
    verdict = judge(runs, 1)
    if not verdict.second_look:
        return verdict, runs, telemetries
    logger.info(f"{host.print_prefix}{model.name}: {', '.join(c.name for c in verdict.failed)} short of the proven "
                f"result by less than twice the allowance on one start; restarting {what} for a second look "
                f"({GATE_RUNS} more runs)")
    ok, output = host.run_shell_command(command=restart, _timeout=RESTART_TIMEOUT_S + model.spec.ready_timeout_s)
    said = " ".join(_stack_said(output))
    if not ok:  # judged on its one start, as it is: one that does not get ready again is no better for it
        logger.warning(f"{host.print_prefix}{model.name}: the second look found {what} not ready ({said}); "
                       "judged on its first start")
        return verdict, runs, telemetries
    logger.info(f"{host.print_prefix}{said}")
    more, telemetry = _measure(rig, model, folder, GATE_RUNS, workload, topology_verdict)
    runs = [*runs, *more]
    return judge(runs, 2), runs, [*telemetries, *[telemetry] * len(more)]


def _refused(refusals: list[dict], outcome: Path | None) -> None:
    """Fail the deploy for the models the gate refused. For `rigkit rollout`, first write to `outcome`
    whether every refused model is back on its last proven config and that config verified: nothing
    else failed before this step (a failed operation stops the rig's run), so the rig then serves only
    proven configs and is put back in the gateway (docs/gateway.md, "Drain during a rollout")."""
    if outcome is not None:
        from rigkit.verify.history import write_document

        write_document(outcome, {
            "kind": "rollout-outcome", "rig": host.name,
            "refused": refusals,
            "serving_proven": all(r["rolled_back"] and r["verified"] for r in refusals)})

    def became(r: dict) -> str:
        return ("rolled back to the last proven config, verified" if r["verified"] else
                "rolled back, its verification FAILED" if r["rolled_back"] else "NOT rolled back")
    raise OperationError("the rollout gate refused " + "; ".join(f"{r['model']} ({became(r)})" for r in refusals)
                         + ": each refusal's screen is above (rollout gate REFUSED ...)")


def _summary_to_rig(model: ModelConfig, result: VerificationResult) -> None:
    """The figures the monitoring exporter shows as the last verification's (rigkit.rigside.metrics),
    at VERIFY_SUMMARY_DIR/<model>.json on the rig, replaced whole (upload beside it, then mv)."""
    target = f"{VERIFY_SUMMARY_DIR}/{model.name}.json"
    data = json.dumps(verification_summary(result.to_json()), indent=1).encode()
    _run(f"mkdir -p {shlex.quote(VERIFY_SUMMARY_DIR)}")
    if not host.put_file(io.BytesIO(data), f"{target}.part"):
        raise OperationError(f"could not write {target}.part on the rig")
    _run(f"chmod 644 {shlex.quote(target + '.part')} && mv {shlex.quote(target + '.part')} {shlex.quote(target)}")


@contextmanager
def _sampling_on_host(model: ModelConfig):
    """The sampler as a process on the rig (Linux), started and stopped over the deploy's shell;
    yields a dict that holds {"telemetry": ...} after the block."""
    remote_path = f"{RUN_DIR}/telemetry-{model.name}.json"
    pid = _run(sampler.start_command(SAMPLER_PATH, SAMPLER_NVML_DIR, model.spec.gpus, sampler.SAMPLE_HZ, remote_path,
                                     sampler.MAX_S)).strip().splitlines()[-1]
    _run(sampler.started_command(pid, remote_path, sampler.START_WAIT_S))
    held: dict = {}
    try:
        yield held
    finally:
        _run(sampler.stop_command(pid, remote_path))
    buffer = io.BytesIO()
    if not host.get_file(remote_path, buffer):
        raise OperationError(f"could not fetch {remote_path} from the rig")
    held["telemetry"] = {**json.loads(buffer.getvalue()), "sampler": "nvml-host"}


@contextmanager
def _sampling_in_container(model: ModelConfig):
    """The same sampler in a short-lived container with GPU access (Windows rigs: NVML answers in
    Docker Desktop's WSL2 containers), through the rig's Docker Engine over the deploy's SSH
    connection; the model's serving image runs it."""
    from rigkit.verify.container_sampler import SamplerError, sampling_in_container  # the docker SDK

    gpus = sorted(model.spec.gpus)
    with rig_engine(host.connector.client.get_transport(), dial_command(host.connector)) as client:
        try:
            with sampling_in_container(client, model.spec.image, f"rigkit-telemetry-{model.name}", gpus,
                                       sampler.SAMPLE_HZ, sampler.MAX_S) as held:
                yield held
        except SamplerError as exc:
            raise OperationError(f"{model.name}: {exc}") from None


def _draft_tokens(model: ModelConfig) -> int | None:
    speculative = model.spec.vllm.speculative
    return speculative.num_speculative_tokens if speculative else None


def _summary(result: VerificationResult, path: Path) -> str:
    from rigkit.verify.table import bench_table

    f = result.figures
    lines = [f"verification of {result.model}{' (SIMULATED telemetry)' if result.telemetry_simulated else ''}:",
             f"GPU telemetry: {SAMPLER_NAMES.get(result.telemetry_sampler, result.telemetry_sampler)}",
             bench_table(result.bench)]
    for name in ("prefill_energy_j", "decode_energy_j", "decode_mean_power_w", "joules_per_output_token",
                 "decode_tok_s_per_watt", "response_time_estimate_s", "run_energy_counter_j",
                 "run_integrated_energy_j", "joules_per_token", "roofline_share"):
        if f.get(name) is not None:
            lines.append(f"{name}: {f[name]:.3f}")
    lines.append(f"power samples: prefill {f['prefill_samples']}, decode {f['decode_samples']}")
    lines += [f"no {p.phase} energy: {p.note}" for p in result.phases if p.note]
    if result.previous and not result.previous["comparable"]:
        changed = ", ".join(c["key"] for c in result.previous["changed"])
        lines.append(f"not compared with the run of {result.previous['time']}: changed {changed}")
    for c in result.checks:
        if c.name.startswith("gpu"):
            lines.append(f"{'PASS' if c.passed else 'FAIL'}  {c.name}: {c.message}")
    for r in result.regressions:
        lines.append(f"REGRESSION {r.figure}: {r.previous:.3g} -> {r.now:.3g} ({r.change:+.0%})")
    lines.append(f"result: {path} (+ .png)")
    return "\n".join(lines)
