"""On-demand models behind rigkit-ondemand's front and scheduler (rigside.front, rigside.swap,
rigside.engine_control), against vLLM stand-ins run as local processes on 127.0.0.1 with sleep mode as vLLM
0.32 serves it (development routes, levels, 503 while asleep). Simulated: the GPUs (two models "cannot
both be resident" because the scheduler is told they conflict) and Docker Compose's stop/start/restart
(tests/ondemand_engines.py plays them on a process). What is real: the HTTP the clients, the front and the
engines speak, streams included, and the scheduler's threads under concurrent load."""

from __future__ import annotations

import json
import os
import subprocess
import threading
import time

import httpx
import pytest

from rigkit.rigside.engine_control import Engine
from rigkit.rigside.front import Front
from rigkit.rigside.swap import Scheduler, Slot
from tests import ondemand_engines
from tests.standin import free_port


def wait_for(url: str, seconds: float = 20) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            httpx.get(f"{url}/health", timeout=1)
            return
        except httpx.HTTPError:
            time.sleep(0.05)
    raise AssertionError(f"{url} did not answer /health within {seconds} s")


CUDA_CHECKPOINT = os.path.join(os.path.dirname(__file__), "simrig", "cuda-checkpoint")


@pytest.fixture
def rig(tmp_path, monkeypatch):
    """Start engines and fronts as asked: rig(names, env_of={name: {...}}, hold_s=..., idle_park_s=...)
    -> (front URLs, engine URLs, scheduler, log lines). Simulated beside the GPUs: the host's memory (512 GiB)."""
    specs, fronts, schedulers = [], [], []
    registry = tmp_path / "cuda-processes"  # where the stand-in cuda-checkpoint finds a local engine by its PID
    meminfo = tmp_path / "meminfo"  # the host's memory, as a rig with 512 GiB reports it (a test may change it)
    meminfo.write_text("MemTotal:       536870912 kB\nMemAvailable:   520093696 kB\n")
    monkeypatch.setenv("CUDA_CHECKPOINT_STANDIN_REGISTRY", str(registry))

    def build(names=("alpha", "beta"), env_of=None, hold_s=60.0, idle_park_s=600.0, conflicting=True, swap="sleep"):
        slots, engine_urls, log = {}, {}, []
        for name in names:
            port = free_port()
            env = {"STANDIN_CHECKPOINT_REGISTRY": str(registry), **(env_of or {}).get(name, {})}
            spec = ondemand_engines.spec_for(tmp_path, name, port, env, [])
            specs.append(spec)
            subprocess.run(ondemand_engines.command("start", spec), check=True, timeout=30)
            engine_urls[name] = f"http://127.0.0.1:{port}"
            wait_for(engine_urls[name])
            engine = Engine(name=name, served_name=name, url=engine_urls[name], swap=swap, sleep_level=1,
                            stop=ondemand_engines.command("stop", spec),
                            start=ondemand_engines.command("start", spec),
                            restart=ondemand_engines.command("restart", spec), ready_timeout_s=30,
                            held_mib=int((env_of or {}).get(name, {}).get("STANDIN_MEMORY_MIB", "0")),
                            memory_probe=ondemand_engines.command("memory", spec),
                            checkpoint_tool=CUDA_CHECKPOINT, pids=ondemand_engines.command("pids", spec),
                            meminfo=str(meminfo))
            others = {n for n in names if n != name} if conflicting else set()
            slots[name] = Slot(engine=engine, conflicts=others, idle_park_s=idle_park_s)
        # as rigkit-ondemand starts: every model's canary recorded from its start, the first left loaded
        for i, name in enumerate(names):
            slots[name].engine.wake()
            if i and conflicting:
                _, slots[name].parked_as = slots[name].engine.park()
                slots[name].state = "parked"
            else:
                slots[name].state = "awake"
        scheduler = Scheduler(slots, hold_s=hold_s, log=log.append)
        schedulers.append(scheduler)
        scheduler.start()
        urls = {}
        for name in names:
            front = Front(name, ("127.0.0.1", free_port()), engine_urls[name], scheduler)
            fronts.append(front)
            front.serve_in_thread()
            urls[name] = f"http://127.0.0.1:{front.server_address[1]}"
        return urls, engine_urls, scheduler, log

    yield build
    for scheduler in schedulers:
        scheduler.stop()
    for front in fronts:
        front.shutdown()
        front.server_close()
    for spec in specs:
        ondemand_engines.stop(spec)


