"""The rig's firewall (rigkit/surface) in a real kernel: the ruleset rigkit renders, loaded by the real `nft`
into a network namespace this test makes (`unshare --net`: never the host's own), and real TCP connections
to listeners on 0.0.0.0 there. Simulated: the other hosts, as loopback addresses of that namespace bound as
the connection's source (the rig itself is 127.0.0.1; its gateway's rig 127.0.0.5; a serve_clients host
127.0.0.6; any other host 127.0.0.9). Also the plan's rules: who is let in, and the refusal of a rig that
serves on the network for no one in particular.
"""

from __future__ import annotations

import json
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

# Runs inside the namespace: loopback up, the ruleset loaded (twice: a deploy re-applies it), listeners on
# every port, then one connection per (source, port); prints {"source port": "open" | "refused"}.
PROBE = r"""
import json, socket, subprocess, sys, threading
rules, ports, sources = sys.argv[1], [int(p) for p in sys.argv[2].split(",")], sys.argv[3].split(",")
subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
for _ in range(2):
    subprocess.run(["nft", "-f", rules], check=True)
for port in ports:
    server = socket.socket()
    server.bind(("0.0.0.0", port))
    server.listen(16)
    threading.Thread(target=lambda s=server: [s.accept()[0].close() for _ in range(64)], daemon=True).start()
found = {}
for source in sources:
    for port in ports:
        client = socket.socket()
        client.bind((source, 0))
        client.settimeout(5)
        try:
            client.connect(("127.0.0.1", port))
            found[f"{source} {port}"] = "open"
        except ConnectionRefusedError:
            found[f"{source} {port}"] = "refused"
        finally:
            client.close()
print(json.dumps(found))
print(subprocess.run(["nft", "list", "ruleset"], capture_output=True, text=True, check=True).stdout)
"""


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


def in_namespace(tmp_path: Path, rules: str, ports: list[int], sources: list[str]) -> tuple[dict, str]:
    path = tmp_path / "surface.nft"
    path.write_text(rules)
    proc = subprocess.run(["unshare", "--net", sys.executable, "-c", PROBE, str(path), ",".join(map(str, ports)),
                           ",".join(sources)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    first, _, listing = proc.stdout.partition("\n")
    return json.loads(first), listing


def test_only_the_rig_its_gateway_and_its_clients_reach_the_models_ports(tmp_path):
    rig = rig_with(tmp_path, "serve_clients: [127.0.0.6]\n")
    plan = surface_plan("rig-b", rig, ("127.0.0.5",))
    found, listing = in_namespace(tmp_path, ruleset(rig, plan), [18401, 18402, SSH_PORT],
                                  ["127.0.0.1", "127.0.0.5", "127.0.0.6", "127.0.0.9"])
    for port in (18401, 18402):
        assert [found[f"{s} {port}"] for s in ("127.0.0.1", "127.0.0.5", "127.0.0.6", "127.0.0.9")] == \
               ["open", "open", "open", "refused"], found
    assert {found[f"{s} {SSH_PORT}"] for s in ("127.0.0.1", "127.0.0.9")} == {"open"}, found  # not a model's port
    assert listing.count("table inet rigkit_surface") == 1, listing  # applied twice, one table


def test_a_changed_plan_replaces_the_table_whole(tmp_path):
    """A deploy that drops a client and a model's port: the old rules are gone, not left beside the new."""
    old = rig_with(tmp_path, "serve_clients: [127.0.0.6]\n")
    new = rig_with(tmp_path / "new", "", ports=(18401,))
    rules = ruleset(old, surface_plan("rig-b", old, ())) + "\n" + ruleset(new, surface_plan("rig-b", new, ("127.0.0.5",)))
    found, listing = in_namespace(tmp_path, rules, [18401, 18402], ["127.0.0.5", "127.0.0.6"])
    assert found == {"127.0.0.5 18401": "open", "127.0.0.5 18402": "open",  # 18402 is no longer a model's port
                     "127.0.0.6 18401": "refused", "127.0.0.6 18402": "open"}, found
    assert "127.0.0.6" not in listing and listing.count("table inet rigkit_surface") == 1, listing


def test_a_rig_serving_on_the_network_for_no_one_in_particular_is_refused(tmp_path):
    rig = rig_with(tmp_path, "")
    with pytest.raises(SurfaceError) as refused:
        surface_plan("rig-b", rig, ())
    assert "serve_address: '0.0.0.0' with no gateway in front and no serve_clients" in str(refused.value)
    assert "vLLM asks for the API key only under /v1" in str(refused.value)
    assert surface_plan("rig-b", rig, ("10.0.0.4",)).allowed == ("10.0.0.4/32",)  # a gateway in front


def test_clients_are_warned_about_every_deploy_and_a_loopback_rig_has_no_plan(tmp_path):
    rig = rig_with(tmp_path, "serve_clients: [10.0.0.0/24, 10.0.0.7]\n")
    plan = surface_plan("rig-b", rig, ("10.0.0.4",))
    assert plan.allowed == ("10.0.0.4/32", "10.0.0.0/24", "10.0.0.7/32")
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
