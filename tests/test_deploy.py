"""deploy.py end to end: the real pyinfra CLI over real SSH to the simulated rig.

Simulated: the GPUs behind nvidia-smi (tests/simrig/nvidia-smi).
"""

from __future__ import annotations

import pytest

from tests.conftest import OPERATIONS_STARTED, POLICY_RIG, run_deploy

SIM_RIG = POLICY_RIG.read_text()

pytestmark = pytest.mark.simrig


def test_deploy_reads_gpu_facts_over_ssh(simrig):
    run = run_deploy(simrig)
    assert run.returncode == 0, run.output
    assert "[sim-rig] Connected" in run.output
    assert OPERATIONS_STARTED in run.output  # the line the refusal tests look for, as pyinfra prints it
    assert "GPU 0: NVIDIA GeForce RTX 4090" in run.output
    assert "GPU 1: NVIDIA GeForce RTX 4090" in run.output


def test_bad_config_stops_before_any_operation(simrig, tmp_path):
    bad = tmp_path / "bad.yml"
    bad.write_text(SIM_RIG.replace("power_limit_w: 330", "power_limit_w: 900", 1))
    run = run_deploy(simrig, bad)
    assert run.returncode != 0
    assert "gpus[0].power_limit_w: 900: 900 W is outside 150-600 W" in run.output
    assert "nothing was changed on any rig" in run.output
    assert OPERATIONS_STARTED not in run.output


def test_deploy_refuses_a_rig_whose_gpus_differ_from_its_file(simrig, tmp_path):
    three = tmp_path / "three.yml"
    third = "  - index: 2\n    model: RTX 4090\n    power_limit_w: 330\n"
    three.write_text(SIM_RIG.replace("# The simulated rig shares", third + "# The simulated rig shares"))
    run = run_deploy(simrig, three)
    assert run.returncode != 0
    assert "GPU 2 is in the rig file, but the rig reports GPUs: 0, 1" in run.output
