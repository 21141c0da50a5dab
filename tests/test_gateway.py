"""The LiteLLM gateway end to end: two simulated rigs (two SSH ports, one stand-in replica of the
model `gw-chat` each, on distinct loopback ports), the gateway deployed on the first by the real
pyinfra CLI, LiteLLM itself (litellm[proxy] from PyPI in a local image, tests/gateway/image.py)
routing real HTTP to both replicas, `rigkit rollout` draining each rig in turn.

Simulated: vLLM (tests/vllm_standin), the GPUs (tests/simrig), and the network between rigs:
the simulated rigs share the host's network, so the inventory gives rig B a gateway_address of
127.0.0.1 (a real rig B would serve on 0.0.0.0 with a key, tested offline in test_gateway_config.py).
"""

from __future__ import annotations

import hashlib
import contextlib
import io
import json
import os
import subprocess
import sys
import tarfile
import ssl
import threading
import time
from dataclasses import dataclass, field

import docker
import httpx
import yaml
import pytest

from tests.conftest import DATA, REPO, STATE_ROOT, run_deploy, wait_for
from tests.simrig.rig import SimRig, ssh_keypair

pytestmark = pytest.mark.simrig

GATEWAY_PORT = 14000
# The gateway speaks HTTPS with a certificate from the fleet's CA (tls: rigkit, the default), kept beside
# the master key file; the tests are its users' clients: they trust that CA and check the name.
GATEWAY = f"https://127.0.0.1:{GATEWAY_PORT}"
FLEET_CA: dict = {}  # "file": the fleet's ca.pem, set by the fleet fixture
PORTS = {"gw-chat-a": 18201, "gw-chat-b": 18202}  # one replica per rig
PROJECTS = ["rigkit-gateway", *(f"rigkit-{m}" for m in PORTS)]
MASTER_KEY = "sk-gw-test-master"
RIG_KEY = "rig key with $ and # inside"
RIG_B = ("rigkit-gw-b", 2231)
HEALTH_CHECK_S = 5
REPLICA_IDS = {"gw-chat-a": "rig-a.gw-chat-a", "gw-chat-b": "rig-b.gw-chat-b"}


def trust() -> ssl.SSLContext:
    """What a user's client of this fleet verifies the gateway with: the fleet CA (and the name, 127.0.0.1)."""
    return ssl.create_default_context(cafile=str(FLEET_CA["file"]))


def gateway_client() -> httpx.Client:
    return httpx.Client(verify=trust())


def litellm_health() -> dict:
    """LiteLLM's last background health check (GET /health returns its cached results): model id -> healthy."""
    answer = httpx.get(f"{GATEWAY}/health", headers={"Authorization": f"Bearer {MASTER_KEY}"},
                       timeout=30, verify=trust()).json()
    return {**{e.get("model_id"): True for e in answer.get("healthy_endpoints", [])},
            **{e.get("model_id"): False for e in answer.get("unhealthy_endpoints", [])}}


def wait_gateway_ready() -> None:
    def ready():
        try:
            answer = httpx.get(f"{GATEWAY}/v1/models", timeout=5, verify=trust(),
                               headers={"Authorization": f"Bearer {MASTER_KEY}"})
            return answer.status_code == 200 and "gw-chat" in {m["id"] for m in answer.json()["data"]}
        except (httpx.HTTPError, ValueError):
            return False
    wait_for("the gateway to list gw-chat again", ready, 120, every_s=0.5)


def model_text(name: str, decode_tok_s: int) -> str:
    return (f"image: rigkit-vllm-standin:sim\nweights: {{source: /srv/rigkit-sim-models/{name}}}\ngpus: [0]\n"
            f"port: {PORTS[name]}\nvllm: {{dtype: bfloat16, served_model_name: gw-chat}}\n"
            f"env: {{STANDIN_DECODE_TOK_S: \"{decode_tok_s}\", STANDIN_PREFILL_TOK_S: \"5000\"}}\nready_timeout_s: 30\n")


def write_catalog(folder, decode_tok_s: int) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for name in PORTS:
        (folder / f"{name}.yml").write_text(model_text(name, decode_tok_s))


@dataclass
class Fleet:
    folder: object
    inventory: object
    catalog: object
    rig_a: SimRig
    rig_b: SimRig
    hosts: list  # the inventory's (host, data) pairs, as written to `inventory`

    def env(self) -> dict:
        return dict(os.environ, RIGKIT_STATE=str(STATE_ROOT))

    def deploy(self) -> "object":
        run = run_deploy(self.rig_a, entry="deploy.py", inventory=str(self.inventory), verify=False)
        (self.folder / "last-deploy.log").write_text(run.output)  # for a person reading a failure
        return run


def gateway_container() -> dict:
    """The proxy's container as the engine saw it, for a failure's message: a restart (by Docker's policy
    or by hand), an exit and its code, and its last log lines."""
    try:
        container = docker.from_env().containers.get("rigkit-gateway-litellm-1")
    except docker.errors.NotFound:
        return {"container": "not found"}
    state = container.attrs["State"]
    return {"restart_count": container.attrs["RestartCount"], "started_at": state["StartedAt"],
            "finished_at": state["FinishedAt"], "exit_code": state["ExitCode"], "oom_killed": state["OOMKilled"],
            "log": container.logs(tail=30).decode(errors="replace")}


