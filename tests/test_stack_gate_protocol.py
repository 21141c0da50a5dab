"""rigkit-stack's side of the rollout gate, run as a program on this machine without Docker: the verdict
commands refuse what they cannot stand behind before any `docker compose` call. Simulated: a stack folder
in a temporary directory (RIGKIT_STACKS_DIR), the lock folder likewise; the runtime from this checkout."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys

import pytest

from tests.conftest import REPO

SCRIPT = REPO / "templates" / "serving" / "rigkit-stack"


def stack(tmp_path, held: str | None):
    folder = tmp_path / "stacks" / "m"
    folder.mkdir(parents=True)
    (folder / "compose.next.yml").write_text("services: {}\n")
    (folder / "stack.next.json").write_text(json.dumps({"project": "rigkit-m", "port": 1, "served_model_name": "m",
                                                        "ready_timeout_s": 30}))
    if held:
        (folder / "gate.pending").write_text(held + "\n")
    return folder


def wanted_sha(folder) -> str:
    digest = hashlib.sha256()
    for name in ("compose.next.yml", "stack.next.json"):
        digest.update((folder / name).read_bytes() + b"\0")
    return digest.hexdigest()


def helper(tmp_path, *args):
    env = dict(os.environ, RIGKIT_STACKS_DIR=str(tmp_path / "stacks"), RIGKIT_LOCK_DIR=str(tmp_path / "lock"),
               RIGKIT_LIB_DIR=str(REPO / "rigkit"), PATH="/nonexistent")  # no docker to reach
    run = subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, env=env, timeout=30)
    return run.returncode, run.stdout + run.stderr


def test_promote_refuses_files_that_are_not_the_ones_gated(tmp_path):
    folder = stack(tmp_path, held=None)
    sha = wanted_sha(folder)
    code, out = helper(tmp_path, "promote", "m", sha)
    assert code == 5 and "no candidate of rigkit-m is held for the gate" in out, out
    (folder / "gate.pending").write_text(sha + "\n")
    (folder / "compose.next.yml").write_text("services: {changed: {}}\n")  # a deploy rewrote it since
    code, out = helper(tmp_path, "promote", "m", sha)
    assert code == 5 and "are not the ones gated" in out, out
    (folder / "compose.next.yml").write_text("services: {}\n")
    code, out = helper(tmp_path, "promote", "m", sha)  # the files match, but nothing answers on its port
    assert code == 5 and "candidate no longer answers" in out, out
    assert not (folder / "compose.yml").exists()  # nothing promoted


def test_restart_refuses_a_candidate_that_is_not_the_one_gated_before_any_compose_call(tmp_path):
    """The gate's second look restarts only the candidate it measured: none held, or files rewritten since."""
    folder = stack(tmp_path, held=None)
    sha = wanted_sha(folder)
    code, out = helper(tmp_path, "restart", "m", sha)
    assert code == 5 and "held candidate is not the one gated" in out and "held none" in out, out
    (folder / "gate.pending").write_text(sha + "\n")
    (folder / "compose.next.yml").write_text("services: {changed: {}}\n")  # a deploy rewrote it since
    code, out = helper(tmp_path, "restart", "m", sha)
    assert code == 5 and f"held {sha[:12]}, wanted now {wanted_sha(folder)[:12]}" in out, out
    assert "restarting" not in out
    code, out = helper(tmp_path, "restart", "m", "proven")  # a candidate is held, nothing is proven
    assert code == 5 and "does not serve its last proven config" in out, out


@pytest.mark.parametrize("args", [["promote", "m"], ["promote", "m", "abc"], ["rollback", "m", "G" * 64],
                                  ["restart", "m"], ["restart", "m", "abc"], ["restart", "m", "proven", "x"],
                                  ["rollout", "m", "hold"], ["down", "m", "x"]])
def test_a_command_line_it_does_not_know_is_refused_with_its_usage(tmp_path, args):
    stack(tmp_path, held=None)
    code, out = helper(tmp_path, *args)
    assert code == 2 and "rigkit-stack promote NAME SHA256" in out, out
