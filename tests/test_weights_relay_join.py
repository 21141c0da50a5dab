"""How the weights relay joins two rigs through OpenSSH (rigkit/weights/relay.py `join_rigs`), without
Docker and without rigs: each "ssh RIG" is `sh -c` here, which is what `ssh` does with its command on
the far side (hands it to the user's shell), so the copier's receive and send run as local processes on
two folders, their stdout and stdin joined by the relay's own pipe. What this simulates: the two SSH
hops (tested for real in test_weights_relay_rigs.py). What is real: the copier, the pipe, the relay's
waiting and its reading of who failed. Also: the `ssh` command rigkit builds from a host's inventory
data (rigkit/plumbing/ssh.py `openssh_command`), and where it declines to build one.
"""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from rigkit.config.inventory import ssh_target
from rigkit.config.schema import ModelConfig, ModelSpec
from rigkit.plumbing.ssh import gcm_first_transport, openssh_command
from rigkit.weights.relay import RelayError, join_rigs
from tests.simrig.rig import ssh_keypair
from tests.test_weights_relay import CHUNK, journaled_bytes, source_volume
from tests.test_weights_copier import COPIER

SHELL = ["sh", "-c"]  # `ssh RIG` stand-in: the command string to a shell, as sshd does on the rig
MODEL = ModelConfig("relay-b", ModelSpec.model_validate({
    "image": "rigkit-vllm-standin:sim", "gpus": [0], "port": 18999, "weights": {"source": {"rig": "rig-a"}}}),
                    Path("relay-b.yml"))


def commands(a: Path, b: Path) -> tuple[bytes, str, str]:
    """(the source's manifest line, the sender's command, the receiver's command), as relay() passes them."""
    manifest = subprocess.run([sys.executable, str(COPIER), "manifest", str(a)], capture_output=True, timeout=60)
    line = json.dumps({"files": json.loads(manifest.stdout)["files"]}).encode() + b"\n"
    send = shlex.join([sys.executable, str(COPIER), "send", str(a)])
    receive = shlex.join([sys.executable, str(COPIER), "receive", str(b), str(CHUNK)])
    return line, send, receive


def test_the_pipe_carries_every_byte_and_both_reports_come_back(tmp_path):
    a, files = source_volume(tmp_path)
    line, send, receive = commands(a, tmp_path / "b")
    report, sent = join_rigs((SHELL, SHELL), MODEL, "rig-a", line, send, receive)
    total = sum(len(data) for data in files.values())
    assert report["status"] == "copied" and report["received_bytes"] == total, report
    assert sent["read_bytes"] == total and sent["volume_path"] == str(a), sent
    assert {name: (tmp_path / "b" / name).read_bytes() for name in files} == files
    assert (tmp_path / "b" / ".rigkit" / "complete").exists()


def test_a_killed_receiver_is_named_as_the_cause_not_the_sender_whose_pipe_it_broke(tmp_path):
    a, files = source_volume(tmp_path)
    b = tmp_path / "b"
    line, send, receive = commands(a, b)
    # The receiver slowed to a 64 KiB chunk per 100 ms (a throttled stdin: ~2 s for the whole volume) so
    # the kill lands mid-copy, then killed once it has journaled 2 chunks, as a crash or an OOM kill would.
    throttled = f"{shlex.quote(sys.executable)} -c {shlex.quote(THROTTLE)} | {receive}"

    def kill_when_journaled():
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if sum(1 for _ in (b / ".rigkit" / "chunks.jsonl").open()) >= 2:
                    break
            except FileNotFoundError:
                pass
            time.sleep(0.01)
        subprocess.run(["pkill", "-KILL", "-f", f"receive {b} "], check=False)

    killer = threading.Thread(target=kill_when_journaled)
    killer.start()
    with pytest.raises(RelayError) as failed:
        join_rigs((SHELL, SHELL), MODEL, "rig-a", line, send, throttled)
    killer.join()
    assert str(failed.value).startswith("relay-b: the target rig's receiver failed: "), failed.value
    assert "resumes at its last chunk" in str(failed.value)
    assert not (b / ".rigkit" / "complete").exists()
    sizes = {name: len(data) for name, data in files.items()}
    assert sum(journaled_bytes(b / ".rigkit", sizes).values()) < sum(sizes.values())


# Copies stdin to stdout a 64 KiB block per 100 ms (the receiver's side of a slow link).
THROTTLE = ("import os, sys, time\n"
            "while (block := os.read(0, 65536)):\n"
            "    os.write(1, block); time.sleep(0.1)\n")


def test_a_sender_that_fails_is_named_with_its_own_reason(tmp_path):
    a, _ = source_volume(tmp_path)
    line, send, receive = commands(a, tmp_path / "b")
    with (a / "model-1.safetensors").open("ab") as shard:
        shard.write(b"\0")  # rig A's volume changed after its manifest: the sender refuses the file
    with pytest.raises(RelayError) as failed:
        join_rigs((SHELL, SHELL), MODEL, "rig-a", line, send, receive)
    assert str(failed.value).startswith("relay-b: the sender on rig rig-a failed: model-1.safetensors has "), failed.value
    assert not (tmp_path / "b" / ".rigkit" / "complete").exists()