def remove_projects() -> None:
    client = docker.from_env()
    for project in PROJECTS:
        for container in client.containers.list(all=True, filters={"label": f"com.docker.compose.project={project}"}):
            container.remove(force=True)


@pytest.fixture(scope="module")
def fleet(fresh_rig, tmp_path_factory):
    from tests.gateway.image import ensure_litellm_image
    from tests.simrig.weights import ensure_checkpoint
    from tests.vllm_standin.image import ensure_standin_image

    ensure_standin_image()
    image = ensure_litellm_image()
    for name in PORTS:
        ensure_checkpoint(name)
    remove_projects()
    rig_b = SimRig(name=RIG_B[0], ssh_port=RIG_B[1]).start(log=lambda m: print(m, file=sys.stderr))
    folder = tmp_path_factory.mktemp("gateway")
    write_catalog(folder / "models", 200)
    key, master = folder / "rig.key", folder / "master.key"
    FLEET_CA["file"] = folder / "rigkit-ca" / "ca.pem"  # made by the first deploy (tls: rigkit, the default)
    for path, text in ((key, RIG_KEY), (master, MASTER_KEY)):
        path.write_text(text + "\n")
        path.chmod(0o600)
    base = (DATA / "rigs" / "serving.yml").read_text().replace("models: [test-alpha, test-beta]", "models: [MODEL]")
    for rig, model in (("rig-a", "gw-chat-a"), ("rig-b", "gw-chat-b")):
        (folder / f"{rig}.yml").write_text(base.replace("MODEL", model) + f"api_key_file: {key}\n")
    ssh = {"ssh_hostname": "127.0.0.1", "ssh_user": "root", "ssh_key": str(ssh_keypair()),
           "ssh_known_hosts_file": "/dev/null", "ssh_strict_host_key_checking": "off",
           "catalog_dir": str(folder / "models"), "rigkit_verify": "never"}
    # Health checks every HEALTH_CHECK_S (a legal value; the default is 30 s) and as short a cooldown:
    # LiteLLM's view of a restarted replica changes within seconds, so the tests wait for that state
    # instead of sleeping through 30 s windows.
    gateway = {"port": GATEWAY_PORT, "master_key_file": str(master), "image": image, "ready_timeout_s": 180,
               "drain_timeout_s": 30, "cooldown_s": HEALTH_CHECK_S, "health_check_interval_s": HEALTH_CHECK_S}
    hosts = [
        ("rig-a", {**ssh, "ssh_port": fresh_rig.ssh_port, "rig_file": str(folder / "rig-a.yml"), "gateway": gateway}),
        ("rig-b", {**ssh, "ssh_port": RIG_B[1], "rig_file": str(folder / "rig-b.yml"), "gateway_address": "127.0.0.1"}),
    ]
    inventory = folder / "inventory.py"
    inventory.write_text(f"rigs = {hosts!r}\n")  # pyinfra takes (host, data) tuples
    yield Fleet(folder, inventory, folder / "models", fresh_rig, rig_b, hosts)
    remove_projects()
    rig_b.remove()


def chat(client: httpx.Client, stream: bool = True, max_tokens: int = 8, key: str = MASTER_KEY) -> dict:
    """One chat request through the gateway; what came back (ok, usage, the deployment that served it)."""
    body = {"model": "gw-chat", "messages": [{"role": "user", "content": "one two three four five six"}],
            "max_tokens": max_tokens, "stream": stream}
    if stream:
        body["stream_options"] = {"include_usage": True}
    url = f"{GATEWAY}/v1/chat/completions"
    headers = {"Authorization": f"Bearer {key}"}
    try:
        if not stream:
            answer = client.post(url, json=body, headers=headers, timeout=60)
            return {"ok": answer.status_code == 200, "usage": answer.json().get("usage"),
                    "deployment": answer.headers.get("x-litellm-model-id"), "status": answer.status_code}
        usage, done = None, False
        with client.stream("POST", url, json=body, headers=headers, timeout=60) as answer:
            for line in answer.iter_lines():
                if line.startswith("data:"):
                    data = line[5:].strip()
                    if data == "[DONE]":
                        done = True
                    elif data:
                        event = json.loads(data)
                        if "error" in event:
                            return {"ok": False, "status": answer.status_code, "error": event["error"]}
                        usage = event.get("usage") or usage
            return {"ok": answer.status_code == 200 and done and bool(usage), "usage": usage,
                    "deployment": answer.headers.get("x-litellm-model-id"), "status": answer.status_code}
    except (httpx.HTTPError, ValueError) as exc:
        return {"ok": False, "error": repr(exc)}


@dataclass
class Load:
    """A steady, bounded client stream: `workers` threads, one request after another each."""

    workers: int = 4
    key: object = lambda: MASTER_KEY  # the key each request sends, asked again before each one
    results: list = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)

    def __enter__(self):
        def work():
            with gateway_client() as client:
                while not self.stop.is_set():
                    started = time.monotonic()
                    result = chat(client, key=self.key())
                    self.results.append({**result, "started": started, "ended": time.monotonic()})
        self.threads = [threading.Thread(target=work, daemon=True) for _ in range(self.workers)]
        for thread in self.threads:
            thread.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        for thread in self.threads:
            thread.join(timeout=90)

    def failures(self):
        return [r for r in self.results if not r["ok"]]

    def wait_count(self, count: int, after: float = 0.0, timeout_s: float = 60) -> None:
        """Until `count` requests started after `after` (monotonic) have finished."""
        wait_for(f"{count} requests through the gateway", lambda: sum(r["started"] >= after for r in list(self.results))
                 >= count, timeout_s)