def complete(url: str, model: str, stream: bool, max_tokens: int = 8, timeout: float = 60) -> dict:
    body = {"model": model, "prompt": "one two three four", "max_tokens": max_tokens, "stream": stream}
    if stream:
        body["stream_options"] = {"include_usage": True}
        usage = None
        with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=timeout) as response:
            if response.status_code != 200:
                response.read()
                raise AssertionError(f"{model}: HTTP {response.status_code} {response.text[:300]}")
            for line in response.iter_lines():
                if line.startswith("data: ") and line != "data: [DONE]":
                    event = json.loads(line[6:])
                    usage = event.get("usage") or usage
        return usage
    response = httpx.post(f"{url}/v1/completions", json=body, timeout=timeout)
    assert response.status_code == 200, f"{model}: HTTP {response.status_code} {response.text[:300]}"
    return response.json()["usage"]


def sleeping(engine_url: str) -> bool | None:
    try:
        answer = httpx.get(f"{engine_url}/is_sleeping", timeout=2)
        return False if answer.status_code == 404 else answer.json()["is_sleeping"]  # 404: no sleep mode
    except httpx.HTTPError:
        return None  # stopped or restarting: holds nothing


def test_two_models_that_cannot_both_be_loaded_alternate_under_four_clients_with_no_failed_request(rig):
    urls, engines, scheduler, log = rig()
    failures, usages, both = ondemand_engines.alternate(
        ("alpha", "beta"), lambda model, stream: complete(urls[model], model, stream, max_tokens=6)["completion_tokens"],
        lambda: [sleeping(engines[n]) for n in ("alpha", "beta")] == [False, False], each=10, timeout_s=180)
    assert not failures, failures[:5]
    assert usages == [6] * 40
    assert not both, f"both models loaded at once, {both} samples"
    swaps = [s for s in scheduler.swaps if "woken" in s[1]]
    assert len(swaps) >= 4, scheduler.swaps
    assert all("canary equal" in s[1] for s in swaps), scheduler.swaps
    wasted = [(a, b) for a, b in zip(scheduler.swaps, scheduler.swaps[1:]) if a[0] == b[0] and "asleep" in a[1]]
    assert not wasted, f"a model parked and woken again at once: {wasted} in {scheduler.swaps}"


def test_a_bad_wake_is_caught_by_the_canary_and_the_model_restarted_cold(rig):
    urls, engines, scheduler, log = rig(env_of={"alpha": {"STANDIN_FAULT": "bad_wake"}})
    assert complete(urls["beta"], "beta", stream=False)["completion_tokens"] == 8  # alpha parks for beta
    assert complete(urls["alpha"], "alpha", stream=True)["completion_tokens"] == 8  # alpha's wake is bad
    [wake] = [s for s in scheduler.swaps if s[0] == "alpha" and "canary" in s[1]]
    assert "cold restart (after it was woken, the canary's greedy tokens differ from token 0 on" in wake[1], wake
    # the restarted engine is a new process: its answers are the proven ones again
    assert scheduler.slots["alpha"].engine.canary_differs() is None
    assert any("alpha: cold restart" in line for line in log), log


