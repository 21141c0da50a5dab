"""rigkit.plumbing.facts_once.read_ahead through the real pyinfra CLI, on its @local connector.

Nothing is simulated: pyinfra runs tests/data/deploys/read_ahead.py against this machine
(@local: real shell commands, no SSH), started the way `rigkit deploy` starts it.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from rigkit.plumbing.facts_once import READ_AHEAD_CHANNELS

REPO = Path(__file__).resolve().parents[1]


def test_facts_read_ahead_are_asked_at_once_and_a_failure_raises_where_asked(tmp_path):
    """Two facts that each wait (at most 10 s) for the other to start both answer "met" only
    when they run at the same time; asked one after the other the first would answer "alone"."""
    run = subprocess.run(
        [sys.executable, "-m", "rigkit.plumbing.pyinfra_start", "-y", "@local", "tests/data/deploys/read_ahead.py"],
        cwd=REPO, env={"PATH": "/usr/bin:/bin", "RIGKIT_TEST_MEET_DIR": str(tmp_path)},
        capture_output=True, text=True, timeout=120,
    )
    output = run.stdout + run.stderr
    assert run.returncode == 0, output
    assert "rigkit-test: a met, b met" in output
    assert "rigkit-test: Fails raised where asked: ValueError" in output
    assert "Traceback" not in output and "Greenlet" not in output  # the greenlet itself did not fail
    # Twelve read ahead at once run at most READ_AHEAD_CHANNELS at a time: sshd refuses sessions past
    # its MaxSessions (4 in hardened configs).
    most = int(output.split("rigkit-test: most at once ", 1)[1].split()[0])
    assert 1 <= most <= READ_AHEAD_CHANNELS
    # Questions of a fact with `merged_over` are one command for the union of their names; each
    # question is answered with its own names only; another value of another argument is its own read.
    assert "rigkit-test: present ['a'] ['a', 'b'] []" in output
    assert (tmp_path / "present.log").read_text().split("\n") == ["a x b", ""]
    assert (tmp_path / "other.log").read_text() == "c\n"
    # A merged read that failed raises for each of its questions, and is read again when asked ahead again.
    assert "rigkit-test: fails once: raised raised; read ahead again: p q" in output