def test_deploy_routes_to_both_rigs_usage_streams_through_and_a_second_deploy_changes_nothing(fleet):
    first = fleet.deploy()
    assert first.returncode == 0, first.output[-6000:]
    with gateway_client() as client:
        answers = [chat(client) for _ in range(24)]
        plain = chat(client, stream=False, max_tokens=5)
    assert all(a["ok"] for a in answers), ([a for a in answers if not a["ok"]][:3], first.output[-4000:])
    # Usage passes through streaming: the stand-in counts the 8 generated tokens, the client reads them.
    assert {a["usage"]["completion_tokens"] for a in answers} == {8}
    assert plain["ok"] and plain["usage"]["completion_tokens"] == 5
    assert {a["deployment"] for a in answers} == {"rig-a.gw-chat-a", "rig-b.gw-chat-b"}  # both replicas serve
    for name, port in PORTS.items():  # an independent read: each stand-in counted requests of its own
        metrics = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
        assert "vllm:generation_tokens_total" in metrics
    # The rig's key reached the stand-ins (they refuse requests without it) and no secret is world-readable.
    secrets = ("gateway.env", "gateway-tls.key", "gateway-backend-keys.json")
    code, listing = fleet.rig_a.exec("stat -c '%a %n' " + " ".join(f"/etc/rigkit/secrets/{s}" for s in secrets))
    assert all(f"600 /etc/rigkit/secrets/{s}" in listing for s in secrets), listing
    inside = docker.from_env().containers.get("rigkit-gateway-litellm-1").exec_run(
        ["stat", "-c", "%a", "/etc/litellm/backend_keys.json"])
    assert inside.output.decode().strip() == "600", inside  # the rigs' keys, handed to the running proxy
    code, compose = fleet.rig_a.exec("cat /etc/rigkit/gateway/compose.yml")
    assert MASTER_KEY not in compose and "$$ and" not in compose and RIG_KEY not in compose
    attrs = json.dumps(docker.from_env().containers.get("rigkit-gateway-litellm-1").attrs)
    assert "PRIVATE KEY" not in compose and "PRIVATE KEY" not in attrs  # not in its env or command either
    assert json.dumps(RIG_KEY)[1:-1] not in attrs  # the rigs' keys are not in the proxy's environment
    # HTTPS only: plain HTTP on the gateway's port gets no answer, and the fleet CA's certificate names it.
    with pytest.raises(httpx.HTTPError):
        httpx.get(f"http://127.0.0.1:{GATEWAY_PORT}/health/liveliness", timeout=5)
    with pytest.raises(httpx.ConnectError, match="CERTIFICATE_VERIFY_FAILED"):
        httpx.get(f"{GATEWAY}/health/liveliness", timeout=5)  # the system's CAs do not know the fleet's

    started = docker.from_env().containers.get("rigkit-gateway-litellm-1").attrs["State"]["StartedAt"]
    second = fleet.deploy()
    assert second.returncode == 0, second.output[-6000:]
    assert second.changed_operations() == 0, second.output[-6000:]
    assert docker.from_env().containers.get("rigkit-gateway-litellm-1").attrs["State"]["StartedAt"] == started
    # `rigkit status` reads the gateway's HTTPS on its rig: the deployed certificate, a year ahead.
    out = fleet.folder / "status.json"
    subprocess.run([sys.executable, "-m", "rigkit.cli", "status", str(fleet.inventory), "--limit", "rig-a", "--json",
                    str(out)], cwd=REPO, env=fleet.env(), capture_output=True, text=True, timeout=300)
    [doc] = [d for d in json.loads(out.read_text())["rigs"] if d["rig"] == "rig-a"]
    assert doc["gateway_tls"]["days_left"] >= 390, doc.get("gateway_tls")
    assert not [f for f in doc["failures"] if f["what"] == "gateway"], doc["failures"]


def test_a_rolling_rollout_of_both_rigs_loses_no_request(fleet):
    before = {n: docker.from_env().containers.get(f"rigkit-{n}-vllm-1").id for n in PORTS}
    write_catalog(fleet.catalog, 240)  # every model's config changes: both replicas restart
    with Load() as load:
        load.wait_count(20)  # the load runs before the rollout starts...
        rollout = subprocess.run([sys.executable, "-m", "rigkit.cli", "rollout", str(fleet.inventory)], cwd=REPO,
                                 env=fleet.env(), capture_output=True, text=True, timeout=900)
        load.wait_count(20, after=time.monotonic())  # ...and goes on after it ended
    output = rollout.stdout + rollout.stderr
    assert rollout.returncode == 0, output[-6000:]
    assert "drained rig-a" in output and "drained rig-b" in output, output[-3000:]
    after = {n: docker.from_env().containers.get(f"rigkit-{n}-vllm-1").id for n in PORTS}
    assert all(before[n] != after[n] for n in PORTS)  # both replicas really were replaced
    for port in PORTS.values():
        assert httpx.get(f"http://127.0.0.1:{port}/standin/info", timeout=5).json()["decode_tok_s"] == 240.0
    assert len(load.results) > 100, len(load.results)
    assert load.failures() == [], (load.failures()[:5], len(load.failures()), gateway_container(), output[-3000:])
    print(f"rollout under load: {len(load.results)} requests, 0 failed")


