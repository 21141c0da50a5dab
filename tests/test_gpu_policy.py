"""Role gpu_policy end to end: pyinfra over SSH, systemd in the simulated rig, reboots.

Simulated: the GPUs behind nvidia-smi (tests/simrig/nvidia-smi), which forget their
settings on reboot like the real driver. Every assertion on GPU state reads the
simulated GPU's stored state directly (SimRig.gpu_state), not through rigkit.
"""

from __future__ import annotations

import pytest

from tests.conftest import keeper_held_off, OPERATIONS_STARTED, POLICY_RIG, run_deploy

pytestmark = pytest.mark.simrig

SIM_RIG = POLICY_RIG.read_text()
JOURNAL = "journalctl -u rigkit-gpu-policy -o cat --no-pager"


@pytest.fixture(scope="module")
def rig(fresh_rig):
    return fresh_rig  # pristine: no policy installed, GPUs at defaults


def variant(tmp_path, name, text):
    path = tmp_path / f"{name}.yml"
    path.write_text(text)
    return path


def limits(rig):
    return [g["power_limit_w"] for g in rig.gpu_state()]


def locks(rig):
    return [g["clock_lock"] for g in rig.gpu_state()]


@pytest.mark.parametrize(
    "replacements, message",
    [
        (
            [("power_limit_w: 330", "power_limit_w: 440"), ("psu_w: 1200", "psu_w: 1100")],
            "PSU budget: GPU caps 440 + 330 W + 200 W system = 970 W on a 1100 W PSU leaves 130 W (12%) free",
        ),
        # 500 W is within the 4090 reference range (the config passes) but not what this rig reports.
        ([("power_limit_w: 330", "power_limit_w: 500")], "GPU 0: power_limit_w 500 W is outside 150-450 W, the range this"),
        ([("[0, 2200]", "[2200, 0]")], "floor 2200 MHz is above ceiling 0 MHz"),
    ],
    ids=["psu-budget", "range-reported-by-rig", "floor-above-ceiling"],
)
def test_bad_input_is_refused_before_any_file_is_written(rig, tmp_path, replacements, message):
    text = SIM_RIG
    for old, new in replacements:
        text = text.replace(old, new, 1)
    run = run_deploy(rig, variant(tmp_path, "bad", text))
    assert run.returncode != 0
    assert message in run.output
    assert OPERATIONS_STARTED not in run.output
    assert rig.exec("test -e /etc/rigkit || test -e /etc/systemd/system/rigkit-gpu-policy.service")[0] != 0
    assert rig.exec("test -e /run/nvidia-sim/calls.log")[0] != 0  # no GPU setting was touched


def test_psu_override_is_logged_and_allowed(rig, tmp_path):
    over = SIM_RIG.replace("power_limit_w: 330", "power_limit_w: 440").replace("psu_w: 1200", "psu_w: 1100")
    # The check runs before any change; dry-run (--dry) so this test changes nothing.
    run = run_deploy(rig, variant(tmp_path, "over", over + "psu_budget_override: true\n"), "--dry")
    assert run.returncode == 0, run.output
    assert "PSU budget override in" in run.output


def test_deploy_applies_caps_and_locks_then_changes_nothing(rig):
    first = run_deploy(rig)
    assert first.returncode == 0, first.output
    assert limits(rig) == [330, 330]
    assert locks(rig) == [[0, 2200], [0, 2200]]
    assert all(g["persistence"] for g in rig.gpu_state())
    assert rig.exec("systemctl is-enabled rigkit-gpu-policy")[1].strip() == "enabled"

    second = run_deploy(rig)
    assert second.returncode == 0, second.output
    assert second.changed_operations() == 0, second.output


