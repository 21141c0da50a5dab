"""On-demand models deployed on the simulated rig: the rig file's on_demand, the serving role rolling each model
out alone and parking it, rigkit-ondemand as a systemd service holding requests on the models' own ports and
loading one model at a time through vLLM's sleep mode, the canary catching a bad wake.

Simulated: vLLM (tests/vllm_standin: sleep mode as vLLM 0.32 serves it, the fault bad_wake) and the GPUs
(tests/simrig: nvidia-smi's memory.used adds up what the running stand-ins hold). The two models ask for 0.6 of
GPU 0 each, so they cannot be loaded together. Real: pyinfra over SSH, systemd, Docker Compose on the host's
engine, the HTTP from the clients through the fronts to the engines.
"""

from __future__ import annotations

import json
from dataclasses import replace
import os
import subprocess
import sys

import docker
import httpx
import pytest

from tests import ondemand_engines
from tests.conftest import REPO, RESULTS, SERVING_RIG, STATE_ROOT, run_deploy, run_status, wait_for

pytestmark = pytest.mark.simrig
SERVED_MODELS = {"od-alpha": 18141, "od-beta": 18142}  # serving_rig's
ENGINES = {name: port + 10000 for name, port in SERVED_MODELS.items()}
CATALOG = """image: rigkit-vllm-standin:sim
weights:
  source: /srv/rigkit-sim-models/{name}
gpus: [0]
port: {port}
vllm:
  dtype: bfloat16
  gpu_memory_utilization: 0.6
env:
  STANDIN_DECODE_TOK_S: "200"
  STANDIN_PREFILL_TOK_S: "4000"
{extra}ready_timeout_s: 30
"""
ON_DEMAND = """on_demand:
  hold_s: 60
  models:
    - {name: od-alpha}
    - {name: od-beta}
"""
EMPTY_IDLE_W, CONTEXT_DRAW_W = 24.5, 42.7  # the simulated GPU's idle draw; what a context adds (H200: 121.5 - 78.8)


def write_catalog(folder, extra: dict[str, str] | None = None):
    catalog = folder / "models"
    catalog.mkdir(exist_ok=True)
    for name, port in SERVED_MODELS.items():
        (catalog / f"{name}.yml").write_text(CATALOG.format(name=name, port=port, extra=(extra or {}).get(name, "")))
    return catalog


@pytest.fixture(scope="module")
def deployed(serving_rig, tmp_path_factory):
    # Its GPUs draw more while a CUDA context is on them (tests/simrig/nvidia-smi), by what the H200 measured
    gpus = serving_rig.gpus
    serving_rig.gpus = [replace(g, context_draw_w=CONTEXT_DRAW_W) for g in gpus]
    serving_rig.write_gpu_config()
    folder = tmp_path_factory.mktemp("ondemand")
    rig_file = folder / "ondemand.yml"
    text = SERVING_RIG.read_text()
    rig_file.write_text(text.replace("models: [test-alpha, test-beta]", f"models: [{', '.join(SERVED_MODELS)}]")
                        + ON_DEMAND)
    catalog = write_catalog(folder)
    run = run_deploy(serving_rig, rig_file, catalog=catalog, verify=False)
    assert run.returncode == 0, run.output[-6000:]
    yield serving_rig, rig_file, folder, run
    serving_rig.gpus = gpus
    serving_rig.write_gpu_config()
    serving_rig.exec("systemctl stop rigkit-ondemand")
    for name in SERVED_MODELS:
        serving_rig.exec(f"test -d /etc/rigkit/stacks/{name} && rigkit-stack down {name}")


def engine_running(name: str) -> bool:
    containers = docker.from_env().containers.list(filters={"label": f"com.docker.compose.project=rigkit-{name}"})
    return bool(containers)


def loaded(name: str) -> bool:
    """Its engine runs and is awake (what holds GPU memory beyond a context)."""
    try:
        return httpx.get(f"http://127.0.0.1:{ENGINES[name]}/is_sleeping", timeout=2).json()["is_sleeping"] is False
    except httpx.HTTPError:
        return False


