"""The GPU policy's clock offsets (`clock_offsets_mhz`, for what `rigkit tune` finds): applied now
and at every boot through NVML, read back, checked against the driver's range. Real: pyinfra over
SSH, systemd in the rig, the policy script and the offset tool as shipped. Simulated: the GPUs
(tests/simrig nvidia-smi and NVML; offsets within -2000..+6000 MHz memory, -500..+1000 graphics)."""

from __future__ import annotations

import pytest

from tests.conftest import POLICY_RIG, run_deploy

pytestmark = pytest.mark.simrig

OFFSETS = ("    clock_lock_mhz: [0, 2200]\n  - index: 1",
           "    clock_lock_mhz: [0, 2200]\n    clock_offsets_mhz: {memory: 1800, graphics: 100}\n  - index: 1")


def _rig_file(tmp_path, name, old, new):
    text = POLICY_RIG.read_text()
    assert old in text
    path = tmp_path / f"{name}.yml"
    path.write_text(text.replace(old, new))
    return path


def offsets(rig):
    return [(g.get("memory_offset_mhz", 0), g.get("graphics_offset_mhz", 0)) for g in rig.gpu_state()]


def test_offsets_are_applied_now_and_at_boot_and_read_back(fresh_rig, tmp_path):
    rig_file = _rig_file(tmp_path, "offsets", *OFFSETS)
    first = run_deploy(fresh_rig, rig_file, verify=False)
    assert first.returncode == 0, first.output[-3000:]
    assert offsets(fresh_rig) == [(1800, 100), (0, 0)]
    journal = fresh_rig.exec("journalctl -u rigkit-gpu-policy -o cat --no-pager")[1]
    assert "GPU 0: power limit 450 W -> 330 W; clocks locked to 0,2200 MHz; clock offsets 1800,100 MHz (memory,graphics) read back" in journal
    assert run_deploy(fresh_rig, rig_file, verify=False).changed_operations() == 0
    fresh_rig.reboot()  # the driver forgets offsets; the boot unit sets them again
    assert offsets(fresh_rig) == [(1800, 100), (0, 0)]
    # Removing them from the rig file puts the cards back at 0 now, not only after a reboot.
    plain = run_deploy(fresh_rig, POLICY_RIG, verify=False)
    assert plain.returncode == 0, plain.output[-3000:]
    assert offsets(fresh_rig) == [(0, 0), (0, 0)]


def test_an_offset_outside_the_drivers_range_fails_the_deploy_and_names_the_range(fresh_rig, tmp_path):
    rig_file = _rig_file(tmp_path, "too-far", OFFSETS[0], OFFSETS[1].replace("memory: 1800", "memory: 9000"))
    run = run_deploy(fresh_rig, rig_file, verify=False)
    assert run.returncode != 0
    assert "memory offset +9000 MHz is outside -2000..+6000 MHz, the range this driver reports" in run.output
    assert offsets(fresh_rig)[0][0] != 9000


def test_a_windows_rig_refuses_offsets(tmp_path):
    from rigkit.config.errors import ConfigError
    from rigkit.config.loader import load_rig

    text = POLICY_RIG.read_text().replace("os: linux", "os: windows").replace(*OFFSETS)
    (tmp_path / "rigs").mkdir()
    path = tmp_path / "rigs" / "win.yml"
    path.write_text(text)
    with pytest.raises(ConfigError, match="clock_offsets_mhz is applied through NVML on Linux rigs only"):
        load_rig(path, tmp_path)
