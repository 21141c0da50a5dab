"""Role serving: one vLLM compose stack per served model, brought up only when it changed.

For each model in the rig file: render its wanted compose file and readiness settings
into /etc/rigkit/stacks/<model>/ (compose.next.yml, stack.next.json), then run
`rigkit-stack rollout <model>` when they are not the last config proven ready (an
interrupted or failed rollout leaves them so) or the stack is down. rollout validates
with `docker compose config`, brings the wanted config up, waits for a real completion
and a warm-up, and only then promotes it to compose.yml/stack.json; on failure it brings
the last proven config back, judged by that config's own port and key, and exits
non-zero so the deploy reports the rollback. Stacks of models no longer in the rig file
are taken down and removed. Then the watchdog (rigkit.serving.watchdog, below the stacks):
a timer that restarts a model wedged by both of its signals, capped, never during a rollout.
The API key goes into a root-only env file that Compose
reads raw (no interpolation), and never through --diff. The stack's file names and each
rigkit-stack command line come from its contract, rigkit.rigside.stack.
"""

from __future__ import annotations

from pathlib import Path

from pyinfra import host, logger
from pyinfra.api import deploy
from pyinfra.api.exceptions import DeployError
from pyinfra.operations import files, python, server, systemd

from rigkit.config.schema import RigConfig
from rigkit.ondemand import operations as on_demand
from rigkit.plumbing import systemd_units as units
from rigkit.plumbing.facts_once import Read, read_once
from rigkit.plumbing.files import FileStates, put
from rigkit.plumbing.private_file import private_file
from rigkit.plumbing.render import template_text
from rigkit.plumbing.ssh import rig_call
from rigkit.rigside import stack
from rigkit.serving.api_key import (
    SecretFileError,
    accepted_keys_config,
    api_key_env_file,
    read_accepted_keys,
    read_api_key,
)
from rigkit.rigside.names import (
    ACCEPTED_KEYS_FILE,
    P2P_PROBE_SCRIPT_PATH,
    P2P_VERDICT_DIR,
    SECRETS_ENV_FILE,
    STACK_HELPER_PATH,
    STACKS_DIR,
    UNIT_DIR,
    WATCHDOG_CONFIG_PATH,
    WATCHDOG_PATH,
    WATCHDOG_SERVICE,
    WATCHDOG_TIMER,
)
from rigkit.serving.compose import render_compose, stack_settings
from rigkit.topology.probe import probe_key
from rigkit.topology.rig import compose_additions, needs_topology, spans_gpus
from rigkit.serving.facts import P2pVerdicts, RigkitStacks
from rigkit.plumbing.systemd_units import UnitStates
from rigkit.weights.facts import volume_states, volume_states_reads
from rigkit.serving.watchdog import (
    service_unit,
    timer_unit,
    watchdog_config,
    watched,
)

# Where things live on the rig: rigkit.rigside.names.
WATCHDOG_FILES = (WATCHDOG_PATH, WATCHDOG_CONFIG_PATH, f"{UNIT_DIR}/{WATCHDOG_SERVICE}", f"{UNIT_DIR}/{WATCHDOG_TIMER}")  # read in one command


def _stack_files(rig: RigConfig) -> dict[str, tuple[str, str]]:
    """{model: (its wanted compose file, its readiness settings)} on the rig."""
    return {m.name: (stack.stack_file(m.name, stack.WANTED_COMPOSE_FILE),
                     stack.stack_file(m.name, stack.WANTED_SETTINGS_FILE)) for m in rig.models}


def _role_files(rig: RigConfig) -> tuple[str, ...]:
    probe = (P2P_PROBE_SCRIPT_PATH,) if needs_topology(rig) else ()
    return (STACK_HELPER_PATH, *probe, *(p for pair in _stack_files(rig).values() for p in pair))  # read in one command


def serving_reads(rig: RigConfig) -> list[Read]:
    """What the role asks the rig while planning (deploy.py reads them ahead, all at once)."""
    key_file = [(FileStates, {"paths": (SECRETS_ENV_FILE,)})] if rig.spec.api_key_file else []  # private_file's
    if rig.spec.accept_api_key_files:
        key_file.append((FileStates, {"paths": (ACCEPTED_KEYS_FILE,)}))
    checks = [(P2pVerdicts, {"verdict_dir": P2P_VERDICT_DIR})] if needs_topology(rig) else []
    return [(RigkitStacks, {"stacks_dir": STACKS_DIR}), (FileStates, {"paths": _role_files(rig)}), *key_file, *checks,
            (FileStates, {"paths": WATCHDOG_FILES}), (UnitStates, {"units": (WATCHDOG_TIMER,)}), *volume_states_reads(rig),
            *on_demand.reads()]


