"""The watchdog as the serving role installs it on the simulated rig: systemd timer and service,
the rig's docker CLI restarting the stand-in's container, the rollout lock in the rig's /run/lock.
Restarts are read past the watchdog: the container's start time from the Docker Engine.
Simulated: vLLM (tests/vllm_standin, its wedge and long-prefill modes) and the GPUs.
"""

from __future__ import annotations

import threading
import time

import docker
import httpx
import pytest

from tests.conftest import ALONE_TEST_MODELS, alone_serving_rig, copy_catalog, run_deploy

pytestmark = pytest.mark.simrig
SERVED_MODELS = ALONE_TEST_MODELS  # serving_rig's

# The module serves ALONE_TEST_MODELS (alone_serving_rig): it runs beside the test models' modules
# (tests/conftest.py PROCESS_MODULES). The watchdog's tests are on alone-alpha.
MODEL = "alone-alpha"
URL = f"http://127.0.0.1:{ALONE_TEST_MODELS[MODEL]}"
# The shortest legal watchdog settings (rigkit/config/schema.py: each >= 1 s), so each window is seconds.
FAST = ("ready_timeout_s: 30\n", "ready_timeout_s: 30\nwatchdog: {interval_s: 1, wedged_after_s: 3, "
        "probe_timeout_s: 1, max_restarts_per_hour: 5}\n")
WEDGED_AFTER_S, INTERVAL_S, PROBE_S = 3, 1, 1
RESTART_S = 10  # `docker restart` of the stand-in (it ends at SIGTERM) and its start, on a busy 2-core machine
# The documented bound (docs/serving.md): wedged_after_s + 2 intervals (the stall is seen one check
# after it began) + a probe + the restart.
BOUND_S = WEDGED_AFTER_S + 2 * INTERVAL_S + PROBE_S + RESTART_S
LOCK = f"/run/lock/rigkit-stack-{MODEL}.lock"


@pytest.fixture(scope="module")
def rig(serving_rig, tmp_path_factory):
    fresh_rig = serving_rig
    folder = tmp_path_factory.mktemp("wd")
    catalog = copy_catalog(folder, alone_alpha=[FAST])
    # The stacks and the watchdog are what these tests need; verification (and the rollout gate, three
    # benchmark runs per model) is tested in test_verify.py and test_rollout_gate.py.
    run = run_deploy(fresh_rig, alone_serving_rig(folder / "serving.yml"), catalog=catalog, verify=False)
    assert run.returncode == 0, run.output
    yield fresh_rig
    for name in ALONE_TEST_MODELS:
        fresh_rig.exec(f"test -d /etc/rigkit/stacks/{name} && rigkit-stack down {name}")


def started() -> str:
    return docker.from_env().containers.get(f"rigkit-{MODEL}-vllm-1").attrs["State"]["StartedAt"]


def journal(rig, since: str) -> str:
    """The watchdog's journal after the cursor `since` (rig_now): a cursor, not a time, since the
    journal keeps whole seconds and one test's last lines may share a second with the next's start."""
    return rig.exec(f"journalctl -u rigkit-watchdog.service --after-cursor '{since}' --no-pager -o cat")[1]


def rig_now(rig) -> str:
    """The journal's cursor now (its last entry, of any unit)."""
    out = rig.exec("journalctl -n 1 --show-cursor --no-pager -o cat")[1]
    return next(line.split("cursor: ", 1)[1].strip() for line in out.splitlines() if line.startswith("-- cursor: "))


def wait_restart(before: str, limit_s: float) -> float | None:
    t0 = time.monotonic()
    while time.monotonic() - t0 < limit_s:
        if started() != before:
            return time.monotonic() - t0
        time.sleep(0.5)
    return None


def serves_again(after: str) -> None:
    """Until the stand-in answers a completion again (bounded: 60 tries)."""
    for _ in range(60):
        try:
            if httpx.post(f"{URL}/v1/completions", json={"model": MODEL, "prompt": "hi", "max_tokens": 1},
                          timeout=5).status_code == 200:
                return
        except httpx.HTTPError:
            time.sleep(0.5)
    pytest.fail(f"not serving after {after}")


def stuck_request(prompt: str = "hi") -> None:
    def send():
        try:
            httpx.post(f"{URL}/v1/completions", json={"model": MODEL, "prompt": prompt, "max_tokens": 4},
                       timeout=60)
        except httpx.HTTPError:
            pass
    threading.Thread(target=send, daemon=True).start()


