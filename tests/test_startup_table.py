"""The startup table read from real vLLM logs: two starts of vLLM 0.32's CPU build captured here (the demo's
model, `docker logs --timestamps`), a cold one and a restart of the same container whose compile cache vLLM
could not load. Pure: simulates nothing; the logs are the real engine's."""

from __future__ import annotations

from rigkit.rigside.startup import FIRST_TOKEN, compile_cache, stamp, startup, table
from tests.conftest import REPO

CAPTURES = REPO / "tests" / "data" / "captures"
COLD = (CAPTURES / "vllm-0.32-cpu-start-cold.log").read_text()
RESTART = (CAPTURES / "vllm-0.32-cpu-start-restart.log").read_text()
COLD_STARTED, RESTART_STARTED = stamp("2026-12-04T17:48:28.77559812Z"), stamp("2026-12-04T19:36:06.449144171Z")


def test_a_cold_start_is_cut_into_phases_that_add_up_to_the_first_token():
    doc = startup(COLD, COLD_STARTED, ready_at=COLD_STARTED + 52.0)
    phases = {p["phase"]: p["s"] for p in doc["phases"]}
    assert list(phases)[0] == "container start to its first line" and list(phases)[-1] == FIRST_TOKEN
    assert abs(sum(phases.values()) - doc["total_s"]) < 0.01 and doc["total_s"] == 52.0
    assert 24 <= phases["compile"] <= 25  # "Warming up model for the compilation" to "Warming up done"
    assert phases["weights load"] < 1 and "CUDA graph capture" not in phases  # a CPU build captures no graph
    assert doc["vllm_says"] == {"weights load": 0.01, "init engine (profile, KV cache, warm-up)": 24.26}
    assert doc["silences"][0]["s"] > 23 and "Warming up model for the compilation" in doc["silences"][0]["after"]
    key = "3719b157fc20a7b4cb93918c3678a1cfe26293fd724d57a6833550fb523d4aba"
    assert doc["compile_cache"] == {"cache": "miss", "reason": "nothing cached under this key", "key": key,
                                    "paths": [f"torch_compile_cache/torch_aot_compile/{key}"]}  # all vLLM's CPU build logs


def test_a_restart_that_could_not_load_its_cache_says_vllms_reason():
    doc = startup(COLD + RESTART, RESTART_STARTED)  # the whole log: only this start's lines count
    assert 43 < doc["total_s"] < 44 and doc["to"] == "API up"
    cache = doc["compile_cache"]
    assert cache["cache"] == "miss" and "'function' object has no attribute 'finalize_loading'" in cache["reason"]
    lines = table("sim-chat", doc)
    assert lines[0] == "start of sim-chat: 43.9 s to API up"
    assert any("compile cache: miss (vLLM could not load its cached graph" in line for line in lines)


def test_a_hit_an_eager_start_and_lines_that_are_not_a_log():
    assert compile_cache(["(Worker pid=1) INFO [decorators.py:1] [backbone] Directly load AOT compilation from path "
                          "/c/torch_compile_cache/torch_aot_compile/0123456789abcdef/rank_0_0/model"]) == \
        {"cache": "hit", "reason": None, "key": "0123456789abcdef",
         "paths": ["torch_compile_cache/torch_aot_compile/0123456789abcdef"]}
    assert compile_cache(["INFO vllm-standin: serving /m"])["cache"] == "none"
    doc = startup("garbage line\n\n2026-12-04T10:00:01Z hello\n", stamp("2026-12-04T10:00:00Z"))
    assert doc["phases"] == [{"phase": "container start to its first line", "s": 1.0}] and doc["total_s"] == 1.0