def test_a_request_held_past_its_bound_is_told_what_it_waited_for(rig):
    urls, engines, scheduler, log = rig(hold_s=1.5, env_of={"alpha": {"STANDIN_DECODE_TOK_S": "10"}})
    long = threading.Thread(target=complete, args=(urls["alpha"], "alpha", True, 60))  # alpha busy for 6 s
    long.start()
    time.sleep(0.5)  # alpha's request is in flight (it streams for 6 s)
    started = time.monotonic()
    response = httpx.post(f"{urls['beta']}/v1/completions", json={"model": "beta", "prompt": "x", "max_tokens": 2},
                          timeout=30)
    held = time.monotonic() - started
    long.join(30)
    assert response.status_code == 503 and response.headers["Retry-After"] == "5", response.text
    message = response.json()["error"]["message"]
    assert "model beta was not loaded within 1.5 s of the request" in message, message
    assert "waiting for alpha (1 in flight) to finish" in message, message
    assert 1.4 < held < 5, held
    # and once alpha's stream ended, beta is served
    assert complete(urls["beta"], "beta", stream=False)["completion_tokens"] == 8


def test_an_idle_model_is_stopped_asleep_or_awake_and_the_next_request_starts_it(rig):
    """Idle, a model is stopped, not put to sleep: a sleeping engine keeps its CUDA context, and with it its
    GPUs out of their empty idle. Put to sleep for a swap, it is stopped too once idle."""
    urls, engines, scheduler, log = rig(names=("alpha", "beta"), idle_park_s=1.0)
    assert complete(urls["alpha"], "alpha", stream=False)["completion_tokens"] == 8
    deadline = time.monotonic() + 15
    while not all(scheduler.slots[n].parked_as == "stopped" for n in ("alpha", "beta")) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert all(scheduler.slots[n].parked_as == "stopped" for n in ("alpha", "beta")), scheduler.swaps
    assert (sleeping(engines["alpha"]), sleeping(engines["beta"])) == (None, None)  # no process answers: both stopped
    idle = sorted(s[0] for s in scheduler.swaps if s[1] == "idle 1 s: stopped")
    assert idle == ["alpha", "beta"], scheduler.swaps  # beta asleep since the start, alpha awake after its request
    assert complete(urls["alpha"], "alpha", stream=True)["completion_tokens"] == 8
    assert [s[1] for s in scheduler.swaps if s[0] == "alpha"][-1] == "started, canary equal", scheduler.swaps


def test_the_front_passes_no_development_route_and_no_chunked_body(rig):
    urls, engines, scheduler, log = rig(names=("alpha",), conflicting=False)
    for path in ("/sleep?level=1", "/wake_up", "/collective_rpc", "/reset_prefix_cache"):
        assert httpx.post(f"{urls['alpha']}{path}", timeout=5).status_code == 404, path
    assert httpx.get(f"{urls['alpha']}/is_sleeping", timeout=5).status_code == 404
    assert sleeping(engines["alpha"]) is False  # and the engine never heard of them
    chunked = httpx.post(f"{urls['alpha']}/v1/completions", content=iter([b'{"model": "alpha"}']), timeout=5)
    assert chunked.status_code == 411, chunked.text
    assert httpx.get(f"{urls['alpha']}/metrics", timeout=5).status_code == 200
    assert httpx.get(f"{urls['alpha']}/health", timeout=5).status_code == 200


def test_an_engine_without_sleep_mode_is_stopped_when_idle_and_started_warm_by_the_next_request(rig):
    """The "stop" swap, for engines without sleep mode (vLLM's CPU build refuses --enable-sleep-mode): no
    development routes (/is_sleeping answers 404, as vLLM without VLLM_SERVER_DEV_MODE), the process stopped
    and started again by the commands the scheduler was given."""
    urls, engines, scheduler, log = rig(names=("alpha",), idle_park_s=0.5, conflicting=False, swap="stop",
                                        env_of={"alpha": {"VLLM_SERVER_DEV_MODE": "0"}})
    assert httpx.get(f"{engines['alpha']}/is_sleeping", timeout=5).status_code == 404
    assert complete(urls["alpha"], "alpha", stream=False)["completion_tokens"] == 8
    deadline = time.monotonic() + 15
    while sleeping(engines["alpha"]) is not None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert sleeping(engines["alpha"]) is None, scheduler.swaps  # no process answers: stopped
    while scheduler.slots["alpha"].state != "parked" and time.monotonic() < deadline:
        time.sleep(0.05)
    # Prometheus' scrape of the parked model: no sample and no 502 (a parked model is not a model down)
    scraped = httpx.get(f"{urls['alpha']}/metrics", timeout=5)
    assert (scraped.status_code, scraped.headers["content-type"].split(";")[0]) == (200, "text/plain"), scraped.text
    assert scraped.text == "# alpha is parked by rigkit-ondemand: no engine runs\n"
    assert scheduler.slots["alpha"].state == "parked"  # the scrape loaded nothing
    assert complete(urls["alpha"], "alpha", stream=True)["completion_tokens"] == 8
    assert [s[1] for s in scheduler.swaps][-2:] == ["idle 0.5 s: stopped", "started, canary equal"], scheduler.swaps


