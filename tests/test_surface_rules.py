"""The rig's firewall (rigkit/surface) in a real kernel: the ruleset rigkit renders, loaded by the real `nft`
into the network namespace of a "rig" this test makes, joined by a veth pair to a second namespace, the
"network" (`ip netns`: never the host's own namespace), and real TCP connections to listeners on 0.0.0.0
in the rig: from the rig itself (127.0.0.1, 127.0.1.1 as Debian names the host, its own LAN address) and,
across the veth, from its gateway's rig (10.199.0.5), a serve_clients host (10.199.0.6) and any other host
(10.199.0.9). Simulated: those hosts, as addresses of the one network namespace. Also the plan's rules:
who is let in, and the refusal of a rig that serves on the network for no one in particular.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from rigkit.config.loader import load_rig
from rigkit.surface.plan import SurfaceError, open_paths_warning, surface_plan
from rigkit.surface.rules import ruleset
from tests.conftest import REPO

MODEL = "image: rigkit-vllm-standin:sim\nweights: {source: /srv/m}\ngpus: [GPU]\nport: PORT\n"
SSH_PORT = 2222  # a port that is not a model's: the firewall leaves it alone
RIG_ADDRESS, GATEWAY, CLIENT, OTHER = "10.199.0.1", "10.199.0.5", "10.199.0.6", "10.199.0.9"

# Listens on 0.0.0.0 on every port given, says "ready", serves until killed.
LISTEN = r"""
import socket, sys, threading, time
for port in map(int, sys.argv[1].split(",")):
    server = socket.socket()
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    server.bind(("0.0.0.0", port))
    server.listen(16)
    threading.Thread(target=lambda s=server: [s.accept()[0].close() for _ in range(256)], daemon=True).start()
print("ready", flush=True)
time.sleep(300)
"""

# One connection per (source, port) to the rig's address; prints {"source port": "open" | "refused" | "silent"}.
CONNECT = r"""
import json, socket, sys
target, ports, sources = sys.argv[1], [int(p) for p in sys.argv[2].split(",")], sys.argv[3].split(",")
found = {}
for source in sources:
    for port in ports:
        client = socket.socket()
        client.bind((source, 0))
        client.settimeout(5)
        try:
            client.connect((target, port))
            found[f"{source} {port}"] = "open"
        except ConnectionRefusedError:
            found[f"{source} {port}"] = "refused"
        except socket.timeout:
            found[f"{source} {port}"] = "silent"
        finally:
            client.close()
print(json.dumps(found))
"""


class Network:
    """Two network namespaces of this test's own, "rig" and "net", joined by a veth pair; removed at the end."""

    def __init__(self, tmp_path: Path):
        tag = f"{os.getpid() % 100000}"
        self.rig, self.net = f"rkrig{tag}", f"rknet{tag}"
        self.tmp_path = tmp_path

    def sh(self, *command: str) -> None:
        done = subprocess.run(command, capture_output=True, text=True, timeout=30)
        assert done.returncode == 0, (command, done.stderr)

    def __enter__(self):
        for name in (self.rig, self.net):
            subprocess.run(["ip", "netns", "del", name], capture_output=True)  # a killed run's leftover
            self.sh("ip", "netns", "add", name)
        self.sh("ip", "link", "add", "rkv0", "netns", self.rig, "type", "veth", "peer", "name", "rkv1", "netns", self.net)
        self.sh("ip", "-n", self.rig, "addr", "add", f"{RIG_ADDRESS}/24", "dev", "rkv0")
        self.sh("ip", "-n", self.rig, "addr", "add", "127.0.1.1/8", "dev", "lo")
        for address in (GATEWAY, CLIENT, OTHER):
            self.sh("ip", "-n", self.net, "addr", "add", f"{address}/24", "dev", "rkv1")
        for name, link in ((self.rig, "rkv0"), (self.net, "rkv1")):
            self.sh("ip", "-n", name, "link", "set", "lo", "up")
            self.sh("ip", "-n", name, "link", "set", link, "up")
        return self

    def __exit__(self, *exc):
        for name in (self.rig, self.net):
            subprocess.run(["ip", "netns", "del", name], capture_output=True)

    def load(self, rules: str) -> str:
        path = self.tmp_path / "surface.nft"
        path.write_text(rules)
        for _ in range(2):  # a deploy re-applies it: one table, not two
            self.sh("ip", "netns", "exec", self.rig, "nft", "-f", str(path))
        return subprocess.run(["ip", "netns", "exec", self.rig, "nft", "list", "ruleset"], capture_output=True,
                              text=True, check=True).stdout

    def connections(self, ports: list[int], from_rig: list[str], from_net: list[str]) -> dict:
        server = subprocess.Popen(["ip", "netns", "exec", self.rig, sys.executable, "-c", LISTEN,
                                   ",".join(map(str, ports))], stdout=subprocess.PIPE, text=True)
        try:
            assert server.stdout.readline().strip() == "ready"
            found = {}
            for namespace, sources in ((self.rig, from_rig), (self.net, from_net)):
                if not sources:
                    continue
                done = subprocess.run(["ip", "netns", "exec", namespace, sys.executable, "-c", CONNECT, RIG_ADDRESS,
                                       ",".join(map(str, ports)), ",".join(sources)],
                                      capture_output=True, text=True, timeout=120)
                assert done.returncode == 0, done.stderr
                found.update(json.loads(done.stdout))
            return found
        finally:
            server.kill()
            server.wait()


