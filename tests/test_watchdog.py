"""The rig-side watchdog (templates/serving/rigkit-watchdog), run here against the vLLM stand-in
as a local process (no Docker): its real probe and /metrics reads, a clock the test advances,
and a restart the test records. The wedge and long-prefill modes are the stand-in's.
tests/test_watchdog_rig.py runs the installed watchdog on the simulated rig.

Simulated: vLLM (tests/vllm_standin) and the restart (here a callback, on the rig `docker restart`).
"""

from __future__ import annotations

import fcntl
import importlib.machinery
import importlib.util
import os
import tempfile
import threading
from pathlib import Path
from urllib.parse import urlparse

import httpx
import pytest

from tests.conftest import REPO
from tests.standin import standin

SCRIPT = REPO / "templates" / "serving" / "rigkit-watchdog"


def load_watchdog():
    """The script as the rig runs it, with the runtime it imports (rigkit/rigside) found in a folder
    of its own, as on the rig in /usr/local/lib/rigkit (RIGKIT_LIB_DIR names it while it loads)."""
    lib_dir = Path(tempfile.mkdtemp(prefix="rigkit-lib-"))
    (lib_dir / "rigside").symlink_to(REPO / "rigkit" / "rigside", target_is_directory=True)
    before = os.environ.get("RIGKIT_LIB_DIR")
    os.environ["RIGKIT_LIB_DIR"] = str(lib_dir)
    try:
        loader = importlib.machinery.SourceFileLoader("rigkit_watchdog_under_test", str(SCRIPT))
        spec = importlib.util.spec_from_loader(loader.name, loader)
        module = importlib.util.module_from_spec(spec)
        loader.exec_module(module)
    finally:
        if before is None:
            del os.environ["RIGKIT_LIB_DIR"]
        else:
            os.environ["RIGKIT_LIB_DIR"] = before
    return module


@pytest.fixture
def wd(tmp_path):
    module = load_watchdog()
    module.LOCK_DIR = str(tmp_path / "lock")
    (tmp_path / "lock").mkdir()
    (tmp_path / "state").mkdir()
    return module


def model(url, **settings):
    return {"name": "m", "project": "rigkit-m", "container": "rigkit-m-vllm-1", "port": urlparse(url).port,
            "served_model_name": "m",
            "interval_s": 1, "wedged_after_s": 2, "max_restarts_per_hour": 3, "probe_timeout_s": 1,
            "ready_timeout_s": 30, **settings}


def background_request(url, prompt="a long prompt " * 200):
    def send():
        try:
            httpx.post(f"{url}/v1/completions", json={"model": "m", "prompt": prompt, "max_tokens": 4}, timeout=60)
        except httpx.HTTPError:
            pass
    threading.Thread(target=send, daemon=True).start()


def passes(wd, m, state_dir, count, restart_fn, start=1000.0, stopped_fn=lambda model: ""):
    """`count` checks one simulated interval apart; returns the verdicts. The model's containers run
    (`stopped_fn` says none is down) unless the test says otherwise."""
    return [wd.check(m, None, str(state_dir), now=start + i * m["interval_s"], restart_fn=restart_fn,
                     stopped_fn=stopped_fn) for i in range(count)]


def test_judge_needs_both_signals_for_the_whole_time(wd):
    settings = {"wedged_after_s": 10}
    busy = {"vllm:generation_tokens_total": 5.0, "vllm:prompt_tokens_total": 9.0,
            "vllm:num_requests_running": 1.0, "vllm:num_requests_waiting": 0.0}
    state, verdict, _ = wd.judge({}, False, "timed out", busy, settings, now=0)
    assert verdict == "ok"  # no earlier sample: no stall can be seen yet
    state, verdict, reason = wd.judge(state, False, "timed out", busy, settings, now=5)
    assert verdict == "suspect" and "1 running" in reason
    assert wd.judge(state, True, "answered", busy, settings, now=20)[1] == "recovered"  # probe answered
    moved = {**busy, "vllm:prompt_tokens_total": 10.0}
    assert wd.judge(state, False, "timed out", moved, settings, now=20)[1] == "recovered"  # progress
    idle = {**busy, "vllm:num_requests_running": 0.0}
    assert wd.judge(state, False, "HTTP 401", idle, settings, now=20)[1] == "recovered"  # refused: nothing to do
    assert wd.judge(state, False, "refused", None, settings, now=20)[1] == "recovered"  # loading: no /metrics
    assert wd.judge(state, False, "timed out", busy, settings, now=15)[1] == "wedged"