def test_one_replica_killed_under_load_fails_only_requests_before_litellm_knows_and_traffic_moves(fleet):
    """rig-b's replica is killed under a steady load. Requests it was serving, and retries that landed on
    it before LiteLLM knew, may fail; once LiteLLM's health check has marked it, none fails and every
    request goes to rig-a."""
    replica = docker.from_env().containers.get("rigkit-gw-chat-b-vllm-1")
    with watchdog_held(fleet.rig_b), Load() as load:
        load.wait_count(20)
        killed_at = time.monotonic()
        replica.update(restart_policy={"Name": "no"})  # it stays dead: no restart brings it back mid-test
        replica.kill()
        wait_for("LiteLLM's health check to mark rig-b's replica failed",
                 lambda: litellm_health().get(REPLICA_IDS["gw-chat-b"]) is False, 3 * HEALTH_CHECK_S + 30, every_s=0.5)
        marked_at = time.monotonic()
        load.wait_count(40, after=marked_at)
        replica.reload()
        assert replica.status == "exited", replica.status  # dead all along: nothing brought it back
    failed = load.failures()
    after = [r for r in load.results if r["started"] >= marked_at]
    print(f"replica killed: {len(load.results)} requests, {len(failed)} failed, LiteLLM marked it "
          f"{marked_at - killed_at:.1f} s after the kill")
    assert all(r["started"] < marked_at for r in failed), failed[:5]
    # In flight at the kill: at most one stream per worker is cut; a retry may also land on the dead
    # replica until LiteLLM cools it down (allowed_fails: 1), at most num_retries more per worker.
    assert len(failed) <= load.workers * 3, failed[:5]
    assert len(after) >= 40 and all(r["ok"] and r["deployment"] == REPLICA_IDS["gw-chat-a"] for r in after), after[:3]


@contextlib.contextmanager
def watchdog_held(rig: SimRig):
    """The rig's watchdog stopped (its timer and a pass in progress) while a test keeps a replica down on
    purpose: rigkit-watchdog starts a model whose containers all exited, so one of its passes (every 30 s)
    could bring the replica back before LiteLLM's health check saw it gone, and the test would wait for a
    mark that never comes (CI's loaded machine, once: 45 s). The watchdog's own tests are in
    test_watchdog_rig and test_engine."""
    code, out = rig.exec("systemctl stop rigkit-watchdog.timer rigkit-watchdog.service")
    assert code == 0, out
    try:
        yield
    finally:
        rig.exec("systemctl start rigkit-watchdog.timer")


def bring_back_rig_b(fleet) -> None:
    """rig-b's replica as the deploy makes it (a test above killed it), and LiteLLM routing to it."""
    for container in docker.from_env().containers.list(all=True, filters={"label": "com.docker.compose.project=rigkit-gw-chat-b"}):
        container.remove(force=True)
    write_catalog(fleet.catalog, 240)
    run = fleet.deploy()
    assert run.returncode == 0, run.output[-4000:]


def test_a_drain_waits_until_litellm_routes_to_a_replica_restarted_just_before(fleet):
    """rig-b's replica stops until LiteLLM's health check marks it failed, then starts again: until its
    next passing check LiteLLM sends it nothing, and the drain filter, finding no other replica, keeps
    rig-a's. Draining rig-a therefore waits until a probe through the gateway lands on rig-b; from the
    moment the drain returns, every request goes to rig-b."""
    bring_back_rig_b(fleet)
    replica = docker.from_env().containers.get("rigkit-gw-chat-b-vllm-1")
    with watchdog_held(fleet.rig_b):
        replica.stop(timeout=10)
        wait_for("LiteLLM to mark rig-b's stopped replica failed",
                 lambda: litellm_health().get(REPLICA_IDS["gw-chat-b"]) is False, 3 * HEALTH_CHECK_S + 30, every_s=0.5)
        replica.start()

    def answers_directly():
        try:
            return httpx.get(f"http://127.0.0.1:{PORTS['gw-chat-b']}/v1/models", timeout=2,
                             headers={"Authorization": f"Bearer {RIG_KEY}"}).status_code == 200
        except httpx.HTTPError:
            return False
    wait_for("rig-b's replica to answer again", answers_directly, 60)
    marked_failed = litellm_health().get(REPLICA_IDS["gw-chat-b"]) is False  # almost always: checks are 5 s apart
    started = time.monotonic()
    code, said = fleet.rig_a.exec("/usr/local/sbin/rigkit-gateway drain rig-a")
    took = time.monotonic() - started
    assert code == 0, said
    assert "routed gw-chat to rig-b" in said and "drained rig-a" in said, said
    with gateway_client() as client:
        answers = [chat(client) for _ in range(12)]
    assert all(a["ok"] for a in answers), answers[:3]
    assert {a["deployment"] for a in answers} == {REPLICA_IDS["gw-chat-b"]}, (answers[:3], said)
    if marked_failed:  # the drain began while LiteLLM still routed around rig-b: it must have waited
        assert took > 0.5, (took, said)
    print(f"drain with rig-b just restarted (LiteLLM still marking it failed: {marked_failed}): {took:.1f} s")
    code, said = fleet.rig_a.exec("/usr/local/sbin/rigkit-gateway undrain rig-a")
    assert code == 0 and "routed gw-chat to rig-a.gw-chat-a" in said, said


