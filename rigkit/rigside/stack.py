"""rigkit-stack's contract: the one place the controller and the rig program agree on a model stack's
files, verbs, arguments, exit codes and said lines (templates/serving/rigkit-stack documents what each
does). The controller builds each command line with a function here (roles/serving.py, roles/verify.py);
rigkit-stack parses its argv with `parse_command`, so a call can be followed by name from a role into the
program and back. tests/test_layout.py fails where a stack file name or a `rigkit-stack VERB` command is
spelled anywhere else. Standard library only (it runs on rigs too).
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass

from .names import STACK_HELPER_PATH, STACKS_DIR

# A stack's folder, STACKS_DIR/NAME: what the deploy wants, what was proven ready, what failed
WANTED_COMPOSE_FILE = "compose.next.yml"  # written by the deploy
WANTED_SETTINGS_FILE = "stack.next.json"  # its readiness settings: project, port, served name, key file, ready timeout
PROVEN_COMPOSE_FILE = "compose.yml"  # the last config proven ready (a real completion and a warm-up answered),
PROVEN_SETTINGS_FILE = "stack.json"  # written only after that proof, compose file last (the done marker)
FAILED_COMPOSE_FILE = "compose.failed.yml"  # the last wanted config that did not get ready or that the gate refused
# The candidate held un-promoted for the rollout gate: `rollout NAME gate` writes the SHA-256 of its wanted
# files there; promote or rollback removes it
GATE_PENDING_FILE = "gate.pending"
# Where the last start rigkit-stack proved spent its time (rigside.startup's table, JSON): read by `rigkit
# status` and the exporter
STARTUP_FILE = "startup.json"
STACK_FILES = (PROVEN_COMPOSE_FILE, WANTED_COMPOSE_FILE, PROVEN_SETTINGS_FILE, WANTED_SETTINGS_FILE,
               FAILED_COMPOSE_FILE)  # what `rigkit status` compares (besides the gate's mark)

# The verbs
ROLLOUT = "rollout"  # NAME [recreate | gate]
PROMOTE = "promote"  # NAME SHA256
ROLLBACK = "rollback"  # NAME SHA256
RESTART = "restart"  # NAME SHA256 | proven
DOWN = "down"  # NAME
PROBE = "probe"  # NAME KEY TIMEOUT_S GPUS
VERBS = (ROLLOUT, PROMOTE, ROLLBACK, RESTART, DOWN, PROBE)
# Their words
RECREATE = "recreate"  # rollout: restart the container even if its config is unchanged (new weights)
GATE = "gate"  # rollout: hold a new config that got ready un-promoted, for the rollout gate
PROVEN = "proven"  # restart: the last proven config, serving after a rollback
PROBE_TIMEOUT_S = (1, 600)  # the bounds rigkit-stack accepts for a P2P check

# Exit codes
EXIT_READY = 0  # ready (or promoted)
EXIT_FAILED = 1  # failed with nothing to roll back to, or the rollback did not get ready
EXIT_BAD_ARGUMENTS = 2  # not a command line it knows, or no such stack
EXIT_ROLLED_BACK = 3  # the wanted config did not get ready; the last proven one serves again
EXIT_LOCKED = 4  # another rollout of the same stack holds its lock
EXIT_REFUSED = 5  # promote or restart refused: the files changed since they were gated, none held, or no answer
EXIT_P2P_FAILED = 6  # the P2P check failed or hung (the step, and so the pair, named)

# What it says: each line starts with SAID_PREFIX; a rollback that got ready says ROLLED_BACK first
SAID_PREFIX = "rigkit-stack:"
ROLLED_BACK = "ROLLED BACK"


def stack_dir(name: str, stacks_dir: str = STACKS_DIR) -> str:
    """A model's stack folder on the rig (RIGKIT_STACKS_DIR on the rig overrides STACKS_DIR)."""
    return f"{stacks_dir}/{name}"


def stack_file(name: str, file_name: str, stacks_dir: str = STACKS_DIR) -> str:
    """One of a model's stack files (`file_name`: one of the *_FILE names above)."""
    return f"{stack_dir(name, stacks_dir)}/{file_name}"


def is_sha256(text: str) -> bool:
    """A SHA-256 as rigkit-stack writes and accepts it: 64 lowercase hex digits."""
    return len(text) == 64 and all(c in "0123456789abcdef" for c in text)


def _digits(text: str) -> bool:
    return bool(text) and all(c in "0123456789" for c in text)


# The controller's side: each command line, quoted for the rig's shell. A value rigkit-stack would refuse
# is refused here first (ValueError), so a command built here is one the rig accepts.