def complete(model: str, stream: bool, max_tokens: int = 6) -> int:
    url = f"http://127.0.0.1:{SERVED_MODELS[model]}/v1/completions"
    body = {"model": model, "prompt": "one two three", "max_tokens": max_tokens, "stream": stream}
    if not stream:
        response = httpx.post(url, json=body, timeout=90)
        assert response.status_code == 200, f"{model}: {response.status_code} {response.text[:300]}"
        return response.json()["usage"]["completion_tokens"]
    body["stream_options"] = {"include_usage": True}
    tokens = None
    with httpx.stream("POST", url, json=body, timeout=90) as response:
        if response.status_code != 200:
            response.read()
            raise AssertionError(f"{model}: {response.status_code} {response.text[:300]}")
        for line in response.iter_lines():
            if line.startswith("data: {"):
                tokens = (json.loads(line[6:]).get("usage") or {}).get("completion_tokens", tokens)
    return tokens


def journal(rig) -> str:
    return rig.exec("journalctl -u rigkit-ondemand.service --no-pager -o cat")[1]


def fronts_answer() -> bool:
    try:
        return all(httpx.get(f"http://127.0.0.1:{p}/health", timeout=2).status_code == 200 for p in SERVED_MODELS.values())
    except httpx.HTTPError:
        return False


def test_the_deploy_parks_both_models_behind_their_fronts_and_a_second_deploy_changes_nothing(deployed):
    rig, rig_file, folder, run = deployed
    assert "Park od-alpha (on demand) after its rollout" in run.output
    wait_for("rigkit-ondemand answering on both fronts", fronts_answer, 30)
    assert not engine_running("od-alpha") and not engine_running("od-beta")
    assert rig.exec("systemctl is-enabled rigkit-ondemand")[1].strip() == "enabled"
    compose = rig.exec("cat /etc/rigkit/stacks/od-alpha/compose.yml")[1]
    assert '"--port", "28141"' in compose and '"--enable-sleep-mode"' in compose and 'restart: "no"' in compose
    again = run_deploy(rig, rig_file, catalog=folder / "models", verify=False)
    assert again.returncode == 0 and again.changed_operations() == 0, again.output[-4000:]
    # the rig's host RAM as rigkit-ondemand reads it (a park's copy must fit there): the simulated rig's 128 GiB
    assert rig.exec("grep MemTotal /proc/meminfo")[1].split()[1] == str(128 * 1024 * 1024)


def test_two_models_that_cannot_both_be_loaded_alternate_under_four_clients_with_no_failed_request(deployed):
    rig = deployed[0]
    failures, tokens, both = ondemand_engines.alternate(
        ("od-alpha", "od-beta"), complete, lambda: loaded("od-alpha") and loaded("od-beta"))
    assert not failures, failures[:4]
    assert tokens == [6] * 32
    assert not both, f"both models loaded at once, {both} samples"
    log = journal(rig)
    assert log.count("woken, canary equal") >= 2, log[-3000:]
    assert "asleep (level 1)" in log and "started, canary equal" in log, log[-3000:]
    # GPU 0 as the rig's nvidia-smi reads it: the loaded model's share and the parked one's CUDA context only
    assert [loaded(n) for n in SERVED_MODELS].count(True) == 1
    used = int(rig.exec("nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -i 0")[1].strip())
    assert used == int(0.6 * 24564) + 512, used
    # Each model's proof (its canary and /v1/models answer, for its compose file) is kept root-only, and the
    # parked model's front lists it from there without loading it.
    assert rig.exec("stat -c '%a' /var/lib/rigkit/ondemand")[1].strip() == "700"
    for name in SERVED_MODELS:
        proof = json.loads(rig.exec(f"cat /var/lib/rigkit/ondemand/{name}.json")[1])
        digest = rig.exec(f"sha256sum /etc/rigkit/stacks/{name}/compose.yml")[1].split()[0]
        assert proof["config_sha256"] == digest and proof["canary"]["tokens"], proof
    [parked] = [n for n in SERVED_MODELS if not loaded(n)]
    swaps = journal(rig).count("rigkit-ondemand: ")
    listed = httpx.get(f"http://127.0.0.1:{SERVED_MODELS[parked]}/v1/models", timeout=10)
    assert listed.status_code == 200 and [m["id"] for m in listed.json()["data"]] == [parked], listed.text
    assert not loaded(parked) and journal(rig).count("rigkit-ondemand: ") == swaps


