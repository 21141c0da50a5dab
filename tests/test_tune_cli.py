"""`rigkit tune`'s bad input: one clear line naming the option or file, exit 2, no traceback, and
nothing reached (the inventory points at a port where no rig listens: any attempt would show as a
connection error instead of the message). Pure; no Docker."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.conftest import REPO

RIG = REPO / "tests" / "data" / "tune" / "rigs" / "tune.yml"


def tune(*args: str, rig_file=RIG) -> subprocess.CompletedProcess:
    env = dict(os.environ, RIGKIT_SIM_PORT="1", RIGKIT_RIG_FILE=str(rig_file),
               RIGKIT_CATALOG_DIR=str(REPO / "tests" / "data" / "tune" / "models"))
    return subprocess.run([sys.executable, "-m", "rigkit.cli", "tune", *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("args, said", [
    (("--rig", "nope", "--model", "tune-sim", "--power-limits", "200,250"), "--rig 'nope': not in inventory/sim.py"),
    (("--rig", "sim-rig", "--model", "other", "--power-limits", "200,250"), "--model 'other': rig sim-rig"),
    (("--rig", "sim-rig", "--model", "tune-sim", "--power-limits", "250:200:25"), "start 250 is above stop 200"),
    (("--rig", "sim-rig", "--model", "tune-sim", "--power-limits", "200,abc"), "'abc' is not a whole number"),
    (("--rig", "sim-rig", "--model", "tune-sim", "--power-limits", "200", "--objective", "fast"), "--objective 'fast'"),
    (("--rig", "sim-rig", "--model", "tune-sim", "--power-limits", "200", "--objective", "response-time"),
     "needs --workload"),
    (("--rig", "sim-rig", "--model", "tune-sim"), "nothing to sweep"),
    (("--rig", "sim-rig", "--model", "tune-sim", "--hold", "--write"), "nothing to --write"),
    (("--rig", "sim-rig", "--model", "tune-sim", "--power-limits", "200", "--deadman-s", "2"), "--deadman-s 2"),
    (("--rig", "sim-rig", "--model", "tune-sim", "--power-limits", "200", "--repeats", "0"), "--repeats '0'"),
    # counted before a list is built: a huge range is refused at once, not after filling memory
    (("--rig", "sim-rig", "--model", "tune-sim", "--power-limits", "1:999999999:1"), "999999999 values; at most 40"),
])
def test_bad_options_are_refused_with_one_line_before_any_rig_is_reached(args, said):
    run = tune("inventory/sim.py", *args)
    assert run.returncode == 2, run.stderr
    assert said in run.stderr and "Traceback" not in run.stderr
    assert "cannot reach" not in run.stderr


def test_a_bad_rig_file_is_named(tmp_path):
    bad = tmp_path / "rigs" / "bad.yml"
    bad.parent.mkdir()
    bad.write_text(RIG.read_text().replace("psu_w: 800", "psu_w: lots"))
    run = tune("inventory/sim.py", "--rig", "sim-rig", "--model", "tune-sim", "--power-limits", "200", rig_file=bad)
    assert run.returncode == 2 and "psu_w" in run.stderr and "Traceback" not in run.stderr


def test_a_missing_inventory_is_named():
    run = tune("inventory/none.py", "--rig", "sim-rig", "--model", "tune-sim", "--power-limits", "200")
    assert run.returncode == 2 and "inventory/none.py: no such inventory file" in run.stderr


def test_an_inventory_that_does_not_load_is_named_in_one_line(tmp_path):
    broken = tmp_path / "inventory.py"
    broken.write_text("rigs = [(\n")
    run = tune(str(broken), "--rig", "sim-rig", "--model", "tune-sim", "--power-limits", "200")
    assert run.returncode == 2 and f"{broken}: cannot be loaded: SyntaxError" in run.stderr
    assert "Traceback" not in run.stderr


def test_a_bad_verify_switch_in_the_inventory_is_one_line(tmp_path):
    inventory = tmp_path / "inventory.py"
    inventory.write_text(f'rigs = [("sim-rig", {{"ssh_hostname": "127.0.0.1", "ssh_port": 1, "rig_file": "{RIG}", '
                         f'"catalog_dir": "{REPO / "tests" / "data" / "tune" / "models"}", "rigkit_verify": "nevr"}})]\n')
    run = tune(str(inventory), "--rig", "sim-rig", "--model", "tune-sim", "--power-limits", "200")
    assert run.returncode == 2 and "rigkit_verify is 'nevr'; allowed: after-changes, always, never" in run.stderr
    assert "Traceback" not in run.stderr


@pytest.mark.parametrize("flags, said", [
    (("--power-limits", "٣00"), "--power-limits '٣00': '٣00' is not a whole number (ASCII digits)"),
    (("--power-limits", "300", "--prompt-tokens", "٣"), "argument --prompt-tokens: '٣' is not a whole number"),
    (("--power-limits", "300", "--json", "/nonexistent/x.json"), "--json '/nonexistent/x.json': its folder /nonexistent "
                                                                 "does not exist"),
])
def test_non_ascii_digits_and_an_unwritable_json_path_are_refused_before_any_rig(flags, said, tmp_path):
    """Offline: one line, exit 2, before the inventory's rig is reached (its SSH port is closed)."""
    import subprocess
    import sys

    from tests.conftest import REPO

    inventory = tmp_path / "inv.py"
    inventory.write_text("rigs = [('sim-rig', {'ssh_hostname': '127.0.0.1', 'ssh_port': 9})]\n")
    run = subprocess.run([sys.executable, "-m", "rigkit.cli", "tune", str(inventory), "--rig", "sim-rig",
                          "--model", "tune-sim", *flags], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert run.returncode == 2, run.stdout + run.stderr
    assert said in run.stderr and "Traceback" not in run.stderr, run.stderr
    assert len(run.stderr.strip().splitlines()) == 1, run.stderr
