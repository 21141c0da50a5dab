"""deploy.py end to end: the real pyinfra CLI over real SSH to the simulated rig.

Simulated: the GPUs behind nvidia-smi (tests/simrig/nvidia-smi).
"""

from __future__ import annotations

import hashlib

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


def test_runtime_modules_edited_on_the_rig_are_put_back_by_one_operation_and_the_keeper_restarts(simrig):
    """The rig-side runtime ships as one operation (rigkit.plumbing.files.put_all): a module edited by hand and
    one whose mode was changed are both put back, the operation counts as one change, and the GPU
    policy keeper, which imports the runtime, is restarted; the next deploy changes nothing."""
    from rigkit.rigside.names import RUNTIME_DIR
    from roles.rigside import runtime_files

    assert run_deploy(simrig, verify=False).returncode == 0
    code, out = simrig.exec(f"echo '# edited' >> {RUNTIME_DIR}/probe.py && chmod 600 {RUNTIME_DIR}/lock.py")
    assert code == 0, out
    run = run_deploy(simrig, verify=False)
    assert run.returncode == 0, run.output
    results = run.output.split("--> Results:", 1)[1]
    runtime = [line for line in results.splitlines() if "Rig-side runtime:" in line]
    assert len(runtime) == 1 and runtime[0].split()[-4:] == ["1", "1", "-", "-"], runtime
    assert "Restart the GPU policy keeper (new version)" in results
    assert run.changed_operations() == 2, results
    expected = runtime_files()
    for name in ("probe.py", "lock.py"):
        code, out = simrig.exec(f"stat -c %a {RUNTIME_DIR}/{name} && sha256sum {RUNTIME_DIR}/{name}")
        mode, digest = out.split()[:2]
        assert (mode, digest) == ("644", hashlib.sha256(expected[f"{RUNTIME_DIR}/{name}"]).hexdigest()), out
    assert run_deploy(simrig, verify=False).changed_operations() == 0
