"""A scan of a rig's network surface from another host, as an attacker on the LAN would run it: every TCP port
of the model's rig and of the gateway's rig, then every route of the real vLLM (its own /openapi.json) on each
port that answers, without a key and with one.

The rig is the real engine (vLLM's CPU build, the model's container as rigkit renders it) with the product's
firewall (rigkit.surface's ruleset, loaded by the real `nft` into the engine container's own network
namespace, never the host's), the rig's sshd (Debian's, in a container sharing that namespace) and rigkit's
monitoring exporter (its script, run by `nsenter` in that namespace); the gateway's rig is LiteLLM with
rigkit's TLS. They sit on a Docker network this test makes (10.199.8.0/24); the other hosts are containers
on it. Simulated: the GPUs (the exporter reads tests/simrig's pynvml) and the LAN, as a Docker bridge.

Two topologies: models behind the gateway (only its rig let in), and models served on the LAN without one
to the hosts of `serve_clients`.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import tarfile
from contextlib import ExitStack
from pathlib import Path

import docker
import httpx
import pytest
import yaml

from rigkit.config.loader import load_rig
from rigkit.config.schema import GatewaySpec
from rigkit.gateway.plan import RigView, plan as gateway_plan
from rigkit.gateway.stack import BACKEND_KEYS_FILE, TLS_KEY_ENV, backend_keys, env_file, render_compose as gateway_compose
from rigkit.gateway.tls import gateway_tls, wanted_names
from rigkit.rigside.keyfile import compose_env
from rigkit.serving.api_key import accepted_keys_config
from rigkit.serving.compose import ACCEPTED_KEYS_SECRET, render_compose
from rigkit.surface.plan import open_paths_warning, surface_plan
from rigkit.surface.rules import ruleset
from tests.conftest import DATA, REPO, wait_for

pytestmark = pytest.mark.simrig

SUBNET, HOST_SIDE = "10.199.8.0/24", "10.199.8.1"
RIG, GATEWAY, CLIENT, OUTSIDER = "10.199.8.2", "10.199.8.5", "10.199.8.6", "10.199.8.9"
RIG_KEY, NEXT_RIG_KEY, MASTER_KEY = "sk-scan-rig-3d9f", "sk-scan-rig-next-51c0", "sk-scan-master-77aa"
GATEWAY_PORT = 4000
PROJECTS, LABELS = ("rigkit-scan-rig", "rigkit-scan-gateway"), {"rigkit.test": "surface-scan"}
GUARDED = ("/v1", "/v2", "/inference", "/cohere")  # vLLM 0.32's AuthenticationMiddleware.GUARDED_PREFIX

# Run in a scanner container: every TCP port of each target, then on each open one what it is (SSH, TLS, HTTP)
# and the status of every route, without the key and with it. Prints one JSON document.
SCAN = r"""
import json, socket, ssl, sys, http.client
from concurrent.futures import ThreadPoolExecutor
job = json.loads(sys.stdin.read())

def connects(target, port):
    s = socket.socket()
    s.settimeout(1.0)
    try:
        s.connect((target, port))
        return True
    except OSError:
        return False
    finally:
        s.close()

def first_bytes(target, port):
    try:
        with socket.create_connection((target, port), timeout=2) as s:
            s.settimeout(1.0)
            return s.recv(64)
    except OSError:
        return b""

def speaks_tls(target, port):
    context = ssl._create_unverified_context()
    try:
        with socket.create_connection((target, port), timeout=3) as raw:
            with context.wrap_socket(raw):
                return True
    except (OSError, ssl.SSLError):
        return False

def status(target, port, tls, method, path, key):
    connection = (http.client.HTTPSConnection(target, port, timeout=10, context=ssl._create_unverified_context())
                  if tls else http.client.HTTPConnection(target, port, timeout=10))
    headers = {"Content-Type": "application/json", **({"Authorization": "Bearer " + key} if key else {})}
    try:
        connection.request(method, path, body=b"{}" if method == "POST" else None, headers=headers)
        return connection.getresponse().status
    except (OSError, http.client.HTTPException):
        return None
    finally:
        connection.close()