def test_judge_counts_the_probe_that_waited_as_work_the_gauges_do_not_show(wd):
    """vLLM 0.32 with its engine core stopped while idle: the gauges stay 0 running, 0 waiting (the engine
    core reports them), the counters stand still, and the probe is taken and never answered."""
    settings = {"wedged_after_s": 10}
    idle = {"vllm:generation_tokens_total": 64.0, "vllm:prompt_tokens_total": 7.0,
            "vllm:num_requests_running": 0.0, "vllm:num_requests_waiting": 0.0}
    state, verdict, _ = wd.judge({}, False, "timed out", idle, settings, now=0, probe_waited=True)
    state, verdict, reason = wd.judge(state, False, "timed out", idle, settings, now=5, probe_waited=True)
    assert verdict == "suspect" and "0 running, 0 waiting as the engine last reported" in reason, reason
    assert wd.judge(state, False, "timed out", idle, settings, now=15, probe_waited=True)[1] == "wedged"
    assert wd.judge(state, False, "HTTP 500", idle, settings, now=15)[1] == "recovered"  # refused, not waited


def test_the_probe_says_it_waited_only_when_its_deadline_passed_unanswered(wd, tmp_path):
    """A server that takes the probe and never answers (a socket that accepts and stays silent, here) is
    `waited`; nothing listening is not."""
    import socket

    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(1)
        port = silent.getsockname()[1]
        answered, detail, waited = wd.probe({"port": port, "served_model_name": "m", "probe_timeout_s": 1}, None)
        assert not answered and waited, detail
    answered, detail, waited = wd.probe({"port": port, "served_model_name": "m", "probe_timeout_s": 1}, None)
    assert not answered and not waited, detail


def test_a_wedged_model_is_restarted_within_its_bound(wd, tmp_path):
    with standin(tmp_path, name="m") as url:
        m = model(url)
        assert passes(wd, m, tmp_path / "state", 1, None) == ["ok"]  # healthy
        httpx.post(f"{url}/standin/wedge", timeout=5)
        restarted = []

        def restart(target):
            restarted.append(target["name"])
            httpx.post(f"{url}/standin/normal", timeout=5)  # what a restart does to a wedged engine
            return "restarted (test)"

        verdicts = passes(wd, m, tmp_path / "state", 6, restart, start=1001.0)
    # suspect from the first check after the wedge; restarted once wedged_after_s (2 intervals) has passed
    assert verdicts[:3] == ["suspect", "suspect", "restarted"], verdicts
    assert restarted == ["m"]
    assert verdicts[3:] == ["ok", "ok", "ok"]


def test_a_long_prefill_is_not_wedged(wd, tmp_path):
    with standin(tmp_path, name="m") as url:
        m = model(url)
        httpx.post(f"{url}/standin/long_prefill?seconds=20", timeout=5)
        background_request(url)
        restarted = []
        verdicts = passes(wd, m, tmp_path / "state", 6, lambda t: restarted.append(t) or "x")
        metrics = httpx.get(f"{url}/metrics", timeout=5).text
    assert restarted == [] and "restarted" not in verdicts and "suspect" not in verdicts, verdicts
    assert "vllm:num_requests_running{engine=\"0\",model_name=\"m\"} 0.0" not in metrics  # it was busy all along