def test_reboot_reapplies_the_policy_with_no_control_machine(rig):
    rig.ready_after_boot_s = 5  # the driver answers 'No devices were found' for 5 s after boot
    rig.write_gpu_config()
    rig.reboot()
    assert limits(rig) == [330, 330]
    assert locks(rig) == [[0, 2200], [0, 2200]]
    journal = rig.exec(JOURNAL + " -b")[1]
    assert "rigkit-gpu-policy: waiting up to 120 s for GPU(s) 0 1 (nvidia-smi: No devices were found)" in journal
    assert "rigkit-gpu-policy: GPU 0: power limit 450 W -> 330 W; clocks locked to 0,2200 MHz" in journal
    assert "rigkit-gpu-policy: GPU 1: power limit 450 W -> 330 W; clocks locked to 0,2200 MHz" in journal
    assert "rigkit-gpu-policy: applied; a clock lock cannot be read back, verify under load" in journal
    order = rig.exec("systemctl show -p Before -p After rigkit-gpu-policy")[1]
    assert "docker.service" in order and "nvidia-persistenced.service" in order


def test_drift_is_reported_and_repaired(rig):
    with keeper_held_off(rig):  # the deploy's own drift repair, not the keeper's (tests/test_gpu_keeper.py)
        assert rig.exec("nvidia-smi -i 1 -pl 300")[0] == 0
        run = run_deploy(rig)
    assert run.returncode == 0, run.output
    assert "drift: GPU 1: power limit is 300 W, policy says 330 W; re-applying the policy" in run.output
    assert run.changed_operations() == 1
    assert limits(rig) == [330, 330]
    assert "GPU 1: power limit 300 W -> 330 W" in rig.exec(JOURNAL)[1]
    assert run_deploy(rig).changed_operations() == 0


def test_a_unit_disabled_behind_rigkit_s_back_is_enabled_again(rig):
    """The converged case is decided from one read while planning (rigkit/plumbing/systemd_units.py); a unit
    found not as wanted goes to pyinfra's systemd.service, which repairs it on the rig."""
    assert run_deploy(rig).changed_operations() == 0
    assert rig.exec("systemctl disable rigkit-gpu-policy.service")[0] == 0
    run = run_deploy(rig)
    assert run.returncode == 0, run.output
    assert run.changed_operations() == 1
    assert rig.exec("systemctl is-enabled rigkit-gpu-policy")[1].strip() == "enabled"
    assert run_deploy(rig).changed_operations() == 0


def test_changed_policy_applies_now_without_reboot(rig, tmp_path):
    changed = variant(tmp_path, "changed", SIM_RIG.replace("power_limit_w: 330\n    clock_lock_mhz: [0, 2200]\n  - index: 1", "power_limit_w: 300\n    clock_lock_mhz: [0, 1800]\n  - index: 1"))
    run = run_deploy(rig, changed)
    assert run.returncode == 0, run.output
    assert limits(rig) == [300, 330]
    assert locks(rig) == [[0, 1800], [0, 2200]]
    assert run_deploy(rig, changed).changed_operations() == 0


def test_unit_run_as_non_root_fails_with_not_permitted(rig):
    dropin = "/run/systemd/system/rigkit-gpu-policy.service.d"
    rig.exec(f"mkdir -p {dropin} && printf '[Service]\\nUser=rigops\\n' > {dropin}/user.conf && systemctl daemon-reload")
    try:
        code, _ = rig.exec("systemctl restart rigkit-gpu-policy")
        assert code != 0
        journal = rig.exec(JOURNAL + " -n 5")[1]
        assert "FAILED: enabling persistence mode: not permitted (nvidia-smi exit 4: Insufficient Permissions" in journal
    finally:
        rig.exec(f"rm -rf {dropin} && systemctl daemon-reload && systemctl reset-failed")


def test_removing_the_policy_resets_the_gpus_and_the_unit(rig, tmp_path):
    removed = variant(tmp_path, "removed", SIM_RIG + "gpu_policy: remove\n")
    run = run_deploy(rig, removed)
    assert run.returncode == 0, run.output
    assert limits(rig) == [450, 450]
    assert locks(rig) == [None, None]
    assert rig.exec("test -e /etc/systemd/system/rigkit-gpu-policy.service")[0] != 0
    assert rig.exec("test -e /etc/rigkit/gpu-policy.conf")[0] != 0
    assert run_deploy(rig, removed).changed_operations() == 0
