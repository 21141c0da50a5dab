"""rigkit-stack's contract (rigkit/rigside/stack.py) without Docker: every command line the controller builds
is one the program parses back to the same arguments, and what either side would refuse is refused by both
(the builder with ValueError, the program with exit code 2 and its usage). The program itself runs here as
in tests/test_stack_gate_protocol.py: a stacks folder in a temporary directory, no docker on its PATH."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys

import pytest

from rigkit.rigside import stack
from rigkit.rigside.names import STACK_HELPER_PATH
from tests.conftest import REPO

SHA = "0123456789abcdef" * 4
KEY = "f" * 64

BUILT = [  # (the controller's command line, what the program must parse from it)
    (stack.rollout_command("m"), stack.StackCommand("rollout", "m")),
    (stack.rollout_command("m", gate=True), stack.StackCommand("rollout", "m", gate=True)),
    (stack.rollout_command("m", recreate=True), stack.StackCommand("rollout", "m", recreate=True)),
    (stack.promote_command("m", SHA), stack.StackCommand("promote", "m", sha=SHA)),
    (stack.rollback_command("m", SHA), stack.StackCommand("rollback", "m", sha=SHA)),
    (stack.restart_command("m", SHA), stack.StackCommand("restart", "m", sha=SHA)),
    (stack.restart_command("m", stack.PROVEN), stack.StackCommand("restart", "m", sha="proven")),
    (stack.down_command("m"), stack.StackCommand("down", "m")),
    (stack.probe_command("m", KEY, 90, [1, 0]), stack.StackCommand("probe", "m", key=KEY, timeout_s=90, gpus=(0, 1))),
]


@pytest.mark.parametrize("command, parsed", BUILT, ids=[c.split()[1] + " " + " ".join(c.split()[3:]) for c, _ in BUILT])
def test_each_command_the_controller_builds_is_parsed_back_by_the_program(command, parsed):
    words = shlex.split(command)  # as the rig's shell hands them to the program
    assert words[0] == STACK_HELPER_PATH
    assert stack.parse_command(words[1:]) == parsed
    assert parsed.verb in stack.VERBS


def test_the_command_lines_are_the_ones_the_roles_sent_before():
    """The same bytes the roles once spelled by hand (a catalog name and a hex SHA need no quoting)."""
    assert [c for c, _ in BUILT] == [
        "/usr/local/sbin/rigkit-stack rollout m", "/usr/local/sbin/rigkit-stack rollout m gate",
        "/usr/local/sbin/rigkit-stack rollout m recreate", f"/usr/local/sbin/rigkit-stack promote m {SHA}",
        f"/usr/local/sbin/rigkit-stack rollback m {SHA}", f"/usr/local/sbin/rigkit-stack restart m {SHA}",
        "/usr/local/sbin/rigkit-stack restart m proven", "/usr/local/sbin/rigkit-stack down m",
        f"/usr/local/sbin/rigkit-stack probe m {KEY} 90 0,1"]


def test_a_name_that_is_not_one_shell_word_is_quoted():
    assert shlex.split(stack.down_command("m; reboot")) == [STACK_HELPER_PATH, "down", "m; reboot"]


@pytest.mark.parametrize("build", [
    lambda: stack.rollout_command("m", gate=True, recreate=True),
    lambda: stack.promote_command("m", SHA.upper()),
    lambda: stack.rollback_command("m", "abc"),
    lambda: stack.restart_command("m", "last"),
    lambda: stack.probe_command("m", "not-hex", 90, [0, 1]),
    lambda: stack.probe_command("m", KEY, 0, [0, 1]),
    lambda: stack.probe_command("m", KEY, 601, [0, 1]),
    lambda: stack.probe_command("m", KEY, 90, []),
])
def test_the_controller_builds_nothing_the_program_would_refuse(build):
    with pytest.raises(ValueError):
        build()


BAD = [[], ["rollout"], ["rollout", "m", "hold"], ["rollout", "m", "gate", "recreate"], ["down", "m", "x"],
       ["promote", "m"], ["promote", "m", SHA, "x"], ["rollback", "m", "G" * 64], ["restart", "m", "proven", "x"],
       ["probe", "m", KEY, "90"], ["probe", "m", KEY, "9999", "0,1"], ["probe", "m", KEY, "²", "0,1"],
       ["probe", "m", KEY, "90", "0;reboot"], ["probe", "m", KEY, "90", "0,"], ["start", "m"]]


@pytest.mark.parametrize("args", BAD, ids=[" ".join(a) or "nothing" for a in BAD])
def test_the_parser_refuses_a_command_line_it_does_not_know(args):
    with pytest.raises(stack.BadCommandLine) as refused:
        stack.parse_command(args)
    assert str(refused.value) == ("a command and a stack name are needed" if len(args) < 2 else
                                  f"not a command line rigkit-stack knows: {' '.join(args)!r}")


def run_program(tmp_path, *args):
    """The rig's rigkit-stack with the runtime from this checkout; no docker to reach."""
    (tmp_path / "stacks").mkdir(exist_ok=True)
    env = dict(os.environ, RIGKIT_STACKS_DIR=str(tmp_path / "stacks"), RIGKIT_LOCK_DIR=str(tmp_path / "lock"),
               RIGKIT_LIB_DIR=str(REPO / "rigkit"), PATH="/nonexistent")
    run = subprocess.run([sys.executable, str(REPO / "templates" / "serving" / "rigkit-stack"), *args],
                         capture_output=True, text=True, env=env, timeout=30)
    return run.returncode, run.stdout, run.stderr