found = {}
with ThreadPoolExecutor(max_workers=256) as pool:
    for target, key in job["targets"].items():
        ports = [p for p, ok in zip(range(1, 65536), pool.map(lambda p: connects(target, p), range(1, 65536))) if ok]
        entry = {}
        for port in ports:
            banner = first_bytes(target, port)
            if banner.startswith(b"SSH-"):
                entry[port] = {"kind": "ssh"}
                continue
            tls = speaks_tls(target, port)
            routes = job["routes"]
            asks = [(m, p, k) for m, p in routes for k in (None, key)]
            with ThreadPoolExecutor(max_workers=8) as requests:  # a server's listen backlog is often 5
                codes = list(requests.map(lambda a: status(target, port, tls, *a), asks))
            entry[port] = {"kind": "https" if tls else "http",
                           "without_key": {f"{m} {p}": c for (m, p, k), c in zip(asks, codes) if k is None},
                           "with_key": {f"{m} {p}": c for (m, p, k), c in zip(asks, codes) if k is not None}}
        found[target] = entry
print(json.dumps(found))
"""


def tar(files: dict[str, bytes]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), 0o644
            archive.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def sh(*command: str, timeout: int = 120, **kwargs) -> str:
    done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, **kwargs)
    assert done.returncode == 0, (command, done.stdout[-2000:], done.stderr[-2000:])
    return done.stdout


def rig_file(folder: Path, serve_clients: list[str]) -> Path:
    text = (DATA / "rigs" / "engine.yml").read_text()
    key = folder / "rig.key"
    key.write_text(RIG_KEY + "\n")
    key.chmod(0o600)
    path = folder / "rig.yml"
    path.write_text(text + f"serve_address: 0.0.0.0\napi_key_file: {key}\nserve_clients: {json.dumps(serve_clients)}\n"
                    "monitoring: {enabled: true}\n")
    return path


class Lan:
    """The test's network, its containers and what runs in the rig's namespace; all removed at the end."""

    def __init__(self, folder: Path):
        self.folder, self.client = folder, docker.from_env()
        self.network = f"rigkit-scan-{os.getpid()}"
        self.projects: list[str] = []
        self.containers: list = []
        self.processes: list[subprocess.Popen] = []

    def __enter__(self):
        self._clear_leftovers()
        self.client.networks.create(self.network, driver="bridge", ipam=docker.types.IPAMConfig(
            pool_configs=[docker.types.IPAMPool(subnet=SUBNET, gateway=HOST_SIDE)]))
        return self

    def _clear_leftovers(self) -> None:
        """What a killed run of this test left behind: its stacks, its containers and its network, whose subnet
        would otherwise refuse this run's ("Pool overlaps with other one on this address space"). Only one
        Docker-based suite runs at a time (the lock in ./run), so any such leftover is no other run's."""
        for project in PROJECTS:
            subprocess.run(["docker", "compose", "-p", project, "down", "-v", "--remove-orphans"],
                           capture_output=True, timeout=120)
        for container in self.client.containers.list(all=True, filters={"label": "rigkit.test=surface-scan"}):
            container.remove(force=True)
        for network in self.client.networks.list(names=["rigkit-scan-"]):
            if network.name.startswith("rigkit-scan-"):
                network.reload()
                for container in network.containers:
                    container.remove(force=True)
                network.remove()

    def __exit__(self, *exc):
        for process in self.processes:
            process.kill()
            process.wait(timeout=30)
        for container in self.containers:
            container.remove(force=True)
        for project in self.projects:
            subprocess.run(["docker", "compose", "-p", project, "down", "-v", "--remove-orphans"], capture_output=True,
                           timeout=120)
        self.client.networks.get(self.network).remove()

    def compose(self, project: str, document: dict, address: str, env: dict | None = None) -> None:
        """The product's compose file, its host networking swapped for this network at `address`."""
        service = next(iter(document["services"].values()))
        service.pop("network_mode", None)
        service["networks"] = {"lan": {"ipv4_address": address}}
        document["networks"] = {"lan": {"external": True, "name": self.network}}
        path = self.folder / f"{project}.json"
        path.write_text(json.dumps(document))
        self.projects.append(project)
        sh("docker", "compose", "-p", project, "-f", str(path), "up", "-d", timeout=600,
           env={**os.environ, **(env or {})})

    def pid(self, project: str) -> int:
        [container] = self.client.containers.list(filters={"label": f"com.docker.compose.project={project}"})
        return container.attrs["State"]["Pid"]

    def beside(self, project: str, command: list[str]) -> None:
        """A container in the network namespace of `project`'s (the rig's sshd)."""
        from tests.simrig.image import ensure_image

        [rig] = self.client.containers.list(filters={"label": f"com.docker.compose.project={project}"})
        self.containers.append(self.client.containers.run(ensure_image(self.client), command, entrypoint=[],
                                                          labels=LABELS, network_mode=f"container:{rig.id}",
                                                          detach=True))

    def scan(self, source: str, targets: dict[str, str | None], routes: list[tuple[str, str]]) -> dict:
        """Scan `targets` ({address: the key to try}) from a host at `source` on this network."""
        from tests.simrig.image import ensure_image

        container = self.client.containers.create(ensure_image(self.client), ["sh", "-c", "python3 /scan.py < /job.json"],
                                                  entrypoint=[], labels=LABELS, network=self.network)
        self.containers.append(container)
        self.client.api.disconnect_container_from_network(container.id, self.network)
        self.client.api.connect_container_to_network(container.id, self.network, ipv4_address=source)
        container.put_archive("/", tar({"scan.py": SCAN.encode(),
                                        "job.json": json.dumps({"targets": targets, "routes": routes}).encode()}))
        container.start()
        assert container.wait(timeout=600)["StatusCode"] == 0, container.logs()[-3000:]
        return json.loads(container.logs(stdout=True, stderr=False).decode().strip().splitlines()[-1])