def rig_with(folder: Path, extra: str, ports=(18401, 18402)):
    """A rig serving on every interface (with a key) from a catalog of its own in `folder`."""
    catalog = folder / "models"
    catalog.mkdir(parents=True, exist_ok=True)
    for n, port in enumerate(ports):
        (catalog / f"m{n}.yml").write_text(MODEL.replace("PORT", str(port)).replace("GPU", str(n)))
    key = folder / "key"
    key.write_text("sk-test-key\n")
    key.chmod(0o600)
    rig = folder / "rig.yml"
    base = (REPO / "tests" / "data" / "rigs" / "serving.yml").read_text()
    rig.write_text(base.replace("models: [test-alpha, test-beta]", f"models: [{', '.join(f'm{n}' for n in range(len(ports)))}]")
                   + f"serve_address: 0.0.0.0\napi_key_file: {key}\n" + extra)
    return load_rig(rig, catalog)


def test_only_the_rig_its_gateway_and_its_clients_reach_the_models_ports(tmp_path):
    rig = rig_with(tmp_path, f"serve_clients: [{CLIENT}]\n")
    plan = surface_plan("rig-b", rig, (GATEWAY,))
    with Network(tmp_path) as network:
        listing = network.load(ruleset(rig, plan))
        found = network.connections([18401, 18402, SSH_PORT], ["127.0.0.1", "127.0.1.1", RIG_ADDRESS],
                                    [GATEWAY, CLIENT, OTHER])
    for port in (18401, 18402):
        assert {s: found[f"{s} {port}"] for s in ("127.0.0.1", "127.0.1.1", RIG_ADDRESS, GATEWAY, CLIENT, OTHER)} == {
            "127.0.0.1": "open", "127.0.1.1": "open", RIG_ADDRESS: "open", GATEWAY: "open", CLIENT: "open",
            OTHER: "refused"}, found  # refused at once (a reset), as a closed port: not left to time out
    assert {found[f"{s} {SSH_PORT}"] for s in (RIG_ADDRESS, OTHER)} == {"open"}, found  # not a model's port
    assert listing.count("table inet rigkit_surface") == 1, listing  # applied twice, one table


def test_a_changed_plan_replaces_the_table_whole(tmp_path):
    """A deploy that drops a client and a model's port: the old rules are gone, not left beside the new."""
    old = rig_with(tmp_path, f"serve_clients: [{CLIENT}]\n")
    new = rig_with(tmp_path / "new", "", ports=(18401,))
    with Network(tmp_path) as network:
        network.load(ruleset(old, surface_plan("rig-b", old, ())))
        listing = network.load(ruleset(new, surface_plan("rig-b", new, (GATEWAY,))))
        found = network.connections([18401, 18402], [], [GATEWAY, CLIENT])
    assert found == {f"{GATEWAY} 18401": "open", f"{GATEWAY} 18402": "open",  # 18402 is no longer a model's port
                     f"{CLIENT} 18401": "refused", f"{CLIENT} 18402": "open"}, found
    assert CLIENT not in listing and listing.count("table inet rigkit_surface") == 1, listing


def test_a_rig_serving_on_the_network_for_no_one_in_particular_is_refused(tmp_path):
    rig = rig_with(tmp_path, "")
    with pytest.raises(SurfaceError) as refused:
        surface_plan("rig-b", rig, ())
    assert "serve_address: '0.0.0.0': with no gateway in front and no serve_clients" in str(refused.value)
    assert "vLLM asks for the API key only under /v1" in str(refused.value)
    assert surface_plan("rig-b", rig, ("10.0.0.4",)).allowed == ("10.0.0.4/32",)  # a gateway in front


def test_clients_are_warned_about_every_deploy_and_a_loopback_rig_has_no_plan(tmp_path):
    rig = rig_with(tmp_path, "serve_clients: [10.0.0.0/24, 10.0.0.7]\n")
    plan = surface_plan("rig-b", rig, ("10.0.0.4",))
    assert plan.allowed == ("10.0.0.0/24",)  # the gateway and 10.0.0.7 lie in it: one interval, as nft wants
    assert open_paths_warning("rig-b", plan).startswith("rig rig-b: serve_clients 10.0.0.0/24, 10.0.0.7/32 reach")
    assert open_paths_warning("rig-b", surface_plan("rig-b", rig_with(tmp_path / "gw", ""), ("10.0.0.4",))) is None
    loopback = load_rig(Path(REPO / "tests" / "data" / "rigs" / "serving.yml"), REPO / "tests" / "data" / "models")
    assert surface_plan("rig-a", loopback, ()) is None


@pytest.mark.parametrize("value", ["10.0.0.300", "any", "::1", "10.0.0.0/33", "10.0.0.1; drop"])
def test_serve_clients_takes_ipv4_addresses_and_networks_only(tmp_path, value):
    from rigkit.config.errors import ConfigError

    with pytest.raises(ConfigError) as refused:
        rig_with(tmp_path, f"serve_clients: [{json.dumps(value)}]\n")
    assert "serve_clients" in refused.value.render() and "is not an IPv4 address or network" in refused.value.render()