def test_the_timer_runs_and_a_wedged_model_is_restarted_within_its_bound(rig):
    assert rig.exec("systemctl is-active rigkit-watchdog.timer")[1].strip() == "active"
    since, before = rig_now(rig), started()
    httpx.post(f"{URL}/standin/wedge", timeout=5)
    stuck_request()
    took = wait_restart(before, BOUND_S)
    assert took is not None, f"no restart within {BOUND_S} s:\n{journal(rig, since)}"
    log = journal(rig, since)
    assert f"{MODEL}: WEDGED: no completion within {PROBE_S} s" in log and "no token progress on /metrics" in log, log
    serves_again("the restart")  # a restart ends a runtime wedge


def test_a_long_prefill_is_left_alone(rig):
    since, before = rig_now(rig), started()
    httpx.post(f"{URL}/standin/long_prefill?seconds={BOUND_S + 10}", timeout=5)
    stuck_request("a long prompt " * 500)
    try:  # longer than a wedged model would have lasted
        assert wait_restart(before, BOUND_S + 2) is None, journal(rig, since)
    finally:
        httpx.post(f"{URL}/standin/normal", timeout=5)
    assert "WEDGED" not in journal(rig, since)


def test_it_holds_off_while_a_rollout_holds_the_lock_then_acts(rig):
    """A lock holder in the rig (as rigkit-stack holds it during a rollout) until the test releases it:
    while it holds, the wedged model is left alone for longer than it would have taken to restart it;
    once released, the restart comes within the bound."""
    container = docker.from_env().containers.get(rig.name)
    release = "/run/rigkit-test-release"
    rig.exec(f"rm -f {release}")
    # Bounded: the holder gives the lock up by itself after 120 s should the test die.
    container.exec_run(["flock", LOCK, "sh", "-c", f"for i in $(seq 600); do [ -e {release} ] && exit 0; sleep 0.2; done"],
                       detach=True)
    wait_for_lock = time.monotonic() + 30
    while rig.exec(f"flock -n {LOCK} true")[0] == 0:  # until the holder has it
        assert time.monotonic() < wait_for_lock, "the lock holder never took the lock"
        time.sleep(0.1)
    since, before = rig_now(rig), started()
    httpx.post(f"{URL}/standin/wedge", timeout=5)
    stuck_request()
    try:
        # Held off at every pass, past the time a wedged model gets restarted in.
        held_off = time.monotonic() + BOUND_S + 2
        while time.monotonic() < held_off:
            assert started() == before, journal(rig, since)
            time.sleep(0.5)
        assert journal(rig, since).count(f"a rollout holds {LOCK}; holding off") >= BOUND_S // INTERVAL_S // 4, \
            journal(rig, since)
    finally:
        rig.exec(f"touch {release}")
    took = wait_restart(before, BOUND_S)  # lock released: it acts
    assert took is not None, f"no restart within {BOUND_S} s of the release:\n{journal(rig, since)}"


def test_a_model_container_killed_by_hand_is_started_again_and_said_so(rig):
    """`docker kill` of the model's container: Docker's restart policy leaves a container stopped by hand
    down, and nothing else would bring it back. The watchdog's next pass starts it again (counted with the
    restarts) and says which container was down and how it ended; the model serves again."""
    from tests.conftest import STATE_ROOT

    since = rig_now(rig)
    engine = docker.from_env()
    engine.containers.get(f"rigkit-{MODEL}-vllm-1").kill()
    killed = time.monotonic()
    bound = 2 * INTERVAL_S + RESTART_S
    while engine.containers.get(f"rigkit-{MODEL}-vllm-1").status != "running":
        assert time.monotonic() - killed < bound, f"still down after {bound} s:\n{journal(rig, since)}"
        time.sleep(0.2)
    took = time.monotonic() - killed
    log = journal(rig, since)
    assert f"{MODEL}: DOWN: every container exited and stayed down (rigkit-{MODEL}-vllm-1 Exited (137)" in log, log
    assert "started 1 container(s) of rigkit-alone-alpha again" in log, log
    serves_again("the start")
    (STATE_ROOT / "measured").mkdir(parents=True, exist_ok=True)  # read by a person: the time fault -> repair
    (STATE_ROOT / "measured" / "watchdog-down-repair.txt").write_text(f"killed -> running again in {took:.1f} s\n")