def routes_of(openapi: dict) -> list[tuple[str, str]]:
    """Every (method, path) the engine serves, a path parameter filled with a word."""
    found = []
    for path, methods in sorted(openapi["paths"].items()):
        concrete = "/".join("x" if part.startswith("{") else part for part in path.split("/"))
        found += [(method.upper(), concrete) for method in sorted(methods) if method in ("get", "post", "put", "delete")]
    return found


@pytest.fixture(scope="module")
def lan(tmp_path_factory):
    from tests.gateway.image import ensure_litellm_image
    from tests.vllm_engine.models import ensure_engine_model
    from rigkit.monitoring.files import exporter_settings
    from rigkit.rigside.keyfile import API_KEY_ENV_NAME

    folder = tmp_path_factory.mktemp("scan")
    model_dir = ensure_engine_model()
    rig = load_rig(rig_file(folder, []), DATA / "models")
    with ExitStack() as stack:
        net = stack.enter_context(Lan(folder))
        # The rig: the model's container as rigkit renders it for serve_address 0.0.0.0, in the middle of a key
        # rotation: vLLM takes both keys from rigkit's config file (a Compose secret, `--config`); rigkit's own
        # tools read the one they send from the env file.
        keys = folder / "vllm.env"
        keys.write_text(f"{API_KEY_ENV_NAME}={RIG_KEY}\n")
        accepted = folder / "vllm-api-keys.yaml"
        accepted.write_bytes(accepted_keys_config(sorted([RIG_KEY, NEXT_RIG_KEY])))
        [model] = rig.models
        document = yaml.safe_load(render_compose(model, with_api_key=True, host="0.0.0.0", accepted_keys=True))
        service = document["services"]["vllm"]
        assert "env_file" not in service and "--config" in service["command"], service
        assert service["secrets"][0]["target"] == ACCEPTED_KEYS_SECRET
        service["volumes"] = [{"type": "bind", "source": str(model_dir), "target": f"/models/{model.name}",
                               "read_only": True}]
        document.pop("volumes", None)
        net.compose("rigkit-scan-rig", document, RIG, env=compose_env(str(accepted)))
        base = f"http://{RIG}:{model.spec.port}"
        wait_for("the engine to answer /health", lambda: _status(f"{base}/health") == 200, 400, 2)
        openapi = httpx.get(f"{base}/openapi.json", timeout=30).json()
        pid = net.pid("rigkit-scan-rig")
        # sshd and the exporter in the rig's namespace.
        net.beside("rigkit-scan-rig", ["sh", "-c", "ssh-keygen -A >/dev/null && mkdir -p /run/sshd && "
                                       "exec /usr/sbin/sshd -D -e"])
        settings = json.loads(exporter_settings(rig))
        settings["key_file"] = str(keys)
        (folder / "exporter.json").write_text(json.dumps(settings))
        env = {**os.environ, "RIGKIT_LIB_DIR": str(REPO / "rigkit"), "PYTHONPATH": str(REPO / "tests" / "simrig")}
        exporter = subprocess.Popen(["nsenter", "-t", str(pid), "-n", sys.executable,
                                     str(REPO / "templates/monitoring/rigkit-exporter.py"), str(folder / "exporter.json")],
                                    env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        net.processes.append(exporter)
        port = settings["port"]
        wait_for("the exporter to listen", lambda: _status(f"http://{RIG}:{port}/metrics") == 401, 60, 0.5)
        # The gateway's rig: LiteLLM with rigkit's TLS, routing to the rig's model with its key.
        gw_file = folder / "gw.yml"
        gw_file.write_text((DATA / "rigs" / "engine.yml").read_text().replace("models: [engine-alpha]", "models: []"))
        master = folder / "master.key"
        master.write_text(MASTER_KEY + "\n")
        master.chmod(0o600)
        spec = GatewaySpec(port=GATEWAY_PORT, bind_address="0.0.0.0", master_key_file=str(master),
                           image=ensure_litellm_image(), health_check_interval_s=0)
        plan = gateway_plan([RigView("gw", load_rig(gw_file, DATA / "models"), GATEWAY, gateway=spec),
                             RigView("rig", rig, RIG)])
        tls = gateway_tls("rigkit", folder / "ca", wanted_names(GATEWAY, "0.0.0.0", ()))
        tls.save()
        secrets = folder / "gateway.env"
        secrets.write_bytes(env_file(MASTER_KEY))
        text = gateway_compose(plan, tls.cert_pem)
        document = json.loads(text[text.index("{"):])
        document["services"]["litellm"]["env_file"] = [{"path": str(secrets), "format": "raw"}]
        net.compose("rigkit-scan-gateway", document, GATEWAY, env={TLS_KEY_ENV: tls.key_pem.decode()})
        # What `rigkit-gateway up` hands the running proxy: the rig's key, sent by rigkit's callback.
        [proxy] = net.client.containers.list(filters={"label": "com.docker.compose.project=rigkit-scan-gateway"})
        sh("docker", "exec", "-i", proxy.id, "sh", "-c", f"cat > {BACKEND_KEYS_FILE}",
           input=backend_keys(plan, {env: RIG_KEY for _, env in plan.keyed_rigs}).decode())
        trust = tls_trust(folder)
        wait_for("the gateway to answer over TLS",
                 lambda: _status(f"https://{GATEWAY}:{GATEWAY_PORT}/health/liveliness", verify=trust) == 200, 180, 2)
        yield {"net": net, "rig": rig, "model": model, "routes": routes_of(openapi), "pid": pid, "exporter_port": port,
               "trust": trust, "folder": folder}


def tls_trust(folder: Path):
    import ssl

    return ssl.create_default_context(cafile=str(folder / "ca" / "ca.pem"))


def _status(url: str, **kwargs) -> int | None:
    try:
        return httpx.get(url, timeout=5, **kwargs).status_code
    except httpx.HTTPError:
        return None


def firewall(lan, serve_clients: list[str], gateway: tuple[str, ...]) -> str | None:
    """Load the product's ruleset for this topology into the rig's namespace; the deploy's warning, if any."""
    rig = load_rig(rig_file(lan["folder"], serve_clients), DATA / "models")
    plan = surface_plan("rig", rig, gateway)
    sh("nsenter", "-t", str(lan["pid"]), "-n", "nft", "-f", "-", input=ruleset(rig, plan))
    return open_paths_warning("rig", plan)


def through_gateway(lan) -> dict:
    """One completion through the gateway over TLS, verified by the fleet CA: the gateway's rig reaches the model."""
    answer = httpx.post(f"https://{GATEWAY}:{GATEWAY_PORT}/v1/completions", verify=lan["trust"], timeout=120,
                        headers={"Authorization": f"Bearer {MASTER_KEY}"},
                        json={"model": lan["model"].name, "prompt": "the of and", "max_tokens": 4})
    assert answer.status_code == 200, answer.text[:500]
    return answer.json()


def unexpected(lan, found: dict, wanted: set) -> dict:
    """{port: (its address and process in the rig's namespace, what the scan saw)} of each port found beyond
    `wanted`, for a failure's message."""
    listening = {}
    for line in sh("nsenter", "-t", str(lan["pid"]), "-n", "ss", "-ltnpH").splitlines():
        fields = line.split()
        listening[fields[3].rsplit(":", 1)[1]] = (fields[3], fields[-1] if len(fields) > 5 else "?")
    return {port: (listening.get(port), found[port].get("kind")) for port in sorted(set(found) - wanted)}


def test_behind_the_gateway_a_lan_host_finds_only_ssh_the_keyed_exporter_and_the_gateway_over_tls(lan):
    assert firewall(lan, [], (GATEWAY,)) is None
    through_gateway(lan)
    found = lan["net"].scan(OUTSIDER, {RIG: RIG_KEY, GATEWAY: MASTER_KEY}, lan["routes"])
    rig, gateway = found[RIG], found[GATEWAY]
    exporter = str(lan["exporter_port"])
    (lan["folder"] / "scan-behind-gateway.json").write_text(json.dumps(found, indent=1))
    assert set(rig) == {"22", exporter}, unexpected(lan, rig, {"22", exporter})  # the model's port refused
    assert rig["22"] == {"kind": "ssh"}
    # The exporter: every route refused without the key (401), its metrics with it.
    assert rig[exporter]["kind"] == "http" and set(rig[exporter]["without_key"].values()) <= {401, None}, rig
    assert rig[exporter]["with_key"]["GET /metrics"] == 200, rig
    # The gateway: HTTPS only, and without its key every route is refused (401) or not LiteLLM's (404).
    assert set(gateway) == {str(GATEWAY_PORT)} and gateway[str(GATEWAY_PORT)]["kind"] == "https", gateway
    refused = gateway[str(GATEWAY_PORT)]["without_key"]
    assert set(refused.values()) <= {401, 404}, refused
    print(f"scan from {OUTSIDER}: every TCP port of {RIG} and {GATEWAY}, then {len(lan['routes'])} vLLM routes "
          f"without and with a key on each open one: {RIG} {sorted(rig)} (ssh, the exporter), {GATEWAY} "
          f"{sorted(gateway)} (https; without the key: {sorted(set(refused.values()))})")
    through_gateway(lan)  # the engine served all along


def test_on_the_lan_without_a_gateway_only_serve_clients_reach_the_model_and_they_are_warned(lan):
    warning = firewall(lan, [CLIENT], ())
    assert warning and CLIENT in warning, warning
    outsider = lan["net"].scan(OUTSIDER, {RIG: RIG_KEY}, lan["routes"])[RIG]
    assert set(outsider) == {"22", str(lan["exporter_port"])}, outsider.keys()
    client = lan["net"].scan(CLIENT, {RIG: RIG_KEY}, lan["routes"])[RIG]
    port = str(lan["model"].spec.port)
    assert set(client) == {"22", str(lan["exporter_port"]), port}, client.keys()
    without_key = client[port]["without_key"]
    guarded = {f"{m} {p}" for m, p in lan["routes"] if p.startswith(GUARDED)}
    assert {without_key[r] for r in guarded} == {401}, without_key  # every /v1 route wants the key...
    # ...and no other route asks a serve_clients host for one: what the warning says.
    unguarded = {r: c for r, c in without_key.items() if r not in guarded}
    assert unguarded and not {401, 403} & set(unguarded.values()), unguarded
    print(f"serve_clients host {CLIENT}: the model's port {port} open; {len(guarded)} routes under /v1 want the key, "
          f"{len(unguarded)} others answer without it: {sorted(unguarded.items())}")


def test_during_a_key_rotation_the_real_engine_accepts_both_keys_and_no_other(lan):
    """vLLM itself, given rigkit's keys file through `--config` (the compose file holds neither key): asked
    from the rig's own namespace (loopback is always let in)."""
    url = f"http://127.0.0.1:{lan['model'].spec.port}/v1/models"
    ask = ("import sys, urllib.request, urllib.error\n"
           "request = urllib.request.Request(sys.argv[1], headers={'Authorization': 'Bearer ' + sys.stdin.read()})\n"
           "try:\n    print(urllib.request.urlopen(request, timeout=30).status)\n"
           "except urllib.error.HTTPError as exc:\n    print(exc.code)\n")
    codes = {key: sh("nsenter", "-t", str(lan["pid"]), "-n", sys.executable, "-c", ask, url, input=key).strip()
             for key in (RIG_KEY, NEXT_RIG_KEY, "sk-scan-not-a-key")}
    assert codes == {RIG_KEY: "200", NEXT_RIG_KEY: "200", "sk-scan-not-a-key": "401"}, codes
    inspected = json.dumps(lan["net"].client.containers.list(
        filters={"label": "com.docker.compose.project=rigkit-scan-rig"})[0].attrs)
    assert RIG_KEY not in inspected and NEXT_RIG_KEY not in inspected  # not in its command line or environment
