"""rigkit.status.surface: the probe's listening sockets and firewall set against what rigkit opened. Pure;
the probe's answer is written here as tests/test_status.py's rig gives it. Simulates nothing else."""

from __future__ import annotations

import dataclasses

from rigkit.config.loader import load_rig
from rigkit.status.report import Commands
from rigkit.status.surface import judge_surface, known_ports
from tests.conftest import SERVING_RIG, TEST_CATALOG

RIG = load_rig(SERVING_RIG, TEST_CATALOG)  # test-alpha 18101, test-beta 18102, on 127.0.0.1
COMMANDS = Commands("inv.py", "rig1")


def on_lan(rig=RIG):
    return dataclasses.replace(rig, spec=rig.spec.model_copy(update={"serve_address": "0.0.0.0"}))


def judged(rig, listening, firewall=None, known=None) -> dict:
    doc = {"drift": [], "failures": [], "notes": []}
    judge_surface(doc, rig, {"listening": listening, "firewall": firewall or {"loaded": False, "closed_ports": []}},
                  known_ports(rig, None) if known is None else known, COMMANDS,
                  lambda what, found, wanted, repair: doc["drift"].append((what, found, wanted, repair)),
                  lambda what, detail, repair=None: doc["failures"].append((what, detail, repair)))
    return doc


def listener(port, process, http_status=None, addresses=("0.0.0.0",)):
    return {"port": port, "addresses": list(addresses), "process": process, "http_status": http_status}


def test_a_planted_port_is_a_finding_with_what_it_answers_and_its_repair():
    doc = judged(RIG, [listener(18777, "python3", 200), listener(6379, "redis-server"),
                       listener(8888, "jupyter", 401)])
    assert [f[1] for f in doc["failures"]] == [
        "port 18777 (python3) answers beyond loopback (0.0.0.0); it answers HTTP without a key (200); rigkit did "
        "not open it",
        "port 6379 (redis-server) answers beyond loopback (0.0.0.0); it does not answer HTTP; rigkit did not open it",
        "port 8888 (jupyter) answers beyond loopback (0.0.0.0); it wants a key (HTTP 401); rigkit did not open it"]
    assert doc["failures"][0][2] == ("on rig1 as root: stop it, bind it to 127.0.0.1, or close port 18777 in the "
                                     "rig's firewall")


def test_ssh_and_what_rigkit_opened_are_not_findings_and_a_socket_no_process_holds_is_a_note():
    doc = judged(on_lan(), [listener(22, "sshd", addresses=("0.0.0.0", "::")), listener(9835, "python3"),
                            listener(2049, None)], {"loaded": True, "closed_ports": []}, known={9835: "exporter"})
    assert doc["failures"] == [] and doc["drift"] == []
    assert doc["notes"] == ["surface: port 2049 listens beyond loopback (0.0.0.0); no process of this rig holds it "
                            "(a kernel service, or another namespace's)"]


def test_a_model_beyond_loopback_must_be_where_the_rig_file_says_and_behind_rigkits_firewall():
    # On a loopback rig: drift back to 127.0.0.1.
    doc = judged(RIG, [listener(18101, "vllm")])
    assert doc["drift"] == [("model test-alpha: listening", "beyond loopback (0.0.0.0)", "127.0.0.1 only",
                             "rigkit deploy inv.py --limit rig1")]
    # On 0.0.0.0: its port must be one the loaded table closes.
    open_port = judged(on_lan(), [listener(18101, "vllm"), listener(18102, "vllm")],
                       {"loaded": True, "closed_ports": [18102]})
    assert [d[0] for d in open_port["drift"]] == ["model test-alpha: firewall"]
    unloaded = judged(on_lan(), [listener(18101, "vllm")], {"loaded": False, "closed_ports": []})
    assert unloaded["drift"][0][1] == "its port open to every host"
    closed = judged(on_lan(), [listener(18101, "vllm"), listener(18102, "vllm")],
                    {"loaded": True, "closed_ports": [18101, 18102]})
    assert closed["drift"] == [] and closed["failures"] == []


def test_known_ports_are_what_the_rig_file_and_inventory_open_beyond_loopback():
    monitored = RIG.spec.model_copy(update={"monitoring": RIG.spec.monitoring.model_copy(update={"enabled": True})})
    loopback = dataclasses.replace(RIG, spec=monitored)
    assert known_ports(loopback, ("127.0.0.1", 4000)) == {18101: "model test-alpha", 18102: "model test-beta"}
    lan = on_lan(loopback)
    assert known_ports(lan, ("0.0.0.0", 4000)) == {18101: "model test-alpha", 18102: "model test-beta",
                                                   9835: "the monitoring exporter", 4000: "the gateway"}


def test_the_probe_reads_proc_net_tcp_addresses_and_tells_loopback():
    """The status probe's parser of /proc/net/tcp{,6} local addresses (32-bit words, little-endian), run as the
    probe runs (in a process of its own, the runtime from this checkout)."""
    import json
    import os
    import subprocess
    import sys

    from tests.conftest import REPO

    samples = ["0100007F", "00000000", "0101A8C0", "00000000000000000000000001000000",
               "0000000000000000FFFF00000100007F", "0000000000000000FFFF00000101A8C0",
               "00000000000000000000000000000000", "000080FE00000000FF1E5402FEA8A3F4"]
    code = ("import json, runpy, sys\n"
            f"probe = runpy.run_path({str(REPO / 'templates/status/rigkit-status-probe.py')!r}, run_name='probe')\n"
            "print(json.dumps([probe['_address'](h) for h in sys.argv[1:]]))")
    done = subprocess.run([sys.executable, "-c", code, *samples], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "RIGKIT_LIB_DIR": str(REPO / "rigkit")})
    assert done.returncode == 0, done.stderr
    assert [tuple(a) for a in json.loads(done.stdout)] == [
        ("127.0.0.1", True), ("0.0.0.0", False), ("192.168.1.1", False), ("::1", True), ("::ffff:127.0.0.1", True),
        ("::ffff:192.168.1.1", False), ("::", False), ("fe80::254:1eff:f4a3:a8fe", False)]
