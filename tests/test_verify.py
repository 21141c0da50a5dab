"""Verification end to end on the simulated rig: deploy ends with a benchmark of each model and
checks of the GPUs under load; `rigkit verify` (verify.py) runs it on demand.

Simulated: vLLM (tests/vllm_standin), the GPUs behind nvidia-smi, and NVML (tests/simrig/pynvml.py:
steady load at 92% of the enforced limit, SM clock one step below the lock ceiling, an energy counter
consistent with that power). Results say so: telemetry_simulated is true. Real: pyinfra over SSH, the
sampler running on the rig, the SSH port forward the benchmark goes through, the JSON and PNG files.
"""

from __future__ import annotations

import json
import shutil

import pytest

from tests.conftest import keeper_held_off, RESULTS, SERVING_RIG, copy_catalog, run_deploy

pytestmark = pytest.mark.simrig

MODELS = ("test-alpha", "test-beta")


@pytest.fixture(scope="module")
def rig(serving_rig):
    shutil.rmtree(RESULTS, ignore_errors=True)
    return serving_rig


def runs(model):
    """The model's verification results (the rollout gate's gate-*.json beside them are not)."""
    return sorted(p for p in (RESULTS / "serving" / model).glob("*.json") if not p.name.startswith("gate-"))


def verify(rig):
    return run_deploy(rig, SERVING_RIG, "--data", "rigkit_verify=always", entry="verify.py")


def test_deploy_ends_with_verification_of_both_models(rig):
    run = run_deploy(rig, SERVING_RIG)
    assert run.returncode == 0, run.output
    for model in MODELS:
        [path] = runs(model)
        result = json.loads(path.read_text())
        assert path.with_suffix(".png").stat().st_size > 10_000
        assert result["telemetry_simulated"] is True
        assert result["passed"], result["checks"]
        names = {c["name"] for c in result["checks"]}
        assert {"tokens_produced", "context_readback", "decode_min"} <= names
        gpu = 0 if model == "test-alpha" else 1
        assert {f"gpu{gpu}_clock_lock", f"gpu{gpu}_enforced_power_limit", f"gpu{gpu}_power_under_load"} <= names
        assert result["gpus"][0]["max_sm_mhz"] == 2190
        assert result["figures"]["joules_per_token"] > 0
        # The start this verification followed, as rigkit-stack cut it; no budget in the catalog, no check of it.
        assert result["startup"]["to"] == "first token (rigkit's readiness completion)", result["startup"]
        assert "time_to_ready" not in names
    alpha = json.loads(runs("test-alpha")[0].read_text())
    assert alpha["bench"]["decode_tok_s"] == pytest.approx(100, rel=0.02)
    assert alpha["bench"]["acceptance_length"] == pytest.approx(2.4, rel=0.05)
    assert "verification of test-alpha (SIMULATED telemetry)" in run.output


def test_a_sampler_left_behind_is_stopped_by_the_next_start_for_the_same_file(rig):
    """A controller killed during verification never sends the sampler's stop: the sampler it started runs on
    (until its own 900 s bound). Played here with the very commands verification sends (rigkit.rigside.sampler)
    through the rig's shell, the stop left out: the next verification's start stops the one left behind before
    it starts its own, so only one sampler writes the file, and the new one's samples are what is read."""
    import time

    from rigkit.rigside import sampler
    from rigkit.rigside.names import SAMPLER_NVML_DIR, SAMPLER_PATH

    out = "/run/rigkit/telemetry-test-alpha.json"

    def start() -> str:
        code, said = rig.exec(sampler.start_command(SAMPLER_PATH, SAMPLER_NVML_DIR, [0], 50, out, 900))
        pid = said.strip().splitlines()[-1]
        assert code == 0 and pid.isdigit(), said
        assert rig.exec(sampler.started_command(pid, out))[0] == 0
        return pid

    def running(pid: str) -> bool:
        return rig.exec(f"kill -0 {pid}")[0] == 0

    left_behind = start()  # its controller "killed": never stopped
    started = time.monotonic()
    current = start()
    took = time.monotonic() - started
    assert not running(left_behind) and running(current), (left_behind, current)
    assert took < sampler.TAKEOVER_WAIT_S + 5, took
    assert rig.exec(f"pgrep -fc -- '[r]igkit-telemetry.py .*--out {out} '")[1].strip() == "1"  # not pgrep's shell
    assert rig.exec(sampler.stop_command(current, out))[0] == 0
    samples = json.loads(rig.exec(f"cat {out}")[1])
    assert samples and not running(current)
    after_a_stop = start()  # the pid file names a process gone: the start says nothing of it, only its pid
    assert rig.exec(sampler.stop_command(after_a_stop, out))[0] == 0
    unrelated = rig.exec("sleep 60 >/dev/null 2>&1 & echo $!")[1].strip()  # a pid file naming another process
    rig.exec(f"echo {unrelated} > {out}.pid")
    stopped_again = start()
    assert running(unrelated), "a process that is not this file's sampler was killed"
    rig.exec(f"kill {unrelated}; " + sampler.stop_command(stopped_again, out))