def test_a_miss_names_the_flags_and_the_image_that_changed_since_the_last_start():
    from rigkit.rigside.startup import changed_inputs

    before = {"image": "sha256:aaa", "command": ["/models/m", "--max-model-len", "4096", "--dtype", "bfloat16",
                                                   "--served-model-name", "m"]}
    now = {"image": "sha256:aaa", "command": ["/models/m", "--max-model-len", "8192", "--dtype", "bfloat16",
                                                "--served-model-name", "m", "--enforce-eager"]}
    assert changed_inputs(before, now) == ["--enforce-eager (unset) -> (set)", "--max-model-len 4096 -> 8192"]
    assert changed_inputs(before, {**before, "image": "sha256:bbb"}) == ["the image (sha256:aaa -> sha256:bbb)"]
    assert changed_inputs(before, before) == [] and changed_inputs(None, now) == []


def test_a_start_is_judged_against_its_budget_by_its_total_and_named_by_its_slowest_phase():
    from rigkit.verify.checks import check_time_to_ready

    start = startup(COLD, COLD_STARTED, ready_at=COLD_STARTED + 52.0)
    over, within = check_time_to_ready(start, 40), check_time_to_ready(start, 60)
    assert not over.passed and over.message == ("52.0 s from the container's start to first token (rigkit's readiness "
                                                "completion), over the budget of 40 s; slowest phase: compile 24.5 s")
    assert within.passed and "within the budget of 60 s" in within.message
    assert not check_time_to_ready({}, 1).passed


def test_the_wait_for_rigkits_next_probe_is_its_own_phase_and_never_the_slowest():
    """rigkit's readiness probe pauses up to 2 s between tries: the time from the API's line to the probe
    that got the first token is rigkit's, not the engine's."""
    from rigkit.rigside.startup import POLL_WAIT
    from rigkit.verify.checks import check_time_to_ready

    log = "\n".join(f"2026-12-04T10:00:{s:02d}Z {text}" for s, text in (
        (1, "INFO vllm-standin: serving /m"), (1, "Starting to load model /m..."), (3, "Loading weights took 2.00 seconds"),
        (3, "INFO: Application startup complete.")))
    start = startup(log, stamp("2026-12-04T10:00:00Z"), ready_at=stamp("2026-12-04T10:00:06.5Z"),
                    asked_at=stamp("2026-12-04T10:00:06Z"))
    assert [(p["phase"], p["s"]) for p in start["phases"]][-2:] == [(POLL_WAIT, 3.0), (FIRST_TOKEN, 0.5)]
    assert start["total_s"] == 6.5
    assert "slowest phase: weights load 2.0 s" in check_time_to_ready(start, 1).message


def test_lines_docker_stamped_before_the_starts_recorded_time_still_count():
    """Docker records StartedAt after the start returns; a process that logs at once can have its first lines
    stamped before it (a loaded machine: a 4 s weights load read as "container start to its first line"). The
    start's lines are those after the container's last run ended (log_since: its FinishedAt)."""
    from rigkit.rigside.startup import log_since

    log = "\n".join(f"2026-12-04T10:00:{t}Z {text}" for t, text in (
        ("00.000", "INFO: Shutting down (SIGTERM)"),  # the last run's
        ("09.950", "INFO vllm-standin: serving /m"), ("09.960", "Initializing a V1 LLM engine (v0.32.0)"),
        ("09.970", "Starting to load model /m..."), ("14.000", "Loading weights took 4.00 seconds"),
        ("14.010", "INFO: Application startup complete.")))
    state = {"StartedAt": "2026-12-04T10:00:10.000000000Z", "FinishedAt": "2026-12-04T10:00:01.000000000Z"}
    since = log_since(state)
    assert since == state["FinishedAt"]
    start = startup(log, stamp(state["StartedAt"]), since=stamp(since))
    phases = {p["phase"]: p["s"] for p in start["phases"]}
    assert phases["weights load"] == 4.0 and phases["container start to its first line"] == 0.0
    wrong = {p["phase"]: p["s"] for p in startup(log, stamp(state["StartedAt"]))["phases"]}
    assert wrong["container start to its first line"] == 4.0 and wrong["weights load"] == 0.0  # what CI read
    assert log_since({"StartedAt": state["StartedAt"], "FinishedAt": "0001-01-01T00:00:00Z"}) is None  # first run