def test_a_sleep_that_leaves_the_memory_held_is_followed_by_a_stop_and_the_other_model_loads(rig):
    """The fault leaky_sleep: /sleep answers 200 and /is_sleeping says so, but 16 GiB stay on the GPU (vllm#32714).
    The GPUs' memory (tests/ondemand_engines.py's `memory`, nvidia-smi's memory.used for the engine) says so."""
    held = {"STANDIN_MEMORY_MIB": "40000"}
    urls, engines, scheduler, log = rig(env_of={"alpha": {**held, "STANDIN_FAULT": "leaky_sleep"}, "beta": held})
    assert complete(urls["beta"], "beta", stream=False)["completion_tokens"] == 8
    [park] = [s for s in scheduler.swaps if s[0] == "alpha"]
    assert park[1].startswith("stopped (it says asleep but freed 23616 MiB of the 40000 MiB it held: 16384 MiB left "
                              "on its GPUs, more than 4000)"), park
    assert sleeping(engines["alpha"]) is None  # its process is gone
    assert complete(urls["alpha"], "alpha", stream=True)["completion_tokens"] == 8  # started again, proven
    assert [s[1] for s in scheduler.swaps if s[0] == "beta"] == ["woken, canary equal", "asleep (level 1)"]  # its sleep freed all
    assert [s[1] for s in scheduler.swaps if s[0] == "alpha"][-1] == "started, canary equal"


def without_created(answer: dict) -> list:
    """A /v1/models answer's entries without `created`, which vLLM stamps with the time of each request."""
    return [{k: v for k, v in entry.items() if k != "created"} for entry in answer["data"]]


def test_a_parked_model_lists_itself_from_its_last_proven_load_without_loading_behind_its_key(rig):
    """The key check is the front's own on this path (the stand-ins here run without --api-key): the engine
    object is given the key a rig's env file would hold."""
    urls, engines, scheduler, log = rig()
    assert scheduler.slots["beta"].state == "parked"
    swaps = list(scheduler.swaps)
    listed = httpx.get(f"{urls['beta']}/v1/models", timeout=10)
    assert listed.status_code == 200, listed.text
    assert [m["id"] for m in listed.json()["data"]] == ["beta"]
    assert scheduler.swaps == swaps and scheduler.slots["beta"].state == "parked"  # nothing was loaded
    assert sleeping(engines["beta"]) is True
    scheduler.slots["beta"].engine.api_key = "sk-listed"
    refused = httpx.get(f"{urls['beta']}/v1/models", timeout=10)
    assert (refused.status_code, refused.json()) == (401, {"error": "Unauthorized"})
    wrong = httpx.get(f"{urls['beta']}/v1/models", headers={"Authorization": "Bearer sk-other"}, timeout=10)
    assert wrong.status_code == 401
    kept = httpx.get(f"{urls['beta']}/v1/models", headers={"Authorization": "Bearer sk-listed"}, timeout=10)
    assert kept.status_code == 200
    scheduler.slots["beta"].engine.api_key = None
    # Loaded, the engine answers itself; what was kept is what it says (but the time stamp of the answer).
    assert complete(urls["beta"], "beta", stream=False)["completion_tokens"] == 8
    assert scheduler.slots["beta"].state == "awake"
    live = httpx.get(f"{urls['beta']}/v1/models", timeout=10).json()
    assert without_created(live) == without_created(listed.json())


