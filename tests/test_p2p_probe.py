"""The active P2P check without Docker: its key (rigkit.topology.probe), its command line
(rigkit.rigside.stack), and the script that runs in the model's container
(templates/serving/rigkit-p2p-probe.py) run here with the torch stand-in (tests/vllm_standin/torch: TEST
INFRASTRUCTURE; it simulates the GPUs of NVIDIA_VISIBLE_DEVICES and the faults of a gpus.json's
topology.p2p_faults: a copy that never returns, one byte changed). The deploy's own runs are in
tests/test_serving.py; the rig side's reading of the script's output is tested here too."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import time
from dataclasses import replace

import pytest

from rigkit.config.loader import load_rig
from rigkit.rigside import p2p, stack
from rigkit.topology.decide import PairRow, Verdict
from rigkit.topology.probe import probe_key
from tests.conftest import REPO, SERVING_RIG, copy_catalog

SCRIPT = REPO / "templates" / "serving" / "rigkit-p2p-probe.py"


def run_probe(tmp_path, faults: dict | None, *args: str, timeout_s: float = 60):
    (tmp_path / "gpus.json").write_text(json.dumps({"gpus": [{}, {}], "topology": {"p2p_faults": faults or {}}}))
    env = dict(os.environ, PYTHONPATH=str(REPO / "tests" / "vllm_standin"), NVIDIA_VISIBLE_DEVICES="0,1",
               STANDIN_TORCH_GPU_DIR=str(tmp_path))
    return subprocess.run([sys.executable, str(SCRIPT), "--gpus", "0,1", "--bytes", "65536", *args],
                          capture_output=True, text=True, timeout=timeout_s, env=env, cwd=tmp_path)


def test_the_check_passes_on_working_gpus_with_each_direction_and_the_all_reduce(tmp_path):
    done = run_probe(tmp_path, None, "--floats", "4096")
    assert done.returncode == 0, done.stdout + done.stderr
    verdict = p2p.verdict_of(done.stdout)
    assert verdict["ok"] and [s["step"] for s in verdict["pairs"]] == [
        "copy GPU0->GPU1", "copy GPU1->GPU0", "all-reduce GPU0+GPU1"]


def test_a_hung_copy_is_ended_by_the_step_bound_naming_the_pair(tmp_path):
    began = time.monotonic()
    done = run_probe(tmp_path, {"0-1": "hang"}, "--step-timeout-s", "1")
    assert time.monotonic() - began < 10  # bounded by the step's 1 s, not by the test's timeout
    assert done.returncode == 3
    verdict = p2p.verdict_of(done.stdout)
    assert verdict["failed"] == "copy GPU0->GPU1" and "did not finish within 1 s (hung)" in verdict["why"]
    assert p2p.last_step(done.stdout) == "copy GPU0->GPU1"


def test_wrong_bytes_are_refused_naming_the_pair(tmp_path):
    done = run_probe(tmp_path, {"0-1": "wrong_bytes"})
    assert done.returncode == 1
    assert p2p.verdict_of(done.stdout)["why"] == "copy GPU0->GPU1: the bytes read back differ from the bytes sent"


@pytest.mark.parametrize("bad", [["--bytes", "100"], ["--floats", "0"], ["--step-timeout-s", "-1"]])
def test_bad_arguments_are_refused(tmp_path, bad):
    assert run_probe(tmp_path, None, *bad).returncode == 2


def test_the_torch_stand_in_refuses_without_the_simulated_rig(tmp_path):
    env = dict(os.environ, PYTHONPATH=str(REPO / "tests" / "vllm_standin"), NVIDIA_VISIBLE_DEVICES="0,1")
    env.pop("STANDIN_TORCH_GPU_DIR", None)
    done = subprocess.run([sys.executable, str(SCRIPT), "--gpus", "0,1"], capture_output=True, text=True,
                          timeout=60, env=env)
    assert done.returncode != 0 and "no simulated GPUs" in done.stderr


def _tp2(tmp_path):
    catalog = copy_catalog(tmp_path, test_alpha=[("gpus: [0]\n", "gpus: [0, 1]\nparallel: {tensor: 2}\n")])
    rig_file = tmp_path / "alpha-only.yml"
    rig_file.write_text(SERVING_RIG.read_text().replace("models: [test-alpha, test-beta]", "models: [test-alpha]"))
    (model,) = load_rig(rig_file, catalog).models
    return model


def test_the_key_follows_the_topology_image_and_nccl_environment_only(tmp_path):
    model = _tp2(tmp_path)
    verdict = Verdict("test-alpha", (0, 1), pairs=[PairRow(0, 1, "PHB", "GNS", 31.5)], env={"NCCL_P2P_DISABLE": "1"})
    key = probe_key(model, verdict)
    assert len(key) == 64 and key == probe_key(model, verdict)
    idle = replace(verdict, warnings=["test-alpha: GPU 1 link trained x8 of x16 (look again under load)"])
    assert probe_key(model, idle) == key  # idle link training is not the topology
    assert probe_key(model, replace(verdict, pairs=[PairRow(0, 1, "PHB", "OK", 31.5)])) != key
    assert probe_key(model, replace(verdict, env={})) != key
    assert probe_key(replace(model, spec=model.spec.model_copy(update={"image": "other:1"})), verdict) != key
    with_debug = model.spec.model_copy(update={"env": {**model.spec.env, "NCCL_DEBUG": "INFO"}})
    assert probe_key(replace(model, spec=with_debug), verdict) != key
    unrelated = model.spec.model_copy(update={"env": {**model.spec.env, "VLLM_LOGGING_LEVEL": "DEBUG"}})
    assert probe_key(replace(model, spec=unrelated), verdict) == key
    assert probe_key(model, None) != key  # topology not read: a key of its own


def test_the_command_line_is_the_one_rigkit_stack_accepts(tmp_path):
    """The controller builds it and rigkit-stack parses it with the one contract (rigkit.rigside.stack)."""
    model = _tp2(tmp_path)
    command = stack.probe_command(model.name, "a" * 64, 90, model.spec.gpus)
    assert command == f"/usr/local/sbin/rigkit-stack probe test-alpha {'a' * 64} 90 0,1"
    parsed = stack.parse_command(shlex.split(command)[1:])
    assert parsed == stack.StackCommand("probe", "test-alpha", key="a" * 64, timeout_s=90, gpus=(0, 1))
    for bad in (["0;reboot"], ["0,1", "x"]):
        with pytest.raises(stack.BadCommandLine):
            stack.parse_command(["probe", "test-alpha", "a" * 64, "90", *bad])
    with pytest.raises(stack.BadCommandLine):
        stack.parse_command(["probe", "test-alpha", "a" * 64, "9999", "0,1"])
    with pytest.raises(ValueError):  # the controller never builds what the rig would refuse
        stack.probe_command(model.name, "a" * 64, 9999, model.spec.gpus)


def test_the_rig_side_reads_the_last_step_and_the_verdict():
    output = "STEP start CUDA\nSTEP copy GPU0->GPU1\nnoise\n"
    assert p2p.last_step(output) == "copy GPU0->GPU1" and p2p.verdict_of(output) is None
    assert p2p.verdict_of(output + 'RESULT {"ok": true, "pairs": []}\n') == {"ok": True, "pairs": []}


def test_the_deploy_reads_the_kept_passes_as_keys_and_nothing_as_none_kept():
    from rigkit.serving.facts import P2pVerdicts

    assert P2pVerdicts.default() == set()  # pyinfra answers an empty output with the default
    key = "b" * 64
    assert P2pVerdicts().process([f"{key}.json", f"{key}.json.tmp", "notes.txt"]) == {key}