def test_a_receiver_that_cannot_start_is_named_with_what_it_said(tmp_path):
    a, _ = source_volume(tmp_path)
    line, send, _ = commands(a, tmp_path / "b")
    with pytest.raises(RelayError) as failed:
        join_rigs((SHELL, SHELL), MODEL, "rig-a", line, send, "echo 'ssh: connect to host rig-b port 22: "
                      "Connection refused' >&2; exit 255")
    assert str(failed.value) == ("relay-b: the target rig's receiver failed: ssh: connect to host rig-b port 22: "
                                 "Connection refused. Nothing was marked complete; deploy again and the copy resumes "
                                 "at its last chunk")


KEY = {"ssh_user": "root", "ssh_key": str(ssh_keypair()), "ssh_port": 2222, "ssh_known_hosts_file": "/dev/null",
       "ssh_strict_host_key_checking": "off"}


def command(name: str, data: dict) -> list[str] | None:
    """openssh_command for a host of the inventory: its name and data, read as deploys read them."""
    return openssh_command(ssh_target(SimpleNamespace(name=name, data=data)))


def test_the_ssh_command_says_what_the_inventory_says_and_never_prompts():
    argv = command("rig-a", {**KEY, "ssh_hostname": "-oProxyCommand=x",
                             "ssh_paramiko_connect_kwargs": {"transport_factory": gcm_first_transport}})
    assert argv[:2] == ["ssh", "-T"]
    options = {argv[i + 1] for i, arg in enumerate(argv) if arg == "-o"}
    # "off": an unknown key is accepted, a changed one refused (paramiko's rule; OpenSSH's "no" would not)
    assert {"BatchMode=yes", "StrictHostKeyChecking=accept-new", 'UserKnownHostsFile="/dev/null"',
            f'IdentityFile="{ssh_keypair()}"', "IdentitiesOnly=yes", "ControlPath=none"} <= options
    assert argv[argv.index("-p") + 1] == "2222" and argv[argv.index("-l") + 1] == "root"
    assert argv[-2:] == ["--", "-oProxyCommand=x"]  # a hostname is never read as an option
    assert command("rig-a", {})[-2:] == ["--", "rig-a"] and "-p" not in command("rig-a", {})  # the SSH config's Port
    assert "StrictHostKeyChecking=yes" in command("rig-a", {})  # as `rigkit tune` reaches a rig
    odd = command("rig-a", {"ssh_known_hosts_file": "/tmp/my hosts %h"})
    assert 'UserKnownHostsFile="/tmp/my hosts %%h"' in odd  # one value, no %-token expanded


@pytest.mark.parametrize("data", [
    {"ssh_password": "s3cret"},  # OpenSSH would prompt for it
    {"ssh_key_password": "s3cret"},
    {"ssh_paramiko_connect_kwargs": {"banner_timeout": 60}},  # paramiko's own arguments
    {"ssh_strict_host_key_checking": "ask"},  # a prompt
])
def test_no_ssh_command_where_openssh_cannot_connect_as_pyinfra_does(data):
    assert command("rig-a", {**KEY, **data}) is None


def test_a_sender_that_never_writes_is_given_up_when_the_receiver_is_and_then_killed(tmp_path, monkeypatch):
    """A source rig whose engine hangs before the copier starts: the receiver's stall rule (300 s, 2 s
    here through RIGKIT_RELAY_STALL_S) ends the copy, and the sender, silent, is killed after
    SENDER_GRACE_S (1 s here), so the relay ends."""
    import rigkit.weights.relay as relay_module

    monkeypatch.setattr(relay_module, "SENDER_GRACE_S", 1)
    a, _ = source_volume(tmp_path)
    line, _, receive = commands(a, tmp_path / "b")
    started = time.monotonic()
    with pytest.raises(RelayError) as failed:
        join_rigs((SHELL, SHELL), MODEL, "rig-a", line, "exec sleep 120", f"RIGKIT_RELAY_STALL_S=2 {receive}")
    assert time.monotonic() - started < 60
    assert str(failed.value).startswith("relay-b: the sender on rig rig-a failed: "), failed.value
    assert not (tmp_path / "b" / ".rigkit" / "complete").exists()


@pytest.mark.parametrize("answer, said", [
    # Another copy holds the volume: the receiver's first line is its error, not a plan.
    ('{"status": "error", "error": "another copy into this volume was still running after 60 s; deploy again once '
     'it has ended"}', "another copy into this volume was still running after 60 s"),
    # No space: an empty plan and the report in one write, as the copier prints them.
    ('{"files": []}\n{"status": "error", "error": "no space", "needed_bytes": 5000000000, "free_bytes": 1000000000}',
     "volume rigkit-weights-relay-b is out of space: the copy needs 5.00 GB more (free: 1.00 GB)"),
])
def test_a_receiver_that_refuses_is_named_with_its_reason_and_no_sender_starts(tmp_path, answer, said):
    a, _ = source_volume(tmp_path)
    line, _, _ = commands(a, tmp_path / "b")
    started = tmp_path / "sender-started"
    # It reads the manifest, then stops reading (closes its stdin, as a receiver that has ended) and answers.
    receive = f"head -1 >/dev/null; exec 0<&-; printf '%s\\n' {shlex.quote(answer)}; exit 2"
    with pytest.raises(RelayError) as failed:
        join_rigs((SHELL, SHELL), MODEL, "rig-a", line, f"touch {shlex.quote(str(started))}", receive)
    assert str(failed.value).startswith(f"relay-b: the target rig's receiver failed: {said}"), failed.value
    assert not started.exists()
