"""pyinfra fact: is a model's weights volume complete and the source's copy? Read-only.

Runs the copier's `check` (templates/weights/copier/check.py) on the rig itself, as root,
against the volume's mountpoint: it reads the completion marker, the manifest and the
source's metadata (paths, sizes, mtimes; never file contents) and starts no container,
so planning a deploy (`--dry` too) changes nothing and costs one short command for all of a
rig's volumes (`volume_states`). Where the
mountpoint is not reachable from the rig's shell (Docker Desktop keeps volumes inside its
VM) or python3 is missing, it says `unreachable` and the copy operation checks through a
helper container instead.
"""

from __future__ import annotations

import json
import re
import shlex

from pyinfra.api import FactBase

from rigkit.config.schema import RigConfig
from rigkit.plumbing.facts_once import Read, read_once
from rigkit.weights.copier import copier_source
from rigkit.plumbing.rig_reads import DOCKER_S, bounded, no_answer
from rigkit.rigside.names import WEIGHTS_HELPER_LABEL, volume_name
from rigkit.weights.layout import source_layout

RIG_SOURCE = "-"  # the copier's `check` source for a volume filled from another rig
HELPERS_LEFT = "helpers-left"  # the first word of the fact's line naming the weights helpers a killed copy left behind
LEFT_BEHIND = ""  # their key among the volumes' states: no volume is named ""
HELPER_NAME = re.compile(r"[a-z0-9][a-z0-9_.-]{0,127}")  # names rigkit gives helpers (rigside.names)


class WeightsVolumeStates(FactBase):
    """{volume: state} for each (volume, source) pair, where a state is {"status": "unchanged" |
    "needed" | "missing" | "unreachable" | "error", ...} and `error` carries the copier's reason
    (a missing or empty source, a dangling symlink) or says the engine did not answer in time
    (then `timed_out` is "docker"). One command for every pair."""

    def command(self, pairs: tuple[tuple[str, str], ...]) -> str:
        script = shlex.quote(copier_source())
        missing, unreachable = shlex.quote('{"status": "missing"}'), shlex.quote('{"status": "unreachable"}')
        # One `docker volume inspect` for every volume (a Docker CLI start is ~30 ms on the rig):
        # it prints "NAME MOUNTPOINT" for each volume that exists and skips the others. Names are
        # compared as strings ("" appended): awk would compare "100" and "1e2" as numbers.
        # The volumes found are checked by one python3 start (~50 ms each on the rig), the
        # copier's check-each, which prints "volume NAME" before each report.
        names = " ".join(shlex.quote(volume) for volume, _ in pairs)
        checks = [f"script={script}; py=$(command -v python3); set --; "
                  f"mps=$({bounded('docker', DOCKER_S)} volume inspect --format '{{{{.Name}}}} {{{{.Mountpoint}}}}' {names} "
                  "2>/dev/null); dc=$?"]
        # A wedged engine: every volume's answer says so (never "missing": that would ask for a copy).
        hung = shlex.quote(json.dumps({"status": "error", "error": no_answer("docker", DOCKER_S), "timed_out": "docker"}))
        checks.append('if [ $dc -eq 124 ] || [ $dc -eq 137 ]; then '
                      + "; ".join(f"echo {shlex.quote('volume ' + volume)}; echo {hung}" for volume, _ in pairs)
                      + "; exit 0; fi")
        for volume, source in pairs:
            # "-": weights from another rig; the copier reports this volume's own state (and digest)
            root, inside = source_layout(source) if source != RIG_SOURCE else (RIG_SOURCE, ".")
            src = shlex.quote(f"{root}/{inside}" if inside != "." else source)
            name = shlex.quote(volume)
            checks.append(
                f"mp=$(printf '%s\\n' \"$mps\" | awk -v n={name} '$1 \"\" == n \"\" {{ print substr($0, length(n) + 2); exit }}'); "
                f'if [ -n "$mp" ]; then '
                f'if [ -d "$mp" ] && [ -n "$py" ]; then set -- "$@" {name} {src} "$mp" {shlex.quote(root)}; '
                f"else echo {shlex.quote('volume ' + volume)}; echo {unreachable}; fi; "
                f"else echo {shlex.quote('volume ' + volume)}; echo {missing}; fi"
            )
        checks.append('[ "$#" -eq 0 ] || python3 -c "$script" check-each "$@"')
        # Helpers a killed copy left behind (it finished after its controller was gone; only the controller
        # removes one): their names, for the weights role to remove. They hold their volumes in use.
        checks.append(f"echo {HELPERS_LEFT} $({bounded('docker', DOCKER_S)} ps -a --filter "
                      f"label={WEIGHTS_HELPER_LABEL} --filter status=exited --filter status=created "
                      f"--format '{{{{.Names}}}}={{{{.Label \"{WEIGHTS_HELPER_LABEL}\"}}}}' 2>/dev/null | tr '\\n' ' ')")
        return "; ".join(checks) + "; exit 0"

    def process(self, output) -> dict:
        states, volume, answer = {}, None, []
        for line in list(output) + ["volume "]:
            if line.split()[:1] == [HELPERS_LEFT]:
                pairs = [word.partition("=") for word in line.split()[1:]]
                states[LEFT_BEHIND] = {"status": "helpers", "helpers": {
                    name: model for name, _, model in pairs if HELPER_NAME.fullmatch(name)}}
            elif line.startswith("volume "):
                if volume is not None:
                    states[volume] = _parse(answer)
                volume, answer = line[len("volume "):].strip(), []
            elif line.strip():
                answer.append(line)
        return states


def _parse(lines: list[str]) -> dict:
    try:
        return json.loads(lines[-1])
    except (IndexError, ValueError):
        return {"status": "error", "error": "unreadable answer from the rig: " + " ".join(lines)[-300:]}


def volume_states_reads(rig: RigConfig) -> list[Read]:
    """The one question volume_states asks (none when no model keeps its weights on a volume)."""
    on_volumes = [m for m in rig.models if m.spec.weights.storage == "volume"]
    if not on_volumes:
        return []
    return [(WeightsVolumeStates, {"pairs": tuple((volume_name(m), RIG_SOURCE if m.spec.weights.from_rig else
                                                   m.spec.weights.source) for m in on_volumes)})]


def volume_states(rig: RigConfig) -> dict[str, dict]:
    """{model name: its weights volume's state} for the rig's models kept on volumes; read once
    per deploy run (preflight, the weights role and status ask the same question)."""
    on_volumes = [m for m in rig.models if m.spec.weights.storage == "volume"]
    if not on_volumes:
        return {}  # nothing to ask: no command at all
    [(fact, kwargs)] = volume_states_reads(rig)
    states = read_once(fact, **kwargs)
    missing = {"status": "error", "error": "the rig gave no answer for this volume"}
    return {m.name: states.get(volume_name(m), missing) for m in on_volumes}


def helpers_left(rig: RigConfig) -> list[str]:
    """The weights helpers (containers) a killed copy of one of this rig's models left behind, by name (the
    same read as volume_states: no command of its own). Another model's are not this deploy's to remove."""
    if not any(m.spec.weights.storage == "volume" for m in rig.models):
        return []
    [(fact, kwargs)] = volume_states_reads(rig)
    found = (read_once(fact, **kwargs).get(LEFT_BEHIND) or {}).get("helpers", {})
    models = {m.name for m in rig.models}
    return sorted(name for name, model in found.items() if model in models)