def test_a_rig_that_fails_its_rollout_stays_out_of_the_gateway_and_the_rollout_stops(fleet):
    """rig-a's new config cannot start (the stand-in's fail_at_start): its stack rolls back, the rollout
    stops before rig-b, and the gateway keeps rig-a drained: every request goes to rig-b."""
    bring_back_rig_b(fleet)  # a test above killed or restarted rig-b's replica
    broken = model_text("gw-chat-a", 240).replace('STANDIN_PREFILL_TOK_S: "5000"', 'STANDIN_PREFILL_TOK_S: "5000", STANDIN_FAULT: fail_at_start')
    (fleet.catalog / "gw-chat-a.yml").write_text(broken)
    rollout = subprocess.run([sys.executable, "-m", "rigkit.cli", "rollout", str(fleet.inventory)], cwd=REPO,
                             env=fleet.env(), capture_output=True, text=True, timeout=900)
    output = rollout.stdout + rollout.stderr
    assert rollout.returncode == 1, output[-4000:]
    assert "STOPPED: rig-a failed; rig-a stays out of the gateway; rigs not started: rig-b" in output, output[-4000:]
    with gateway_client() as client:
        answers = [chat(client) for _ in range(12)]
    assert all(a["ok"] for a in answers), answers[:3]
    assert {a["deployment"] for a in answers} == {"rig-b.gw-chat-b"}
    # Another rig's drain and return (its own rollout) must not bring rig-a back with it.
    for action in ("drain rig-b", "undrain rig-b"):
        code, said = fleet.rig_a.exec(f"/usr/local/sbin/rigkit-gateway {action}")
        assert code == 0, said
    assert "still drained: rig-a" in said, said
    with gateway_client() as client:
        answers = [chat(client) for _ in range(12)]
    assert {a["deployment"] for a in answers} == {"rig-b.gw-chat-b"}, answers[:3]


def test_a_stopped_gateway_does_not_block_a_rollout(fleet, monkeypatch):
    """With the proxy's container stopped nothing is routed through it: the drain step reports
    nothing to drain (the rollout goes on) instead of stopping the rollout that could repair it."""
    from rigkit.config.inventory import load_inventory
    from rigkit.gateway.drain import NOT_INSTALLED, gateway_helper
    from rigkit.gateway.plan import gateway_plan

    for key, value in fleet.env().items():
        monkeypatch.setenv(key, value)
    monkeypatch.chdir(REPO)
    plan = gateway_plan(list(load_inventory(str(fleet.inventory))))
    [proxy] = docker.from_env().containers.list(filters={"label": "com.docker.compose.project=rigkit-gateway"})
    proxy.stop(timeout=10)
    try:
        assert gateway_helper(str(fleet.inventory), plan, "drain", "rig-b") == NOT_INSTALLED
    finally:
        proxy.start()
        wait_gateway_ready()  # the tests after this one route through it


def verify_run(fleet, results, entry: str = "deploy.py", *extra: str):
    """The real pyinfra CLI with verification on (the fixture's inventory turns it off for the tests above):
    deploy.py verifies what the deploy changed, verify.py everything (`rigkit verify`)."""
    switch = "always" if entry == "verify.py" else "after-changes"
    return run_deploy(fleet.rig_a, str(fleet.folder / "rig-a.yml"), *extra, "--data", f"rigkit_verify={switch}",
                      "--data", f"results_dir={results}", entry=entry, inventory=str(fleet.inventory))


def gateway_results(results) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted((results / "rig-a" / "_gateway").glob("*.json"))]


def back_to_normal(fleet) -> None:
    """Undo the tests above (rig-a left drained by a failed rollout, a broken config) and change both
    replicas' configs (a decode rate no test above used), so the next deploy has something to verify."""
    code, said = fleet.rig_a.exec("[ ! -x /usr/local/sbin/rigkit-gateway ] || /usr/local/sbin/rigkit-gateway undrain")
    assert code == 0, said
    write_catalog(fleet.catalog, 220)


def test_a_deploy_verifies_each_model_through_the_gateway_with_usage_and_the_added_ttft(fleet):
    """Both rigs' models change, so the deploy verifies them directly and then, on rig-a, through the
    gateway: one entry per served name, tokens from usage, TTFT against rig-a's replica, alternating.
    (Its results folder is the module's: each model's gate here establishes the proven result that the
    canary test below is gated against.)"""
    back_to_normal(fleet)
    results = fleet.folder / "results"
    run = verify_run(fleet, results)
    assert run.returncode == 0, run.output[-6000:]
    assert "verification through the gateway:" in run.output, run.output[-8000:]
    assert "PASS  gateway gw-chat: 64 of 64 tokens counted from the server's usage" in run.output, run.output[-8000:]
    [doc] = gateway_results(results)
    assert doc["kind"] == "gateway" and doc["gateway_host"] == "rig-a" and doc["passed"] is True
    [entry] = doc["models"]
    assert entry["model"] == "gw-chat" and set(entry["replicas"]) == {"rig-a.gw-chat-a", "rig-b.gw-chat-b"}
    assert entry["usage_passed_through"] is True and entry["usage_from_server"] is True
    assert entry["completion_tokens"] == 64 and entry["bench"]["completion_tokens"] == 64  # from usage
    assert entry["usage_probe"]["direct"] == entry["usage_probe"]["gateway"] == [64, 8]  # the server's own count
    assert entry["prompt_tokens"] == 512
    assert entry["ttft_direct_replica"] == "rig-a.gw-chat-a"  # the replica on the gateway's own rig
    assert len(entry["ttft_direct_samples_ms"]) == len(entry["ttft_gateway_samples_ms"]) == 6
    assert entry["ttft_added_ms"] == pytest.approx(entry["ttft_gateway_ms"] - entry["ttft_direct_ms"])
    assert {c["name"] for c in entry["checks"] if c["passed"]} >= {"tokens_produced", "gateway_usage", "gateway_ttft"}
    print(next(line.strip() for line in run.output.splitlines() if "PASS  gateway gw-chat" in line))
    # LiteLLM's background health checks reach both replicas with their keys (the stand-ins refuse others).
    health = httpx.get(f"{GATEWAY}/health", headers={"Authorization": f"Bearer {MASTER_KEY}"}, verify=trust(),
                       timeout=60).json()
    assert health["healthy_count"] == 2 and health["unhealthy_count"] == 0, health
    # Nothing changed since: the next deploy changes nothing and verifies nothing.
    again = verify_run(fleet, results)
    assert again.returncode == 0 and again.changed_operations() == 0, again.output[-6000:]
    assert "verification through the gateway" not in again.output and len(gateway_results(results)) == 1