def test_a_restarted_program_proves_a_wake_with_the_kept_canary_until_the_config_changes(tmp_path):
    """rigkit-ondemand restarted (each deploy restarts it) with a model asleep: the canary kept in the proof
    file for the config in force proves the wake, so no cold restart; a config changed since (its compose
    file here is a file of this test's) leaves the proof unused and the wake is a cold restart that records
    it again. Simulated: Compose's stop/start/restart, played on a local stand-in process."""
    port = free_port()
    spec = ondemand_engines.spec_for(tmp_path, "gamma", port, {}, [])
    subprocess.run(ondemand_engines.command("start", spec), check=True, timeout=30)
    url = f"http://127.0.0.1:{port}"
    wait_for(url)
    config, proof = tmp_path / "compose.yml", tmp_path / "proof" / "gamma.json"
    config.write_text("services: {vllm: {command: [--max-model-len, '4096']}}\n")

    def engine():  # as rigkit-ondemand makes it at each start
        return Engine(name="gamma", served_name="gamma", url=url, swap="sleep", sleep_level=1,
                      stop=ondemand_engines.command("stop", spec), start=ondemand_engines.command("start", spec),
                      restart=ondemand_engines.command("restart", spec), ready_timeout_s=30,
                      proof_file=str(proof), config_file=str(config))
    try:
        first = engine()
        assert not first.load_proof()  # nothing kept yet
        assert first.wake() == "already awake, canary equal"
        kept = json.loads(proof.read_text())
        assert kept["canary"] == first.canary and [m["id"] for m in kept["models"]["data"]] == ["gamma"]
        assert (proof.parent.stat().st_mode & 0o777) == 0o700
        assert first.park() == ("asleep (level 1)", "asleep")

        second = engine()
        assert second.load_proof() and second.canary == first.canary
        assert second.models["data"][0]["id"] == "gamma"
        assert second.wake() == "woken, canary equal"  # proven against the kept canary, not restarted cold
        assert second.park() == ("asleep (level 1)", "asleep")

        config.write_text("services: {vllm: {command: [--max-model-len, '8192']}}\n")  # a deploy changed it
        third = engine()
        assert not third.load_proof() and third.canary is None and third.models is None
        assert third.wake() == "cold restart (no canary recorded yet to prove a wake against), canary equal"
        assert json.loads(proof.read_text())["config_sha256"] != kept["config_sha256"]  # recorded again
    finally:
        ondemand_engines.stop(spec)


def test_a_stopped_engine_whose_container_is_gone_is_created_again_and_proven(rig):
    """Compose's `start` finds no container (simulated: a start command that fails as `docker compose start`
    does with none); the create command (here, the process's own start) brings it back, proven by the canary."""
    urls, engines, scheduler, log = rig(names=("alpha",), idle_park_s=0.5, conflicting=False)
    engine = scheduler.slots["alpha"].engine
    deadline = time.monotonic() + 15
    while not scheduler.slots["alpha"].parked_as == "stopped" and time.monotonic() < deadline:
        time.sleep(0.05)
    assert scheduler.slots["alpha"].parked_as == "stopped", scheduler.swaps
    engine.create, engine.start = engine.start, ["sh", "-c", "echo 'no container to start' >&2; exit 1"]
    engine.create_env = lambda: {**os.environ, "RIGKIT_TEST_CREATED": "1"}
    assert complete(urls["alpha"], "alpha", stream=False)["completion_tokens"] == 8
    assert scheduler.swaps[-1][1] == "started (its container was gone: created again from its proven config), canary equal"
    engine.create = []  # without a create command the start's own failure is the answer
    while not scheduler.slots["alpha"].parked_as == "stopped" and time.monotonic() < deadline + 15:
        time.sleep(0.05)
    response = httpx.post(f"{urls['alpha']}/v1/completions", json={"model": "alpha", "prompt": "x", "max_tokens": 1},
                          timeout=30)
    assert response.status_code == 503 and "no container to start" in response.text, response.text


def checkpoint_state(engine) -> str | None:
    """What the stand-in cuda-checkpoint says of the engine's process (None: no process runs)."""
    pids = engine.container_pids()
    if not pids:
        return None
    done = subprocess.run([CUDA_CHECKPOINT, "--get-state", "--pid", str(pids[0])], capture_output=True, text=True,
                          timeout=30)
    return done.stdout.strip()