def weights_completed_after_start(state: dict | None, volume: dict | None) -> bool:
    """Whether a running stack's container was created before its weights volume's completion marker was
    written (rigkit.serving.facts.RigkitStacks, rigkit.weights.facts): one second of slack for the clocks'
    rounding. A container restarted since (the watchdog's `docker restart`) keeps its creation time, so it
    may be restarted once more than needed; never one too few."""
    created = (state or {}).get("created")
    completed = (volume or {}).get("completed_at")
    return bool((state or {}).get("running")) and isinstance(created, (int, float)) and \
        isinstance(completed, (int, float)) and completed > created + 1


@deploy("Serving")
def serving(rig: RigConfig, weights_ops: dict | None = None, topology: dict | None = None,
            rollouts: dict | None = None, gate: bool = False) -> list:
    """Returns the operations whose change means a stack was (re)started or removed.
    `weights_ops`: {model: op}; a model whose weights were copied again is restarted on them.
    `topology`: {model: rigkit.topology.decide.Verdict} from the preflight, for models spanning GPUs:
    its vLLM flags and environment go into the model's compose file. Such a model is first checked
    (a copy per GPU pair and an all-reduce in a container of its image, rigkit.topology.probe) before
    its rollout, unless that check passed before for its topology and image.
    `gate`: a new config that gets ready is held un-promoted for the rollout gate (roles/verify.py),
    which promotes or rolls it back; `rollouts`, when given, receives {model: its rollout op}."""
    topology = topology or {}
    weights_ops = weights_ops or {}
    for warning in rig.warnings:
        logger.warning(f"{host.print_prefix}serving config: {warning}")
    try:
        api_key = read_api_key(rig)
        accepted = read_accepted_keys(rig, api_key) if api_key is not None else []
    except SecretFileError as exc:
        raise DeployError(str(exc)) from None
    with_key = api_key is not None
    stacks = read_once(RigkitStacks, stacks_dir=STACKS_DIR) or {}
    volumes = volume_states(rig)
    changes = []

    wanted_files = _stack_files(rig)
    paths = _role_files(rig)
    put(name="Install the stack helper", data=template_text("serving/rigkit-stack"), dest=STACK_HELPER_PATH, mode="755",
        batch=paths)
    key = None
    if with_key:
        files.directory(name="Secrets folder, root only", path=str(Path(SECRETS_ENV_FILE).parent), mode="700")
        key = private_file(name="Install the API key (root only)", dest=SECRETS_ENV_FILE,
                           data=api_key_env_file(api_key))
    if accepted:
        # The key the servers take: a rotation's set, or the one key of the env file. A swap of the key rigkit
        # sends keeps the set, so it restarts no server (the rig-side tools read the new one from the env file).
        key = private_file(name=f"Install the {len(accepted)} keys accepted during a rotation (root only)",
                           dest=ACCEPTED_KEYS_FILE, data=accepted_keys_config(accepted))

    passed = read_once(P2pVerdicts, verdict_dir=P2P_VERDICT_DIR) if needs_topology(rig) else set()
    if needs_topology(rig):
        put(name="Install the P2P check", data=template_text("serving/rigkit-p2p-probe.py"), dest=P2P_PROBE_SCRIPT_PATH,
            mode="644", batch=paths)
    front_settings = on_demand.settings_first(rig, with_key)

    def model_files(model):
        """Its compose file and readiness settings put, its P2P check run where due: (compose op, settings op)."""
        compose_path, settings_path = wanted_files[model.name]
        compose = put(name=f"Compose file for {model.name}",
                      data=render_compose(model, with_key, host=rig.spec.serve_address, accepted_keys=bool(accepted),
                                          **compose_additions(topology.get(model.name))),
                      dest=compose_path, mode="644", batch=paths)
        settings = put(name=f"Readiness settings for {model.name}", data=stack_settings(model, with_key),
                       dest=settings_path, mode="644", batch=paths)
        if spans_gpus(model) and (check_key := probe_key(model, topology.get(model.name))) not in passed:
            # Fails the deploy before the rollout (vLLM not started, nothing promoted) on a hang or wrong bytes.
            server.shell(name=f"P2P check of {model.name} (GPUs {', '.join(map(str, model.spec.gpus))}): a copy "
                              "per pair and an all-reduce, before vLLM starts on them",
                         commands=[stack.probe_command(model.name, check_key, rig.spec.p2p_check_timeout_s,
                                                       model.spec.gpus)])
        return compose, settings

    def rolls_out(model, compose, settings, state) -> bool:
        # A new key (or set of keys) changes no file here but what the container reads: roll out on it too. An
        # on-demand model not running is parked, not down.
        return (compose.did_change() or settings.did_change() or state["pending"]
                or (not state["running"] and not model.on_demand) or bool(key and key.did_change()))

    resident = [m for m in rig.models if not m.on_demand]
    turns = [(m, *model_files(m)) for m in rig.models if m.on_demand]
    if turns:
        on_demand.park_all(rig, lambda: any(
            rolls_out(m, c, s, stacks.get(m.name, {"pending": True, "running": 0}))
            or (m.name in weights_ops and weights_ops[m.name].did_change()) for m, c, s in turns))
    for model, *prepared in [*((m, None, None) for m in resident), *turns]:
        compose, settings = prepared if prepared[0] is not None else model_files(model)
        state = stacks.get(model.name, {"pending": True, "running": 0})
        if not state["pending"] and not state["running"] and not model.on_demand:
            logger.warning(f"{host.print_prefix}{model.name}: stack is not running; bringing it up")
        rollout = server.shell(
            name=f"Roll out {model.name}",
            # An on-demand model is not gated: it is parked once proven ready (docs/on-demand.md).
            commands=[stack.rollout_command(model.name, gate=gate and not model.on_demand)],
            _if=lambda m=model, c=compose, s=settings, st=state: rolls_out(m, c, s, st),
        )
        changes.append(rollout)
        restarts = [rollout]
        python.call(name=f"Where the start of {model.name} went", function=rig_call(_say_start), rollout=rollout,
                    _if=rollout.did_change)
        if rollouts is not None and not model.on_demand:  # an on-demand model is verified through its front
            rollouts[model.name] = rollout
        if model.name in weights_ops:
            restarts.append(server.shell(
                name=f"Restart {model.name} on its new weights",
                commands=[stack.rollout_command(model.name, recreate=True)],
                _if=lambda w=weights_ops[model.name], r=rollout: w.did_change() and not r.did_change(),
            ))
            changes.append(restarts[-1])
        if weights_completed_after_start(state, volumes.get(model.name)):
            # A copy that went on after its deploy was killed marked the volume complete after this container
            # started: vLLM serves what the volume held then. Not when this deploy copies or rolls out anyway.
            weights = weights_ops.get(model.name)
            restarts.append(server.shell(
                name=f"Restart {model.name}: its weights were completed after it started",
                commands=[stack.rollout_command(model.name, recreate=True)],
                _if=lambda w=weights, r=rollout: not r.did_change() and not (w is not None and w.did_change()),
            ))
            changes.append(restarts[-1])
        if model.on_demand:
            on_demand.park(model, restarts)

    wanted = {m.name for m in rig.models}
    for name in sorted(set(stacks) - wanted):
        changes.append(
            server.shell(name=f"Take down {name} (no longer in the rig file)",
                         commands=[stack.down_command(name)])
        )
    if with_key and not accepted:
        # Last, once every model rolled out on the one key: a rollback before this still finds the keys it needs.
        files.file(name="No rotation's keys", path=ACCEPTED_KEYS_FILE, present=False)
    on_demand.program(rig, front_settings, changes)
    _watchdog(rig, with_key)
    return changes