def test_a_gateway_that_drops_usage_from_streams_fails_verification_through_it(fleet, tmp_path):
    """Simulated: a gateway that does not pass usage through streaming. The deployed proxy's config gets
    a LiteLLM callback (tests/gateway/strip_usage.py) that drops usage from streamed chunks; `rigkit
    verify` then fails with the reason, and the next deploy puts rigkit's own config back."""
    code, text = fleet.rig_a.exec("cat /etc/rigkit/gateway/compose.yml")
    assert code == 0, text
    header, body = text.split("\n", 1)
    compose = json.loads(body)
    config = compose["configs"]["litellm_config"]["content"]
    compose["configs"]["litellm_config"]["content"] = config.replace(
        "- rigkit_drain.handler", "- rigkit_drain.handler\n  - strip_usage.handler")
    compose["configs"]["strip_usage"] = {"content": (REPO / "tests/gateway/strip_usage.py").read_text()}
    compose["services"]["litellm"]["configs"].append({"source": "strip_usage", "target": "/etc/litellm/strip_usage.py"})
    changed = header + "\n" + json.dumps(compose, indent=2) + "\n"
    client = docker.from_env().containers.get(fleet.rig_a.name)
    archive = io.BytesIO()
    with tarfile.open(fileobj=archive, mode="w") as tar:
        info = tarfile.TarInfo("compose.yml")
        info.size = len(changed.encode())
        tar.addfile(info, io.BytesIO(changed.encode()))
    assert client.put_archive("/etc/rigkit/gateway", archive.getvalue())
    code, said = fleet.rig_a.exec("/usr/local/sbin/rigkit-gateway up")
    assert code == 0, said

    run = verify_run(fleet, tmp_path, "verify.py", "--limit", "rig-a")
    assert run.returncode != 0, run.output[-6000:]
    assert "verification through the gateway failed" in run.output, run.output[-6000:]
    assert "gateway_usage: no usage reached the client through the gateway's stream" in run.output
    assert "FAIL  gateway gw-chat: NO USAGE through the gateway" in run.output
    [doc] = gateway_results(tmp_path)
    assert doc["passed"] is False and doc["models"][0]["completion_tokens"] is None  # nothing counted from chunks

    repaired = verify_run(fleet, tmp_path)  # a deploy: the compose file differs, so the gateway is redone
    assert repaired.returncode == 0, repaired.output[-6000:]
    assert "PASS  gateway gw-chat: 64 of 64 tokens counted from the server's usage" in repaired.output


def gated_inventory(fleet, results) -> object:
    """The fixture's inventory with verification on (and with it the rollout gate), results in `results`."""
    found: dict = {}
    exec(fleet.inventory.read_text(), found)  # noqa: S102 (the fixture's own file: `rigs = [...]`)
    hosts = [(name, {**data, "rigkit_verify": "after-changes", "results_dir": str(results)})
             for name, data in found["rigs"]]
    path = fleet.folder / "inventory-gated.py"
    path.write_text(f"rigs = {hosts!r}\n")
    return path