def test_two_models_parked_by_checkpoint_alternate_with_no_failed_request_and_nothing_left_on_the_gpu(rig):
    """swap: checkpoint. Simulated: the GPU (each engine's held MiB) and cuda-checkpoint (tests/simrig/
    cuda-checkpoint: the stand-in's memory to 0 and its requests waiting while checkpointed). Every park is a
    checkpoint that leaves 0 MiB of the model on its GPU, every load a restore proven by the canary."""
    mib = {"STANDIN_MEMORY_MIB": "14000"}
    urls, engines, scheduler, log = rig(swap="checkpoint", env_of={"alpha": mib, "beta": mib})
    alpha, beta = scheduler.slots["alpha"].engine, scheduler.slots["beta"].engine
    assert checkpoint_state(beta) == "checkpointed" and beta.memory_used() == 0  # parked at the start
    failures, usages, both = ondemand_engines.alternate(
        ("alpha", "beta"), lambda model, stream: complete(urls[model], model, stream, max_tokens=6)["completion_tokens"],
        lambda: alpha.memory_used() > 0 and beta.memory_used() > 0, each=6, timeout_s=180)
    assert not failures, failures[:5]
    assert usages == [6] * 24 and not both, (usages, both)
    restores = [s for s in scheduler.swaps if "restored" in s[1]]
    assert len(restores) >= 2 and all(s[1] == "restored from its checkpoint, canary equal" for s in restores), \
        scheduler.swaps
    assert all(s[1] == "checkpointed (1 CUDA process)" for s in scheduler.swaps if "restored" not in s[1]), \
        scheduler.swaps
    parked = next(n for n, slot in scheduler.slots.items() if slot.state == "parked")
    assert scheduler.slots[parked].parked_as == "checkpointed"
    assert checkpoint_state(scheduler.slots[parked].engine) == "checkpointed"
    assert scheduler.slots[parked].engine.memory_used() == 0


def test_a_restore_that_brings_corrupted_weights_back_is_caught_by_the_canary_and_restarted_cold(rig):
    urls, engines, scheduler, log = rig(swap="checkpoint", env_of={"alpha": {"STANDIN_FAULT": "bad_wake"}})
    assert complete(urls["beta"], "beta", stream=False)["completion_tokens"] == 8  # alpha is checkpointed for beta
    assert complete(urls["alpha"], "alpha", stream=True)["completion_tokens"] == 8  # its restore is bad
    [load] = [s for s in scheduler.swaps if s[0] == "alpha" and "canary" in s[1]]
    assert load[1].startswith("cold restart (after it was restored from its checkpoint, the canary's greedy tokens "
                              "differ from token 0 on"), load
    assert scheduler.slots["alpha"].engine.canary_differs() is None


def test_an_idle_model_parked_by_checkpoint_stays_checkpointed_not_stopped_and_is_restored_by_the_next_request(rig):
    """Idle, a checkpointed model is left so (nothing of it on its GPU already) and one awake is checkpointed,
    not stopped: the next request restores it instead of starting it."""
    urls, engines, scheduler, log = rig(swap="checkpoint", idle_park_s=1.0)
    assert complete(urls["alpha"], "alpha", stream=False)["completion_tokens"] == 8
    deadline = time.monotonic() + 15
    while scheduler.slots["alpha"].state != "parked" and time.monotonic() < deadline:
        time.sleep(0.05)
    assert [scheduler.slots[n].parked_as for n in ("alpha", "beta")] == ["checkpointed", "checkpointed"], scheduler.swaps
    assert [s for s in scheduler.swaps if s[0] == "alpha"][-1][1] == "idle 1 s: checkpointed (1 CUDA process)"
    assert not [s for s in scheduler.swaps if "stopped" in s[1]], scheduler.swaps
    assert checkpoint_state(scheduler.slots["alpha"].engine) == "checkpointed"  # the process still runs
    assert complete(urls["alpha"], "alpha", stream=True)["completion_tokens"] == 8
    assert [s[1] for s in scheduler.swaps if s[0] == "alpha"][-1] == "restored from its checkpoint, canary equal"