def _say_start(rollout) -> None:
    """The startup table rigkit-stack said for the start it proved (docs/serving.md, "Time to ready"): pyinfra
    shows a command's output only when it fails."""
    table = stack.start_tables(rollout.stdout_lines + rollout.stderr_lines)
    if table:
        logger.info(host.print_prefix + f"\n{host.print_prefix}".join(table))


def _watchdog(rig: RigConfig, with_key: bool) -> None:
    """The watchdog's script, settings and timer; the timer is stopped when no model is watched."""
    paths = WATCHDOG_FILES
    put(name="Install the watchdog", data=template_text("serving/rigkit-watchdog"), dest=WATCHDOG_PATH, mode="755",
        batch=paths)
    put(name="Watchdog settings", data=watchdog_config(rig, with_key), dest=WATCHDOG_CONFIG_PATH, mode="644", batch=paths)
    unit_files = [
        put(name="Watchdog service unit", data=service_unit(), dest=f"{UNIT_DIR}/{WATCHDOG_SERVICE}", mode="644", batch=paths),
        put(name="Watchdog timer unit", data=timer_unit(rig), dest=f"{UNIT_DIR}/{WATCHDOG_TIMER}", mode="644", batch=paths),
    ]
    systemd.daemon_reload(name="Reload systemd units (watchdog)", _if=lambda: any(u.did_change() for u in unit_files))
    on = bool(watched(rig))
    systemd.service(name=f"Watchdog timer {'on' if on else 'off'}", service=WATCHDOG_TIMER, running=on, enabled=on,
                    restarted=on, _if=lambda: any(u.did_change() for u in unit_files))
    units.service(name=f"Watchdog timer {'running' if on else 'stopped'}", unit=WATCHDOG_TIMER, batch=(WATCHDOG_TIMER,), running=on,
                  enabled=on, after=tuple(unit_files))
