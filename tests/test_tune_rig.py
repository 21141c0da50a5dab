"""`rigkit tune` end to end on the simulated rig: the real CLI, real SSH, real systemd timers in
the rig, the serving stack deployed by rigkit on the host's Docker engine. Simulated: the GPU
(tests/simrig nvidia-smi and NVML, with tests/sim_curves.py's RTX 3090 curve) and vLLM (the
stand-in, whose rates follow that GPU's live settings through the shared /run/nvidia-sim)."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest

from tests.conftest import REPO, RESULTS, STATE_ROOT, run_deploy
from tests.simrig.rig import SimGpu
from tests.simrig.weights import SIM_MODELS, ensure_checkpoint

pytestmark = pytest.mark.simrig

TUNE = REPO / "tests" / "data" / "tune"
DECLARED_W = 300
CARD = SimGpu(name="NVIDIA GeForce RTX 3090", min_w=100, max_w=400, default_w=350, max_clock_mhz=2100,
              tune_profile="rtx3090")


@pytest.fixture(scope="module")
def tune_rig(simrig, tmp_path_factory):
    """The session's rig as one simulated 3090 whose GPU state the stand-in reads; the tune-sim
    model and the GPU policy deployed by rigkit. Its GPUs put back afterwards; the next module that
    uses the rig starts it afresh with them (tests/conftest.py, _rig_fresh_on_entry)."""
    from tests.vllm_standin.image import ensure_standin_image

    ensure_standin_image()
    ensure_checkpoint("tune-sim")
    saved = (simrig.gpus, simrig.shared_gpu_dir)
    simrig.gpus, simrig.shared_gpu_dir = [CARD], SIM_MODELS / "tune-sim" / "gpu"
    simrig.start()
    folder = tmp_path_factory.mktemp("tune")
    rig_file = folder / "rigs" / "tune.yml"
    rig_file.parent.mkdir()
    shutil.copy(TUNE / "rigs" / "tune.yml", rig_file)
    shutil.copytree(TUNE / "models", folder / "models")
    deployed = run_deploy(simrig, rig_file, catalog=folder / "models", verify=False)
    assert deployed.returncode == 0, deployed.output[-3000:]
    simrig.rig_file = rig_file
    yield simrig
    _remove_stack()
    simrig.gpus, simrig.shared_gpu_dir = saved


def _remove_stack():
    import docker

    for c in docker.from_env().containers.list(all=True, filters={"label": "com.docker.compose.project=rigkit-tune-sim"}):
        c.remove(force=True)


def _env(rig) -> dict:
    return dict(os.environ, RIGKIT_SIM_PORT=str(rig.ssh_port), RIGKIT_RIG_FILE=str(rig.rig_file),
                RIGKIT_CATALOG_DIR=str(rig.rig_file.parent.parent / "models"), RIGKIT_STATE=str(STATE_ROOT),
                RIGKIT_RESULTS_DIR=str(RESULTS))


def _tune(*args: str) -> list[str]:
    return [sys.executable, "-m", "rigkit.cli", "tune", "inventory/sim.py", "--rig", "sim-rig", "--model", "tune-sim",
            "--prompt-tokens", "64", "--output-tokens", "24", *args]


def _run(rig, *args: str, timeout_s: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(_tune(*args), cwd=REPO, env=_env(rig), capture_output=True, text=True, timeout=timeout_s)


def _limit_w(rig) -> float:
    return float(rig.gpu_state()[0]["power_limit_w"])


def _deadman_active(rig) -> bool:
    return rig.exec("systemctl is-active rigkit-tune-deadman.timer")[1].strip() == "active"


def _wait_for_experiment(rig, proc, timeout_s=60) -> None:
    """Until the sweep has applied a setting other than the declared one."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if _limit_w(rig) != DECLARED_W:
            return
        assert proc.poll() is None, proc.stdout.read()
        time.sleep(0.2)
    raise AssertionError(f"no experimental setting applied within {timeout_s} s")


def test_a_sweep_finds_the_knee_refuses_the_psu_breaker_and_writes_a_file_check_accepts(tune_rig, tmp_path):
    out = tmp_path / "sweep.json"
    run = _run(tune_rig, "--power-limits", "200:400:50", "--repeats", "2", "--objective", "efficiency",
               "--json", str(out), "--write")
    assert run.returncode == 0, run.stdout + run.stderr
    doc = json.loads(out.read_text())
    chosen = doc["choices"]["efficiency"]["cell"]["power_limit_w"]
    assert abs(chosen - 250) <= 50, run.stdout  # the 3090's knee, within one grid step
    # 400 W breaks the PSU budget (800 - 250 system - 400 < 20% headroom): refused, never applied.
    assert [r["cell"]["power_limit_w"] for r in doc["refused"]] == [400]
    assert "PSU budget" in doc["refused"][0]["reasons"][0]
    assert not any("-pl 400" in call for call in tune_rig.gpu_calls())
    assert out.with_suffix(".png").stat().st_size > 5000
    # Restored and disarmed at the end.
    assert _limit_w(tune_rig) == DECLARED_W and not _deadman_active(tune_rig)
    # The rig file now says the knee, comments kept, and rigkit check accepts it.
    text = tune_rig.rig_file.read_text()
    assert f"power_limit_w: {chosen}   # declared" in text and "# Test rig for rigkit tune" in text
    check = subprocess.run([sys.executable, "-m", "rigkit.cli", "check", str(tune_rig.rig_file)], cwd=REPO,
                           capture_output=True, text=True)
    assert check.returncode == 0, check.stderr
    # The next deploy persists it through the boot-time policy.
    deployed = run_deploy(tune_rig, tune_rig.rig_file, catalog=tune_rig.rig_file.parent.parent / "models", verify=False)
    assert deployed.returncode == 0, deployed.output[-2000:]
    assert _limit_w(tune_rig) == chosen
    shutil.copy(TUNE / "rigs" / "tune.yml", tune_rig.rig_file)
    assert run_deploy(tune_rig, tune_rig.rig_file, catalog=tune_rig.rig_file.parent.parent / "models",
                      verify=False).returncode == 0
    assert _limit_w(tune_rig) == DECLARED_W