@pytest.mark.parametrize("command", [c for c, _ in BUILT], ids=[c.split()[1] for c, _ in BUILT])
def test_the_program_takes_each_built_command_line_past_its_parser(tmp_path, command):
    """With no such stack on the rig the program stops at the stack's folder, after the parser accepted
    the line; what it says is read back with the controller's reader of its said lines."""
    code, out, err = run_program(tmp_path, *shlex.split(command)[1:])
    assert code == stack.EXIT_BAD_ARGUMENTS and stack.said_lines(out.splitlines()) == [
        f"no stack named 'm' under {tmp_path / 'stacks'}"], out + err


@pytest.mark.parametrize("args", BAD[1:4], ids=[" ".join(a) for a in BAD[1:4]])
def test_the_program_refuses_a_bad_command_line_with_exit_code_2_and_its_usage(tmp_path, args):
    code, out, err = run_program(tmp_path, *args)
    assert code == 2 == stack.EXIT_BAD_ARGUMENTS and out == ""
    assert err.startswith("rigkit-stack: ") and "rigkit-stack rollout NAME gate" in err, err


def test_down_of_an_empty_stack_folder_needs_no_docker(tmp_path):
    (tmp_path / "stacks" / "m").mkdir(parents=True)
    code, out, _ = run_program(tmp_path, *shlex.split(stack.down_command("m"))[1:])
    assert code == stack.EXIT_READY and stack.said_lines(out.splitlines()) == ["removed stack m"]
    assert not (tmp_path / "stacks" / "m").exists()


def test_the_exit_codes_are_the_documented_ones():
    """The program's docstring and the contract's names say the same numbers."""
    assert (stack.EXIT_READY, stack.EXIT_FAILED, stack.EXIT_BAD_ARGUMENTS, stack.EXIT_ROLLED_BACK, stack.EXIT_LOCKED,
            stack.EXIT_REFUSED, stack.EXIT_P2P_FAILED) == (0, 1, 2, 3, 4, 5, 6)
    doc = (REPO / "templates" / "serving" / "rigkit-stack").read_text()
    assert "Exit codes: 0 ready" in doc and "6 the P2P check failed" in doc


def test_the_stack_files_are_found_by_name():
    assert stack.stack_file("m", stack.GATE_PENDING_FILE) == "/etc/rigkit/stacks/m/gate.pending"
    assert stack.stack_dir("m", "/tmp/stacks") == "/tmp/stacks/m"
    assert set(stack.STACK_FILES) == {"compose.yml", "compose.next.yml", "stack.json", "stack.next.json",
                                      "compose.failed.yml"}