def test_a_deploy_that_changes_nothing_does_not_re_verify(rig):
    run = run_deploy(rig, SERVING_RIG)
    assert run.returncode == 0, run.output
    assert run.changed_operations() == 0, run.output
    assert [len(runs(m)) for m in MODELS] == [1, 1]


def test_a_clock_above_the_lock_ceiling_fails_lock_not_in_effect(rig):
    rig.gpus[0] = type(rig.gpus[0])(ignores_clock_lock=True)
    rig.write_gpu_config()
    try:
        run = verify(rig)
    finally:
        rig.gpus[0] = type(rig.gpus[0])()
        rig.write_gpu_config()
    assert run.returncode != 0
    assert ("gpu0_clock_lock: lock not in effect: max SM clock under load 2640 MHz is above the lock ceiling "
            "2200 MHz") in run.output


def test_an_enforced_limit_off_the_policy_fails(rig):
    with keeper_held_off(rig):  # else the keeper puts 330 W back before the benchmark
        assert rig.exec("nvidia-smi -i 1 -pl 300")[0] == 0
        try:
            run = verify(rig)
        finally:
            rig.exec("nvidia-smi -i 1 -pl 330")
    assert run.returncode != 0
    assert "gpu1_enforced_power_limit: enforced limit 300 W, policy 330 W" in run.output
    # The failure is the operation's one line (rigkit.plumbing.ssh.rig_call), not pyinfra's callback traceback.
    assert "Traceback" not in run.output and "Unexpected error in Python callback" not in run.output


def test_a_slower_config_accepted_past_the_gate_is_recorded_and_flagged_as_a_regression(rig, tmp_path):
    """A config 15% slower, promoted with `--accept-slower test-beta` (the deploy's data, as `rigkit deploy`
    passes it; tests/test_rollout_gate.py has the refusal without it): the gate document and the
    verification saved with it record the acceptance, and the verification flags the regression against
    the earlier run measured the same way."""
    folder = copy_catalog(tmp_path, test_beta=[('STANDIN_DECODE_TOK_S: "60"', 'STANDIN_DECODE_TOK_S: "51"')])
    run = run_deploy(rig, SERVING_RIG, "--data", "rigkit_accept_slower=test-beta", catalog=folder)
    assert run.returncode == 0, run.output
    assert "PROMOTE, SLOWER AND ACCEPTED (--accept-slower): decode failed and waived" in run.output, run.output
    gate = json.loads(sorted((RESULTS / "serving" / "test-beta").glob("gate-*.json"))[-1].read_text())
    assert gate["promoted"] and gate["accepted_slower"] and gate["provenance"]["accepted_slower"] is True
    latest = json.loads(runs("test-beta")[-1].read_text())
    assert latest["provenance"]["accepted_slower"] is True
    [regression] = [r for r in latest["regressions"] if r["figure"] == "decode_tok_s"]
    assert regression["change"] == pytest.approx(-0.15, abs=0.02)
    assert latest["previous"]["figures"]["decode_tok_s"] == pytest.approx(60, rel=0.02)
    assert "REGRESSION decode_tok_s" in run.output
    assert '"STANDIN_DECODE_TOK_S": "51"' in rig.exec("cat /etc/rigkit/stacks/test-beta/compose.yml")[1]  # promoted


DOCKER_STAMP_LAG_S = 0.05


def test_a_start_over_its_ready_budget_fails_time_to_ready_naming_the_slow_phase(rig, tmp_path):
    """The catalog's ready_budget_s against the start the deploy caused: weights that take 4 s to load (the
    stand-in's STANDIN_LOAD_S) in a budget of 1 s. The config is as fast as the proven one, so the gate
    promotes it; its verification keeps the start and fails the budget's check, naming the slowest phase of
    the start's table, where the weights' load is measured. (On a loaded machine the container's own start
    once took 2.0 s, as long as a 2 s load: the phase named is the table's slowest, whichever it is.)"""
    folder = copy_catalog(tmp_path, test_alpha=[("env:\n", 'env:\n  STANDIN_LOAD_S: "4"\n'),
                                                ("ready_timeout_s: 30\n", "ready_timeout_s: 30\nready_budget_s: 1\n")])
    run = run_deploy(rig, SERVING_RIG, catalog=folder)
    assert run.returncode == 0, run.output[-4000:]
    latest = json.loads(runs("test-alpha")[-1].read_text())
    [check] = [c for c in latest["checks"] if c["name"] == "time_to_ready"]
    phases = {p["phase"]: p["s"] for p in latest["startup"]["phases"]}
    # Docker stamps a line when it reads it from the container's output, not when it was written: a line read a
    # few ms late shortens the phase after it (a fresh clone measured the 4 s load as 3.998 s on a loaded machine).
    assert phases["weights load"] >= 4.0 - DOCKER_STAMP_LAG_S, latest["startup"]
    engine = [p for p in latest["startup"]["phases"] if not p["phase"].startswith("waiting for rigkit")]
    slowest = max(engine, key=lambda p: p["s"])
    assert not check["passed"] and "over the budget of 1 s" in check["message"], check
    assert f"slowest phase: {slowest['phase']} {slowest['s']:.1f} s" in check["message"], (check, latest["startup"])
    assert latest["startup"]["compile_cache"]["cache"] == "none"
    assert run_deploy(rig, SERVING_RIG).returncode == 0