def test_a_rollout_whose_canary_the_gate_refuses_stops_there_and_the_canary_is_put_back(fleet):
    """The canary: a two-rig `rigkit rollout` with verification on, to a config with prefix caching off
    (a seed class: a repeated prompt pays its whole prefill again). rig-a goes first, drained from the
    gateway; its rollout gate refuses the config and rolls back, the old config verified; the rollout
    stops before rig-b, which is not touched (its container, its config, its stack files). rig-a then
    serves only its proven config, so it is put back in the gateway: requests reach both rigs again.
    Gated against the proven results the test above established (its results folder is the module's)."""
    results = fleet.folder / "results"
    inventory = gated_inventory(fleet, results)
    engine = docker.from_env()
    before_b = engine.containers.get("rigkit-gw-chat-b-vllm-1").id
    stack_b = fleet.rig_b.exec("cd /etc/rigkit/stacks/gw-chat-b && sha256sum *")[1]
    for name in PORTS:
        (fleet.catalog / f"{name}.yml").write_text(model_text(name, 220).replace(
            "served_model_name: gw-chat}", "served_model_name: gw-chat, enable_prefix_caching: false}"))
    rollout = subprocess.run([sys.executable, "-m", "rigkit.cli", "rollout", str(inventory)], cwd=REPO,
                             env=fleet.env(), capture_output=True, text=True, timeout=900)
    output = rollout.stdout + rollout.stderr
    (fleet.folder / "canary-rollout.log").write_text(output)
    assert rollout.returncode == 1, output[-6000:]
    assert "rollout gate REFUSED gw-chat-a: prefix_cache" in output, output[-6000:]
    assert "ROLLED BACK to the last proven config; its verification passed" in output, output[-6000:]
    assert ("STOPPED: the rollout gate refused gw-chat-a on rig-a, rolled back to the last proven config and "
            "verified; it is back in the gateway; rigs not started: rig-b") in output, output[-4000:]
    assert "drained rig-a" in output and "rig 2/2" not in output, output[-4000:]
    # rig-b untouched: the same container, its files as they were; each stand-in serves its old config.
    assert engine.containers.get("rigkit-gw-chat-b-vllm-1").id == before_b
    assert fleet.rig_b.exec("cd /etc/rigkit/stacks/gw-chat-b && sha256sum *")[1] == stack_b
    for port in PORTS.values():
        info = httpx.get(f"http://127.0.0.1:{port}/standin/info", timeout=5).json()
        assert info["args"]["enable_prefix_caching"] and info["decode_tok_s"] == 220.0, info
    # rig-a is back: the gateway routes to both replicas again (once LiteLLM's checks pass its restart).
    seen: set = set()

    def both_serve():
        with gateway_client() as client:
            answers = [chat(client) for _ in range(6)]
        assert all(a["ok"] for a in answers), answers[:3]
        seen.update(a["deployment"] for a in answers)
        return seen == set(REPLICA_IDS.values())
    wait_for("the gateway to route to rig-a again", both_serve, 3 * HEALTH_CHECK_S + 30, every_s=0.5)


def with_client_keys(fleet, *keys: str) -> list:
    """The fleet's inventory with these client keys (a file each, mode 600) in the gateway's entry."""
    paths = []
    for key in keys:
        path = fleet.folder / f"client-{hashlib.sha256(key.encode()).hexdigest()[:8]}.key"
        path.write_text(key + "\n")
        path.chmod(0o600)
        paths.append(str(path))
    fleet.hosts[0][1]["gateway"]["client_key_files"] = paths
    fleet.inventory.write_text(f"rigs = {fleet.hosts!r}\n")
    return paths


def client_hashes() -> list:
    """The client keys' hashes the running proxy's key check reads."""
    container = docker.from_env().containers.get("rigkit-gateway-litellm-1")
    code, out = container.exec_run(["cat", "/etc/litellm/client_keys.json"])
    assert code == 0, out
    return json.loads(out)["sha256"]


def test_client_keys_rotate_under_load_with_no_failed_request(fleet):
    """Four streams of requests without pause, each with the clients' current key: a deploy adds the new key
    (both accepted, the proxy not restarted), the clients move to it, a deploy removes the old one. Not one
    request fails; the old key is refused after."""
    old, new = "sk-client-old-7f3a", "sk-client-new-91c2"
    with_client_keys(fleet, old)
    run = fleet.deploy()
    assert run.returncode == 0, run.output[-6000:]
    started = docker.from_env().containers.get("rigkit-gateway-litellm-1").attrs["State"]["StartedAt"]
    current = {"key": old}
    with Load(key=lambda: current["key"]) as load:
        load.wait_count(20)
        began = time.monotonic()
        with_client_keys(fleet, old, new)
        added = fleet.deploy()
        assert added.returncode == 0, added.output[-6000:]
        assert len(client_hashes()) == 2, client_hashes()  # in the running proxy: the deploy handed it both
        current["key"] = new  # every client has the new key from here on
        switched = time.monotonic()
        load.wait_count(20, after=switched)
        with_client_keys(fleet, new)
        removed = fleet.deploy()
        assert removed.returncode == 0, removed.output[-6000:]
        assert client_hashes() == [hashlib.sha256(new.encode()).hexdigest()]
        ended = time.monotonic()
        load.wait_count(20, after=ended)
    results = load.results
    assert not load.failures(), (load.failures()[:3], gateway_container())
    assert docker.from_env().containers.get("rigkit-gateway-litellm-1").attrs["State"]["StartedAt"] == started
    with gateway_client() as client:
        refused = chat(client, stream=False, key=old)
        assert not refused["ok"] and refused["status"] == 401, refused
        assert chat(client, key=new)["ok"] and chat(client)["ok"]  # the master key still works
        # A client key reaches the model routes, not the proxy's admin routes; the master key reaches both.
        def status(method, path, key):
            return client.request(method, f"{GATEWAY}{path}", headers={"Authorization": f"Bearer {key}"},
                                  timeout=60).status_code
        assert status("GET", "/v1/models", new) == 200
        assert {status("GET", "/health", new), status("POST", "/cache/flushall", new),
                status("GET", "/debug/asyncio-tasks", new)} == {403}
        assert status("GET", "/health", MASTER_KEY) == 200
    during = [r for r in results if began <= r["started"] <= ended]
    print(f"client key rotation under {load.workers} streams: {len(results)} requests, {len(load.failures())} failed; "
          f"{len(during)} during the rotation, which took {ended - began:.1f} s (two deploys; the new key "
          f"accepted after {switched - began:.1f} s)")
    for line in added.output.splitlines():
        assert old not in line and new not in line  # no key in anything the deploy prints


