"""rigkit/plumbing/pyinfra_start.py: pyinfra's command line with a shorter start, otherwise the same.

Nothing is simulated: each check runs a fresh Python process, as `rigkit deploy` does, with the
installed pyinfra, gevent and paramiko.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

COUNT_SCANS = """
import importlib.metadata as metadata, sys
calls = []
original = metadata.entry_points
def counting(**params):
    calls.append(tuple(sorted(params.items())))
    return original(**params)
metadata.entry_points = counting
if sys.argv[1] == "rigkit":
    from rigkit.plumbing.pyinfra_start import import_on_first_use, read_entry_points_once
    read_entry_points_once()
    import_on_first_use("invoke")
import pyinfra_cli.main  # gevent's patch_all(), as pyinfra's CLI runs it
from pyinfra.api.connectors import get_all_connectors
connectors = sorted(get_all_connectors())
print(len(calls), len(set(calls)), "winssh" in connectors, type(sys.modules["invoke"]).__name__)
"""


def _python(code: str, *args: str) -> str:
    run = subprocess.run([sys.executable, "-c", code, *args], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stdout + run.stderr
    return run.stdout.split()


def test_each_entry_point_group_is_scanned_once_and_invoke_waits():
    scans, groups, has_winssh, invoke = _python(COUNT_SCANS, "plain")
    assert int(scans) > int(groups)  # pyinfra's own start scans some groups again and again
    assert has_winssh == "True" and invoke == "module"
    scans, groups, has_winssh, invoke = _python(COUNT_SCANS, "rigkit")
    assert (scans, groups) == ("1", "1")  # the distributions scanned once, for every group
    assert has_winssh == "True"  # rigkit's connector is still found through its entry point
    assert invoke == "_LoadedOnFirstUse"


def test_answers_from_the_one_scan_are_the_scans_of_each_group():
    code = """
import importlib.metadata as metadata
original = metadata.entry_points
from rigkit.plumbing.pyinfra_start import read_entry_points_once
read_entry_points_once()
asked = [{"group": g} for g in ("gevent.plugins.monkey.will_patch_all", "pyinfra.connectors", "pydantic",
                                "typeguard.checker_lookup", "console_scripts", "no.such.group")]
asked.append({"group": "console_scripts", "name": "pyinfra"})
print(all(metadata.entry_points(**p) == original(**p) for p in asked + asked), len(original(group="console_scripts")) > 0)
"""
    assert _python(code) == ["True", "True"]


def test_ssh_config_match_exec_still_runs_its_command():
    """paramiko needs invoke for one thing: `Match exec` in an OpenSSH config file."""
    code = """
import sys
from rigkit.plumbing.pyinfra_start import import_on_first_use
import_on_first_use("invoke")
import paramiko
config = paramiko.SSHConfig.from_text('Match exec "test 1 = 1"\\n  User yes-matched\\nMatch exec "false"\\n  Port 2299\\n')
found = config.lookup("rig")
print(found.get("user"), found.get("port", "none"), hasattr(sys.modules["invoke"], "run"))
"""
    assert _python(code) == ["yes-matched", "none", "True"]


def test_same_answers_and_exit_codes_as_pyinfra():
    def run(module: str, *args: str) -> tuple[int, str]:
        done = subprocess.run([sys.executable, "-m", module, *args], cwd=REPO, capture_output=True, text=True,
                              timeout=120)
        return done.returncode, done.stdout + done.stderr

    assert run("rigkit.plumbing.pyinfra_start", "--version") == run("pyinfra", "--version")
    ours, theirs = run("rigkit.plumbing.pyinfra_start", "--no-such-option"), run("pyinfra", "--no-such-option")
    assert ours[0] == theirs[0] == 2
    # The same error; click's usage line names the module it was started as.
    assert ours[1].splitlines()[-1] == theirs[1].splitlines()[-1] == "Error: No such option '--no-such-option'."


def test_a_run_interrupted_by_ctrl_c_exits_130_not_0():
    """pyinfra's own Ctrl-C handler exits 0, so `rigkit deploy && next` would go on. Real pyinfra on
    @local (a local shell, no rig), SIGINT sent once its operation runs."""
    import signal
    import time

    run = subprocess.Popen([sys.executable, "-m", "rigkit.plumbing.pyinfra_start", "-y", "@local", "tests/data/deploys/sleep.py"],
                           cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    said = []
    deadline = time.monotonic() + 60
    for line in run.stdout:  # until the operation has started (bounded: the deploy ends by itself)
        said.append(line)
        if "Starting operation: rigkit-test: sleep" in line or time.monotonic() > deadline:
            break
    run.send_signal(signal.SIGINT)
    rest, _ = run.communicate(timeout=60)
    assert "Starting operation: rigkit-test: sleep" in "".join(said), "".join(said) + rest
    assert run.returncode == 130, "".join(said) + rest


def test_an_interrupt_whose_shutdown_fails_still_exits_130_without_a_traceback():
    """Simulates pyinfra's CLI (a stand-in for `pyinfra_cli.main.main`, the one thing replaced):
    its SIGINT handler exits 0, then its `finally` disconnect fails with gevent's LoopExit, as
    one full test run saw (a race in pyinfra's Ctrl-C handling that a test cannot time)."""
    code = """
import os, signal, sys, time
import pyinfra_cli.main
from gevent.exceptions import LoopExit

def pyinfra_cli_stand_in():
    def handler(signum, frame):
        print("Exiting upon user request!")
        sys.exit(0)
    signal.signal(signal.SIGINT, handler)
    try:
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(5)  # the handler's SystemExit(0) comes first
    finally:
        raise LoopExit("This operation would block forever")  # what pyinfra's disconnect_all raised

pyinfra_cli.main.main = pyinfra_cli_stand_in
from rigkit.plumbing.pyinfra_start import main
main([])
"""
    run = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert run.returncode == 130, run.stdout + run.stderr
    assert "Exiting upon user request!" in run.stdout and "Traceback" not in run.stderr, run.stderr