def test_a_controller_killed_mid_sweep_leaves_the_rig_at_its_policy_within_the_timer(tune_rig):
    deadman_s = 8
    proc = subprocess.Popen(_tune("--power-limits", "150:250:50", "--repeats", "6", "--deadman-s", str(deadman_s)),
                            cwd=REPO, env=_env(tune_rig), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        _wait_for_experiment(tune_rig, proc)
        proc.kill()  # SIGKILL: no finally, no restore; the SSH connection drops
        killed = time.monotonic()
        proc.wait()
        assert _limit_w(tune_rig) != DECLARED_W  # the rig is left at the experiment...
        while _limit_w(tune_rig) != DECLARED_W and time.monotonic() - killed < deadman_s + 10:
            time.sleep(0.2)
        restored_after_s = time.monotonic() - killed
    finally:
        if proc.poll() is None:
            proc.kill()
    assert _limit_w(tune_rig) == DECLARED_W, tune_rig.gpu_state()  # ...until the switch restores the policy
    assert restored_after_s <= deadman_s + 3
    journal = tune_rig.exec("journalctl -u rigkit-gpu-policy.service -n 5 --no-pager -o cat")[1]
    assert "applied" in journal
    print(f"restored {restored_after_s:.1f} s after the controller was killed (timer {deadman_s} s)")


def test_ctrl_c_restores_at_once(tune_rig):
    proc = subprocess.Popen(_tune("--power-limits", "150:250:50", "--repeats", "6", "--deadman-s", "120"),
                            cwd=REPO, env=_env(tune_rig), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        _wait_for_experiment(tune_rig, proc)
        proc.send_signal(signal.SIGINT)
        output, _ = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, output
    assert "interrupted; restored" in output
    # At once: the switch had 120 s to go, yet the rig is back and the switch disarmed.
    assert _limit_w(tune_rig) == DECLARED_W and not _deadman_active(tune_rig)


def test_a_cell_whose_setting_does_not_take_effect_is_reported(tune_rig, tmp_path):
    # Firmware holds the card at 260 W whatever limit is set, and reports the request as enforced.
    tune_rig.gpus = [dataclasses.replace(CARD, held_at_w=260)]
    tune_rig.write_gpu_config()  # read live by the simulated NVML and the stand-in
    try:
        out = tmp_path / "held.json"
        run = _run(tune_rig, "--power-limits", "200,350", "--repeats", "2", "--json", str(out))
    finally:
        tune_rig.gpus = [CARD]
        tune_rig.write_gpu_config()
    doc = json.loads(out.read_text())
    held = [n for n in doc["not_in_effect"] if n["cell"]["power_limit_w"] == 350]
    assert held and "another limit" in held[0]["reasons"][0], run.stdout
    assert 350 not in [r["cell"]["power_limit_w"] for r in doc["table"]]
    assert "NOT IN EFFECT" in run.stdout
    assert _limit_w(tune_rig) == DECLARED_W


def test_hold_measures_the_setting_in_force_and_changes_nothing(tune_rig, tmp_path):
    before = tune_rig.gpu_calls()
    out = tmp_path / "hold.json"
    run = _run(tune_rig, "--hold", "--repeats", "4", "--json", str(out))
    assert run.returncode == 0, run.stdout + run.stderr
    doc = json.loads(out.read_text())["hold"]
    assert doc["n"] == 4 and doc["decode_cv"] is not None
    assert doc["decode_tok_s"]["mean"] == pytest.approx(33.0 * 1.07 * 1.01, rel=0.05)  # the curve at 300 W
    assert f"CV {doc['decode_cv']:.2%}" in run.stdout, run.stdout  # the figure the JSON holds, printed
    assert tune_rig.gpu_calls() == before  # only reads


def test_a_memory_offset_is_applied_through_nvml_measured_and_put_back(tune_rig, tmp_path):
    out = tmp_path / "mem.json"
    run = _run(tune_rig, "--mem-offsets", "0,3000", "--repeats", "4", "--objective", "decode", "--json", str(out))
    assert run.returncode == 0, run.stdout + run.stderr
    rows = {r["cell"]["mem_offset_mhz"]: r["decode_tok_s"]["mean"] for r in json.loads(out.read_text())["table"]}
    # The 3090 curve: +3000 MHz (NVML's memory value, about +17% memory clock) is worth about +4% decode.
    assert rows[3000] / rows[0] == pytest.approx(1.042, abs=0.02)
    assert any("nvml set memory offset 3000 on GPU 0" in call for call in tune_rig.gpu_calls())
    state = tune_rig.gpu_state()[0]
    assert state.get("memory_offset_mhz", 0) == 0 and state["power_limit_w"] == DECLARED_W
    assert "+    clock_offsets_mhz: {memory: 3000, graphics: 0}" in run.stdout  # proposed, not written
    assert "clock_offsets_mhz" not in tune_rig.rig_file.read_text()