def _command(verb: str, name: str, *words: str) -> str:
    line = [verb, name, *words]
    parse_command(line)  # raises BadCommandLine (a ValueError) for what the rig would refuse
    return shlex.join([STACK_HELPER_PATH, *line])


def rollout_command(name: str, gate: bool = False, recreate: bool = False) -> str:
    """Start the wanted config; promote it once ready (`gate`: hold a new one for the rollout gate instead;
    `recreate`: restart the container even if its config is unchanged). Not both."""
    if gate and recreate:
        raise ValueError("a rollout is gated or recreated, not both")
    return _command(ROLLOUT, name, *([GATE] if gate else []), *([RECREATE] if recreate else []))


def promote_command(name: str, sha: str) -> str:
    """The gate passed the candidate held under `sha`: promote it."""
    return _command(PROMOTE, name, sha)


def rollback_command(name: str, sha: str) -> str:
    """The gate refused the candidate held under `sha`: keep it as FAILED_COMPOSE_FILE, bring the last proven back."""
    return _command(ROLLBACK, name, sha)


def restart_command(name: str, sha_or_proven: str) -> str:
    """The gate's second look: restart the candidate held under a SHA-256, or PROVEN, the last proven config."""
    return _command(RESTART, name, sha_or_proven)


def down_command(name: str) -> str:
    """Stop the stack and remove its folder."""
    return _command(DOWN, name)


def probe_command(name: str, key: str, timeout_s: int, gpus) -> str:
    """The active P2P check of a model spanning `gpus`, at most `timeout_s`, its pass kept under `key` (hex)."""
    return _command(PROBE, name, key, str(int(timeout_s)), ",".join(str(int(g)) for g in sorted(gpus)))


# The rig's side: rigkit-stack's argv, parsed once.

class BadCommandLine(ValueError):
    """Not a command line rigkit-stack knows; the message is the reason its usage text follows."""


@dataclass(frozen=True)
class StackCommand:
    verb: str
    name: str
    gate: bool = False  # rollout
    recreate: bool = False  # rollout
    sha: str | None = None  # promote, rollback, restart: the gated files' SHA-256, or PROVEN (restart)
    key: str | None = None  # probe
    timeout_s: int | None = None  # probe
    gpus: tuple = ()  # probe


def parse_command(args) -> StackCommand:
    """rigkit-stack's arguments (its argv without the program's name) as a StackCommand, or BadCommandLine.
    The stack's name is checked against the stacks folder by the program (a state, not a syntax)."""
    args = list(args)
    if len(args) < 2:
        raise BadCommandLine("a command and a stack name are needed")
    verb, name, rest = args[0], args[1], args[2:]
    if verb == ROLLOUT and rest in ([], [RECREATE], [GATE]):
        return StackCommand(verb, name, gate=rest == [GATE], recreate=rest == [RECREATE])
    if verb == DOWN and rest == []:
        return StackCommand(verb, name)
    if verb == PROBE and len(rest) == 3 and is_sha256(rest[0]) and _digits(rest[1]) \
            and PROBE_TIMEOUT_S[0] <= int(rest[1]) <= PROBE_TIMEOUT_S[1] and all(map(_digits, rest[2].split(","))):
        return StackCommand(verb, name, key=rest[0], timeout_s=int(rest[1]), gpus=tuple(map(int, rest[2].split(","))))
    if verb == RESTART and rest == [PROVEN]:
        return StackCommand(verb, name, sha=PROVEN)
    if verb in (PROMOTE, ROLLBACK, RESTART) and len(rest) == 1 and is_sha256(rest[0]):
        return StackCommand(verb, name, sha=rest[0])
    raise BadCommandLine(f"not a command line rigkit-stack knows: {' '.join(args)!r}")


def said_lines(lines) -> list:
    """What rigkit-stack said (its SAID_PREFIX lines, the prefix off), in order, from its output's lines."""
    return [line.split(SAID_PREFIX, 1)[1].strip() for line in lines if SAID_PREFIX in line]


START_TABLE = "start of "  # the first line of a start's table (rigside.startup.table); its rows are indented


def start_tables(lines) -> list[str]:
    """The startup tables rigkit-stack said (rigside.startup.table), indentation kept, from its output's lines."""
    said = [line.split(SAID_PREFIX, 1)[1][1:].rstrip() for line in lines if SAID_PREFIX in line]
    tables, inside = [], False
    for line in said:
        inside = line.startswith(START_TABLE) or (inside and line.startswith("  "))
        if inside:
            tables.append(line)
    return tables