def with_rig_keys(fleet, sent: str, accepted: str | None) -> None:
    """Both rigs' files: `sent` in their api_key_file, and `accepted`, when given, in accept_api_key_files."""
    for path, key in ((fleet.folder / "rig.key", sent), (fleet.folder / "rig-other.key", accepted)):
        if key is not None:
            path.write_text(key + "\n")
            path.chmod(0o600)
    for rig in ("rig-a", "rig-b"):
        path = fleet.folder / f"{rig}.yml"
        lines = [line for line in path.read_text().splitlines() if not line.startswith("accept_api_key_files:")]
        if accepted is not None:
            lines.append(f"accept_api_key_files: [{fleet.folder / 'rig-other.key'}]")
        path.write_text("\n".join(lines) + "\n")


def replica_answers(key: str) -> set:
    """What each replica says, asked directly (not through the gateway) with `key`."""
    return {httpx.get(f"http://127.0.0.1:{port}/v1/models", headers={"Authorization": f"Bearer {key}"},
                      timeout=10).status_code for port in PORTS.values()}


def test_the_models_key_rotates_under_load_with_no_failed_request(fleet):
    """Four streams through the gateway while the models' key rotates in three rollouts: the new key accepted
    beside the old (each rig drained while its servers restart), then sent instead of it (no server and not the
    proxy restarted: the proxy sends the new key from its next call), then the old one dropped (drained again).
    Not one request fails; after, the servers refuse the old key."""
    old, new = RIG_KEY, "sk-models-new-2b7e"
    client = docker.from_env()
    first = fleet.deploy()  # the fleet as the tests before left it, with the gateway up
    assert first.returncode == 0, first.output[-6000:]

    def engines():
        return {n: client.containers.get(f"rigkit-{n}-vllm-1").id for n in PORTS}

    def rollout():
        done = subprocess.run([sys.executable, "-m", "rigkit.cli", "rollout", str(fleet.inventory)], cwd=REPO,
                              env=fleet.env(), capture_output=True, text=True, timeout=900)
        output = done.stdout + done.stderr
        assert done.returncode == 0, output[-6000:]
        assert old not in output and new not in output  # no key in anything rigkit prints
        return output

    proxy_started = client.containers.get("rigkit-gateway-litellm-1").attrs["State"]["StartedAt"]
    with Load() as load:
        load.wait_count(20)
        began = time.monotonic()
        before = engines()
        with_rig_keys(fleet, old, new)  # 1. both accepted, the old one sent
        added = rollout()
        assert "drained rig-a" in added and "drained rig-b" in added, added[-3000:]
        assert all(engines()[n] != before[n] for n in PORTS)  # the servers restarted with both keys
        assert replica_answers(old) == replica_answers(new) == {200}
        swapped_at = time.monotonic()
        kept = engines()
        with_rig_keys(fleet, new, old)  # 2. the new one sent, both still accepted
        rollout()
        assert engines() == kept  # nothing the servers take changed: none restarted
        load.wait_count(20, after=time.monotonic())
        with_rig_keys(fleet, new, None)  # 3. the old one dropped
        rollout()
        ended = time.monotonic()
        load.wait_count(20, after=ended)
    assert not load.failures(), (load.failures()[:3], len(load.failures()), gateway_container())
    assert client.containers.get("rigkit-gateway-litellm-1").attrs["State"]["StartedAt"] == proxy_started
    assert replica_answers(old) == {401} and replica_answers(new) == {200}
    during = [r for r in load.results if began <= r["started"] <= ended]
    print(f"models' key rotation under {load.workers} streams: {len(load.results)} requests, 0 failed; {len(during)} "
          f"during the rotation, which took {ended - began:.1f} s (three rollouts; the new key sent after "
          f"{swapped_at - began:.1f} s)")


def test_a_changed_gateway_config_recreates_the_proxy_which_then_serves_it(fleet):
    """A setting that lives in LiteLLM's config (num_retries, inline in the compose file): the deploy recreates
    the proxy (Compose alone would not: it leaves inline configs out of its hash, docker/compose#13045), and
    the proxy serves with the new config; a deploy of the same config leaves it running. Last in the module:
    it restarts the proxy."""
    client = docker.from_env()
    first = fleet.deploy()
    assert first.returncode == 0, first.output[-6000:]
    before = client.containers.get("rigkit-gateway-litellm-1").attrs["State"]["StartedAt"]
    fleet.hosts[0][1]["gateway"]["num_retries"] = 3
    fleet.inventory.write_text(f"rigs = {fleet.hosts!r}\n")
    changed = fleet.deploy()
    assert changed.returncode == 0, changed.output[-6000:]
    container = client.containers.get("rigkit-gateway-litellm-1")
    recreated = container.attrs["State"]["StartedAt"]
    assert recreated != before, gateway_container()
    code, served = container.exec_run(["cat", "/etc/litellm/config.yaml"])
    assert code == 0 and yaml.safe_load(served)["router_settings"]["num_retries"] == 3, served[-2000:]
    with gateway_client() as http:
        assert chat(http)["ok"]
    again = fleet.deploy()  # the same config: the proxy left running
    assert again.returncode == 0, again.output[-4000:]
    assert client.containers.get("rigkit-gateway-litellm-1").attrs["State"]["StartedAt"] == recreated
