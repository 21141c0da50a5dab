"""`rigkit deploy`, `verify` and `rollout` pass pyinfra's --diff, -v/-vv, --serial and --parallel N
through: the pyinfra command line each one builds, and pyinfra itself taking them (an inventory
whose one rig refuses the connection at once, so nothing is reached). Offline: no rig, no Docker."""

from __future__ import annotations

import subprocess
import sys
from types import SimpleNamespace

import pytest

from rigkit import cli
from rigkit.gateway import rollout
from rigkit.plumbing import pyinfra_command
from rigkit.preflight import inventory_check
from tests.conftest import REPO

FLAGS = [
    ([], []),
    (["--diff"], ["--diff"]),
    (["-v"], ["-v"]),
    (["-vv"], ["-vv"]),
    (["-v", "-v", "-v"], ["-vvv"]),
    (["--serial"], ["--serial"]),
    (["--parallel", "3"], ["--parallel", "3"]),
    (["--diff", "-vv", "--parallel", "2"], ["--diff", "-vv", "--parallel", "2"]),
]


@pytest.fixture
def pyinfra_argv(monkeypatch):
    """The argv `rigkit deploy`/`verify` hand to pyinfra, instead of running it."""
    seen: list[list[str]] = []
    monkeypatch.setattr(inventory_check, "reached_rigs",  # the offline checks
                        lambda command, inventory, limit, whole_fleet, **checks: ["rig1"])
    monkeypatch.setattr(pyinfra_command, "run_here", lambda argv, command: seen.append(argv) or 0)
    return seen


@pytest.mark.parametrize(("given", "passed"), FLAGS)
def test_deploy_passes_pyinfra_flags_through(pyinfra_argv, given, passed):
    assert cli.main(["deploy", "inv.py", "--limit", "rig1", *given]) == 0
    assert pyinfra_argv == [["-y", "--limit", "rig1", *passed, "inv.py", "deploy.py"]]


@pytest.mark.parametrize(("given", "passed"), FLAGS)
def test_verify_passes_pyinfra_flags_through(pyinfra_argv, given, passed):
    assert cli.main(["verify", "inv.py", *given]) == 0
    assert pyinfra_argv == [["-y", "--data", "rigkit_verify=always", *passed, "inv.py", "verify.py"]]


def test_dry_and_the_run_switches_keep_their_place(pyinfra_argv):
    assert cli.main(["deploy", "inv.py", "--dry", "--no-verify", "--diff", "-v"]) == 0
    assert pyinfra_argv == [["--dry", "--data", "rigkit_verify=never", "--diff", "-v", "inv.py", "deploy.py"]]


@pytest.mark.parametrize(("given", "passed"), FLAGS)
def test_rollout_passes_pyinfra_flags_to_each_rig_s_deploy(monkeypatch, given, passed):
    ran: list[list[str]] = []
    monkeypatch.setattr(inventory_check, "reached_rigs",
                        lambda command, inventory, limit, whole_fleet, **checks: ["rig-a", "rig-b"])
    monkeypatch.setattr(rollout, "load_inventory", lambda inventory: [])  # no host has `gateway`: nothing to drain
    monkeypatch.setattr(rollout.subprocess, "run", lambda command: ran.append(command) or SimpleNamespace(returncode=0))
    assert cli.main(["rollout", "inv.py", *given]) == 0
    outcomes = [command[command.index("--data") + 1] for command in ran]
    assert all(o.startswith("rigkit_rollout_outcome=") for o in outcomes) and len(set(outcomes)) == 2
    assert ran == [[*pyinfra_command.PYINFRA, "-y", "--data", outcome, *passed, "--limit", rig, "inv.py", "deploy.py"]
                   for rig, outcome in zip(("rig-a", "rig-b"), outcomes)]


def test_serial_and_parallel_exclude_each_other(capsys):
    with pytest.raises(SystemExit) as exit:
        cli.main(["deploy", "inv.py", "--serial", "--parallel", "2"])
    assert exit.value.code == 2
    assert "not allowed with argument" in capsys.readouterr().err


def test_help_names_the_pass_through_flags(capsys):
    for command in ("deploy", "verify", "rollout"):
        with pytest.raises(SystemExit):
            cli.main([command, "--help"])
        text = capsys.readouterr().out
        assert all(flag in text for flag in ("--diff", "-v", "--serial", "--parallel N")), command


@pytest.mark.parametrize("command", ["deploy", "verify"])
def test_pyinfra_takes_the_flags(tmp_path, command):
    """pyinfra's own parser accepts what rigkit passes (it goes on to connect; the rig refuses at once),
    and refuses a flag it does not know: so the run proves the flags reached it."""
    inventory = tmp_path / "inv.py"
    inventory.write_text('rigs = [("rig-x", {"ssh_hostname": "127.0.0.1", "ssh_port": 1, '
                         f'"rig_file": "{REPO / "tests/data/rigs/serving.yml"}", '
                         f'"catalog_dir": "{REPO / "tests/data/models"}"}})]\n')
    run = subprocess.run([sys.executable, "-m", "rigkit.cli", command, str(inventory), "--diff", "-vv", "--parallel", "2"],
                         cwd=REPO, capture_output=True, text=True, timeout=120)
    out = run.stdout + run.stderr
    assert "Connecting to hosts" in out and "No hosts remaining" in out, out
    assert "No such option" not in out and "Usage:" not in out, out
    refused = subprocess.run([sys.executable, "-m", "rigkit.plumbing.pyinfra_start", "--no-such-flag", str(inventory),
                              f"{command}.py"], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert refused.returncode != 0 and "No such option" in refused.stdout + refused.stderr