def test_restarts_are_capped_per_hour(wd, tmp_path):
    with standin(tmp_path, name="m") as url:
        m = model(url, max_restarts_per_hour=2, probe_timeout_s=0.3)  # wedged: every probe waits its deadline
        httpx.post(f"{url}/standin/wedge", timeout=5)
        restarted = []
        verdicts = passes(wd, m, tmp_path / "state", 14, lambda t: restarted.append(t) or "restarted (test, still wedged)")
    assert len(restarted) == 2, verdicts
    assert verdicts.count("capped") >= 2 and verdicts.index("capped") > max(
        i for i, v in enumerate(verdicts) if v == "restarted")


def test_it_holds_off_while_a_rollout_holds_the_stacks_lock(wd, tmp_path):
    with standin(tmp_path, name="m") as url:
        m = model(url, probe_timeout_s=0.3)  # wedged: every probe waits its deadline
        httpx.post(f"{url}/standin/wedge", timeout=5)
        restarted = []
        with open(wd.lock_path("m"), "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)  # as `rigkit-stack rollout m` holds it
            held = passes(wd, m, tmp_path / "state", 5, lambda t: restarted.append(t) or "x")
        after = passes(wd, m, tmp_path / "state", 5, lambda t: restarted.append(t) or "x", start=1005.0)
    assert held == ["held_off"] * 5 and restarted[:1] == [m]
    assert "restarted" in after


def test_a_model_whose_containers_exited_is_started_again_within_the_hourly_cap(wd, tmp_path, capsys):
    """Simulated: the model's container killed (`docker kill`: Docker's restart policy leaves it down), as
    `docker ps -a` lists it; the start is a callback. Started at once, counted with the restarts, capped."""
    import subprocess

    listed = "rigkit-m-vllm-1 exited Exited (137) 4 seconds ago\n"
    wd.docker = lambda *args: subprocess.CompletedProcess(args, 0, listed, "")
    assert wd.stopped({"project": "rigkit-m"}) == "rigkit-m-vllm-1 Exited (137) 4 seconds ago"
    for running in ("rigkit-m-vllm-1 running Up 3 seconds\n", "rigkit-m-vllm-1 restarting Restarting (1) 1 second ago\n", ""):
        wd.docker = lambda *args, out=running: subprocess.CompletedProcess(args, 0, out, "")
        assert wd.stopped({"project": "rigkit-m"}) == "", running  # running, Docker's to restart, or taken down
    started = []
    m = {**model("http://127.0.0.1:1"), "max_restarts_per_hour": 2}
    verdicts = [wd.check(m, None, str(tmp_path / "state"), now=2000.0 + i, stopped_fn=lambda model: "rigkit-m-vllm-1 Exited (137)",
                         start_fn=lambda model: started.append(model["name"]) or "started 1 container(s) (test)")
                for i in range(4)]
    assert verdicts == ["started", "started", "capped", "capped"], verdicts
    said = capsys.readouterr().out
    assert "m: DOWN: every container exited and stayed down (rigkit-m-vllm-1 Exited (137)); started 1 container(s) " \
           "(test) (restart 1 of at most 2 per hour)" in said, said


def test_the_stand_ins_wedge_after_n_requests_survives_nothing_but_a_restart(tmp_path):
    with standin(tmp_path, name="m", standin_fault="wedge", standin_wedge_after="2") as url:
        for _ in range(2):
            assert httpx.post(f"{url}/v1/completions", json={"model": "m", "prompt": "hi", "max_tokens": 1},
                              timeout=5).status_code == 200
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(f"{url}/v1/completions", json={"model": "m", "prompt": "hi", "max_tokens": 1}, timeout=1)
        assert httpx.get(f"{url}/health", timeout=5).status_code == 200
        assert "vllm:num_requests_running{engine=\"0\",model_name=\"m\"} 1.0" in httpx.get(f"{url}/metrics", timeout=5).text