def test_a_park_that_would_copy_more_than_host_ram_can_take_stops_the_model_instead(rig, tmp_path):
    """Simulated: the host's memory (a meminfo file with 6 GiB available). A level-1 sleep copies the weights to
    host RAM, up to the 14000 MiB the model holds on its GPU: with 4 GiB to stay free it does not fit, so the
    model is stopped instead, and the log says why; with enough, it sleeps."""
    mib = {"STANDIN_MEMORY_MIB": "14000"}
    urls, engines, scheduler, log = rig(env_of={"alpha": mib, "beta": mib})
    short = tmp_path / "meminfo"
    short.write_text("MemTotal:       65536000 kB\nMemFree:         1000000 kB\nMemAvailable:    6291456 kB\n")
    scheduler.slots["alpha"].engine.meminfo = str(short)
    assert complete(urls["beta"], "beta", stream=False)["completion_tokens"] == 8  # alpha parks for beta
    [park] = [s for s in scheduler.swaps if s[0] == "alpha"]
    assert park[1] == ("stopped (host RAM: 6144 MiB available, and a level-1 sleep copies its weights there, up to "
                       "the 14000 MiB it holds on its GPUs, with 4096 MiB to stay free)"), park
    assert scheduler.slots["alpha"].parked_as == "stopped" and sleeping(engines["alpha"]) is None
    short.write_text("MemAvailable:   67108864 kB\n")  # 64 GiB
    assert complete(urls["alpha"], "alpha", stream=False)["completion_tokens"] == 8  # beta parks for alpha
    assert [s[1] for s in scheduler.swaps if s[0] == "beta"][-1] == "asleep (level 1)"


def test_a_process_left_locked_by_a_cut_off_toggle_is_restarted_cold_not_taken_as_awake(rig):
    """A toggle cut off between its lock and its checkpoint (rigkit-ondemand restarted during it) leaves the
    process locked: it serves nothing, and a restore cannot go on from there. The next request restarts the
    model cold instead of sending it a canary it would hold."""
    urls, engines, scheduler, log = rig(swap="checkpoint")
    beta = scheduler.slots["beta"].engine
    assert checkpoint_state(beta) == "checkpointed"
    httpx.post(f"{engines['beta']}/standin/checkpoint_locked", timeout=5)
    assert checkpoint_state(beta) == "locked" and beta.is_sleeping() is True
    assert complete(urls["beta"], "beta", stream=False)["completion_tokens"] == 8
    [load] = [s for s in scheduler.swaps if s[0] == "beta"]
    assert load[1].startswith("cold restart (its restore from the checkpoint failed: processes {") and \
        "'locked'} are neither running nor checkpointed), canary equal" in load[1], load


def test_a_model_that_cannot_be_loaded_proven_is_stopped_and_its_requests_told_why(rig):
    """Simulated: a canary recorded wrong, so no wake or cold restart of alpha proves equal. The model is failed,
    its container stopped (never left holding its GPUs beside the next model), and its request gets 503 with
    the reason."""
    urls, engines, scheduler, log = rig()
    alpha = scheduler.slots["alpha"].engine
    alpha.canary = {"tokens": ["never"] * 8, "token_logprobs": [0.0] * 8}
    assert complete(urls["beta"], "beta", stream=False)["completion_tokens"] == 8  # alpha sleeps for beta
    response = httpx.post(f"{urls['alpha']}/v1/completions", json={"model": "alpha", "prompt": "x", "max_tokens": 2},
                          timeout=60)
    assert response.status_code == 503, response.text
    assert "model alpha could not be loaded" in response.json()["error"]["message"], response.text
    [failed] = [s for s in scheduler.swaps if s[0] == "alpha" and s[1].startswith("failed")]
    assert failed[1].endswith("; its container stopped"), failed
    assert sleeping(engines["alpha"]) is None  # no process: nothing of it on its GPU