def test_a_dry_deploy_of_a_changed_on_demand_model_parks_nothing_and_restarts_nothing(deployed):
    """--dry only reads: with od-alpha's config changed (a rollout, the models parked and the program stopped
    and started again, were it real), the loaded model stays loaded and rigkit-ondemand keeps running."""
    rig, rig_file, folder, _ = deployed
    assert complete("od-alpha", stream=False) == 6
    files = "sha256sum /etc/rigkit/ondemand.json /etc/rigkit/stacks/*/* /var/lib/rigkit/ondemand/*"

    def state():
        containers = sorted((c.name, c.id, c.attrs["State"]["StartedAt"], c.status)
                            for c in docker.from_env().containers.list(all=True)
                            if c.labels.get("com.docker.compose.project") in ("rigkit-od-alpha", "rigkit-od-beta"))
        return (rig.exec("systemctl show -p MainPID --value rigkit-ondemand")[1].strip(), rig.exec(files)[1],
                containers, loaded("od-alpha"), loaded("od-beta"))
    before = state()
    catalog = write_catalog(folder, {"od-alpha": '  STANDIN_DRIFT_PER_S: "0"\n'})
    env = dict(os.environ, RIGKIT_SIM_PORT=str(rig.ssh_port), RIGKIT_RIG_FILE=str(rig_file),
               RIGKIT_CATALOG_DIR=str(catalog), RIGKIT_STATE=str(STATE_ROOT), RIGKIT_RESULTS_DIR=str(RESULTS))
    run = subprocess.run([sys.executable, "-m", "rigkit.cli", "deploy", "inventory/sim.py", "--dry", "--no-verify"],
                         cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    output = run.stdout + run.stderr
    assert run.returncode == 0, output[-4000:]
    # pyinfra's change detection lists what a real deploy would do: park, roll out, restart the program
    for operation in ("Park every on-demand model and stop rigkit-ondemand while they roll out",
                      "Park od-alpha (on demand) after its rollout", "Restart rigkit-ondemand"):
        assert operation in output, output[-4000:]
    assert state() == before
    assert before[3] and before[0] != "0"


def test_a_bad_wake_is_caught_by_the_canary_and_the_model_restarted_cold(deployed):
    rig, rig_file, folder, _ = deployed
    catalog = write_catalog(folder, {"od-alpha": '  STANDIN_FAULT: "bad_wake"\n'})  # in its env
    text = (catalog / "od-alpha.yml").read_text()
    assert 'STANDIN_FAULT: "bad_wake"' in text
    run = run_deploy(rig, rig_file, catalog=catalog, verify=False)
    assert run.returncode == 0, run.output[-4000:]
    before = journal(rig).count("cold restart")
    assert complete("od-alpha", stream=False) == 6  # started: its canary recorded from this start
    assert complete("od-beta", stream=False) == 6  # od-alpha sleeps
    assert complete("od-alpha", stream=True) == 6  # its wake is bad: caught, restarted cold, then served
    log = journal(rig)
    assert log.count("cold restart") == before + 1, log[-3000:]
    assert "od-alpha: cold restart (after it was woken, the canary's greedy tokens differ from token 0 on" in log


def clock_locks(rig) -> list:
    """Each GPU's clock lock as the simulated driver holds it (nvidia-smi reports none: its state file)."""
    return [gpu["clock_lock"] for gpu in rig.gpu_state()]


def parked_gpus(rig) -> str:
    """/run/rigkit/gpu-parked's text (a line after it tells an empty file from a read that lost its output)."""
    out = rig.exec("cat /run/rigkit/gpu-parked && echo rigkit-read-whole")[1]
    assert out.endswith("rigkit-read-whole\n"), out
    return out[: -len("rigkit-read-whole\n")]


def draw_w(rig, gpu: int = 0) -> float:
    return float(rig.exec(f"nvidia-smi --query-gpu=power.draw --format=csv,noheader,nounits -i {gpu}")[1].strip())


def test_an_idle_model_is_stopped_asleep_or_not_and_its_gpu_goes_back_to_its_empty_idle_draw(deployed, tmp_path):
    """idle_park_s 15 (long enough that a loaded machine's slow read cannot pass it between two steps): od-beta
    loaded after od-alpha (which sleeps for it, keeping its CUDA context), then neither asked again: both are
    stopped and GPU 0 draws what it draws empty."""
    rig, rig_file, folder, _ = deployed
    idle = folder / "idle.yml"
    idle.write_text(rig_file.read_text().replace("- {name: od-alpha}", "- {name: od-alpha, idle_park_s: 15}")
                    .replace("- {name: od-beta}", "- {name: od-beta, idle_park_s: 15}"))
    run = run_deploy(rig, idle, catalog=write_catalog(folder), verify=False)
    assert run.returncode == 0, run.output[-4000:]
    assert not engine_running("od-alpha") and not engine_running("od-beta")
    assert draw_w(rig) == EMPTY_IDLE_W
    # GPU 0 serves only on-demand models: its clock lock is released while they are parked; GPU 1 keeps its own
    # rigkit-ondemand is Type=notify, ready once its fronts listen: the deploy returned with them answering
    assert fronts_answer() and clock_locks(rig) == [None, [0, 2200]] and parked_gpus(rig) == "0\n"
    assert complete("od-alpha", stream=False) == 6
    assert clock_locks(rig) == [[0, 2200], [0, 2200]]
    log = journal(rig)
    locked, loaded_at = log.rfind("GPU 0: clocks locked to 0,2200 MHz again (od-alpha loads)"), log.rfind("od-alpha: started")
    assert -1 < locked < loaded_at, log[-3000:]  # locked before the model started, so before its first token
    assert draw_w(rig) == EMPTY_IDLE_W + CONTEXT_DRAW_W
    assert complete("od-beta", stream=False) == 6  # od-alpha sleeps for it: its context stays
    assert engine_running("od-alpha") and not loaded("od-alpha") and loaded("od-beta")
    wait_for("both models stopped after 15 s idle",
             lambda: not engine_running("od-alpha") and not engine_running("od-beta"), 60)
    log = journal(rig)
    assert "od-alpha: idle 15 s: stopped" in log and "od-beta: idle 15 s: stopped" in log, log[-3000:]
    assert draw_w(rig) == EMPTY_IDLE_W
    assert rig.exec("nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -i 0")[1].strip() == "0"
    wait_for("GPU 0's clock lock released again", lambda: clock_locks(rig) == [None, [0, 2200]], 10)
    # A boot's, a deploy's or the GPU keeper's apply of the policy leaves the parked GPU unlocked...
    code, out = rig.exec("rigkit-gpu-policy apply")
    assert code == 0 and "GPU 0: power limit 330 W as wanted, left alone; clocks left unlocked" in out, out
    assert clock_locks(rig) == [None, [0, 2200]]
    # ...and rigkit-ondemand puts the lock back as it stops (a deploy stops it to roll a model out)
    assert rig.exec("systemctl stop rigkit-ondemand")[0] == 0
    assert clock_locks(rig) == [[0, 2200], [0, 2200]] and parked_gpus(rig) == ""
    assert rig.exec("systemctl start rigkit-ondemand")[0] == 0
    assert fronts_answer() and clock_locks(rig) == [None, [0, 2200]]  # ready: locks settled, fronts listening
    wait_for("rigkit-ondemand's state file to say both stopped",
             lambda: all(m["state"] == "parked" and m["parked_as"] == "stopped" for m in
                         json.loads(rig.exec("cat /run/rigkit/ondemand.json")[1])["models"].values()), 10)
    # `rigkit status` says so: each model stopped (not down), GPU 0's lock released while parked
    _, text, report = run_status(rig, idle, tmp_path, timeout=180, catalog=write_catalog(folder))
    (doc,) = report["rigs"]
    assert {s["model"]: s["on_demand"] for s in doc["stacks"] if s["on_demand"]} == \
        {"od-alpha": "stopped", "od-beta": "stopped"}, doc["stacks"]
    assert doc["gpus_parked"] == [0] and "clock locks released while parked (on-demand models): GPU 0" in text, text
    assert "on demand: stopped" in text and not [d for d in doc["drift"] if "od-" in d["what"]], doc["drift"]


def test_a_parked_models_container_removed_by_a_prune_is_created_again_by_the_next_request(deployed):
    """`docker container prune` removes every stopped container, and a parked model's is stopped: the next
    request creates it again from its proven compose file (the deploy would not: a parked model is not down)."""
    rig = deployed[0]
    client = docker.from_env()
    wait_for("od-beta parked with its container stopped (the test before leaves both idle)",
             lambda: not engine_running("od-beta"), 60)
    [container] = client.containers.list(all=True, filters={"label": "com.docker.compose.project=rigkit-od-beta"})
    container.remove()  # what `docker container prune` does to it
    assert not client.containers.list(all=True, filters={"label": "com.docker.compose.project=rigkit-od-beta"})
    assert complete("od-beta", stream=True) == 6
    log = journal(rig)
    assert "od-beta: started (its container was gone: created again from its proven config), canary equal" in log, \
        log[-3000:]


def test_models_parked_by_checkpoint_leave_nothing_on_the_gpu_and_each_restore_is_proven(deployed, tmp_path):
    """`swap: checkpoint` for both models: rigkit-ondemand parks each with the rig's cuda-checkpoint (simulated:
    tests/simrig/cuda-checkpoint plays NVIDIA's tool on the stand-ins, found through Docker by PID; checkpointed,
    a stand-in holds 0 MiB and its requests wait) and restores it for its next request, proven by the canary.
    The parked model's container keeps running, with nothing of it on GPU 0."""
    rig, rig_file, folder, _ = deployed
    path = folder / "checkpoint.yml"
    path.write_text(rig_file.read_text().replace("- {name: od-alpha}", "- {name: od-alpha, swap: checkpoint}")
                    .replace("- {name: od-beta}", "- {name: od-beta, swap: checkpoint}"))
    catalog = write_catalog(folder)
    run = run_deploy(rig, path, catalog=catalog, verify=False)
    assert run.returncode == 0, run.output[-4000:]
    assert "--enable-sleep-mode" not in rig.exec("cat /etc/rigkit/stacks/od-alpha/compose.yml")[1]
    assert complete("od-alpha", stream=False) == 6
    assert complete("od-beta", stream=True) == 6  # od-alpha is checkpointed for it
    assert complete("od-alpha", stream=False) == 6  # od-beta is checkpointed, od-alpha restored
    log = journal(rig)
    assert "od-alpha: checkpointed (1 CUDA process)" in log and "od-beta: checkpointed (1 CUDA process)" in log, log[-3000:]
    assert "od-alpha: restored from its checkpoint, canary equal" in log, log[-3000:]
    assert engine_running("od-alpha") and engine_running("od-beta")  # both processes run; one is checkpointed
    used = int(rig.exec("nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -i 0")[1])
    assert used == int(0.6 * 24564), used  # od-alpha's share only: nothing of od-beta on GPU 0
    _, text, report = run_status(rig, path, tmp_path, timeout=180, catalog=catalog)
    states = {s["model"]: s["on_demand"] for s in report["rigs"][0]["stacks"] if s["on_demand"]}
    assert states == {"od-alpha": "loaded", "od-beta": "checkpointed"}, (states, journal(rig)[-3000:])
