"""Weights from another rig (one download per fleet) through the real parts: two simulated rigs (two
SSH ports), the real pyinfra CLI deploying both, rig A copying its folder onto its volume, rig B taking
that volume through the controller's relay (two SSH channels, `docker run -i` with the copier on each
rig), the receiver killed mid-copy, the next deploy resuming at its last journaled chunk.

The controller joins the rigs with two OpenSSH `ssh` sharing a pipe (the relay's one transport);
an inventory that gives rig B paramiko's own arguments is refused before either rig is reached.
Both ways a rig runs the copier: rig A's shell reaches its engine's volumes folder (root on a rig
whose engine is local), so its sender runs there; rig B first boots without that folder (as an engine
in a VM, or a user the folder refuses), so its receiver runs in a helper container, which the test
kills; rig B then reboots with the folder and the resumed copy is received on its shell.

Simulated: the GPUs (tests/simrig) and vLLM (tests/vllm_standin). Both rigs share the host's Docker
engine, so rig B's model has another name than rig A's (each its own volume) and names rig A's
volume in its source. Chunks are 64 KiB here (`rigkit_weights_chunk_bytes`) so a 48 MiB checkpoint
has hundreds of them and the kill lands mid-copy.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import docker
import pytest

from tests.conftest import DATA, REPO, STATE_ROOT, DeployRun, _changed, wait_for
from tests.simrig.rig import SimRig, ssh_keypair
from tests.simrig.weights import SIM_MODELS
from tests.test_weights import make_checkpoint, sha256s
from tests.test_weights_relay import journaled_bytes

pytestmark = pytest.mark.simrig

RIG_B = ("rigkit-relay-b", 2232)
CHUNK_BYTES = 64 * 1024
PORTS = {"relay-a": 18211, "relay-b": 18212}
SOURCE = SIM_MODELS / "relay-a"


def model_text(name: str) -> str:
    source = str(SOURCE) if name == "relay-a" else "{rig: rig-a, volume: rigkit-weights-relay-a}"
    # The stand-in compiles its graphs (1 s), keyed as vLLM keys them, under the model's cache volume.
    return (f"image: rigkit-vllm-standin:sim\nweights: {{source: {source}}}\ngpus: [0]\nport: {PORTS[name]}\n"
            "vllm: {dtype: bfloat16}\nready_timeout_s: 30\nenv: {STANDIN_COMPILE_S: '1'}\n")


def remove_leftovers(client, names=PORTS) -> None:
    """What an earlier run of a module using these models left: their stacks, weights helpers and volumes."""
    for name in names:
        for container in client.containers.list(all=True, filters={"label": f"com.docker.compose.project=rigkit-{name}"}):
            container.remove(force=True)
        for container in client.containers.list(all=True, filters={"label": f"rigkit.weights-helper={name}"}):
            container.remove(force=True)
        for volume in [*client.volumes.list(filters={"name": f"rigkit-weights-{name}"}),
                       *client.volumes.list(filters={"name": f"rigkit-compile-cache-{name}"})]:
            volume.remove(force=True)


@pytest.fixture(scope="module")
def fleet(fresh_rig, tmp_path_factory):
    from tests.vllm_standin.image import ensure_standin_image

    ensure_standin_image()
    client = docker.from_env()
    remove_leftovers(client)
    if not (SOURCE / "config.json").exists():
        make_checkpoint(SOURCE, shards=1, shard_bytes=48 * 1024 * 1024, seed=33)
    rig_b = SimRig(name=RIG_B[0], ssh_port=RIG_B[1], engine_volumes=False).start(
        log=lambda m: print(m, file=sys.stderr))
    folder = tmp_path_factory.mktemp("relay")
    (folder / "models").mkdir()
    for name in PORTS:
        (folder / "models" / f"{name}.yml").write_text(model_text(name))
    base = (DATA / "rigs" / "serving.yml").read_text().replace("models: [test-alpha, test-beta]", "models: [MODEL]")
    for rig, name in (("rig-a", "relay-a"), ("rig-b", "relay-b")):
        (folder / f"{rig}.yml").write_text(base.replace("MODEL", name))
    ssh = {"ssh_hostname": "127.0.0.1", "ssh_user": "root", "ssh_key": str(ssh_keypair()),
           "ssh_known_hosts_file": "/dev/null", "ssh_strict_host_key_checking": "off",
           "catalog_dir": str(folder / "models"), "rigkit_verify": "never", "rigkit_weights_chunk_bytes": CHUNK_BYTES}
    hosts = [("rig-a", {**ssh, "ssh_port": fresh_rig.ssh_port, "rig_file": str(folder / "rig-a.yml")}),
             ("rig-b", {**ssh, "ssh_port": RIG_B[1], "rig_file": str(folder / "rig-b.yml")})]
    inventory = folder / "inventory.py"
    inventory.write_text(f"rigs = {hosts!r}\n")
    # The same rigs, rig B's connection with a paramiko argument of its own, which OpenSSH cannot be told.
    hosts[1][1]["ssh_paramiko_connect_kwargs"] = {"banner_timeout": 60}
    (folder / "inventory-paramiko.py").write_text(f"rigs = {hosts!r}\n")
    yield client, inventory, folder, rig_b
    remove_leftovers(client)
    rig_b.remove()


def start_deploy(inventory: Path, log: Path) -> subprocess.Popen:
    env = dict(os.environ, RIGKIT_STATE=str(STATE_ROOT))
    return subprocess.Popen([sys.executable, "-m", "rigkit.plumbing.pyinfra_start", "-y", str(inventory), "deploy.py"],
                            cwd=REPO, env=env, stdout=log.open("w"), stderr=subprocess.STDOUT)


def finish(proc: subprocess.Popen, log: Path) -> DeployRun:
    proc.wait(timeout=600)
    return DeployRun(proc.returncode, log.read_text())


def rigkit_dir(client, volume: str) -> Path:
    return Path(client.volumes.get(volume).attrs["Mountpoint"]) / ".rigkit"


def last_start(rig: SimRig, model: str) -> dict:
    """The startup table rigkit-stack kept of the model's last proven start on `rig` (an independent read)."""
    code, out = rig.exec(f"cat /etc/rigkit/stacks/{model}/startup.json")
    assert code == 0, out
    return json.loads(out)


def journaled(state: Path) -> int:
    try:
        return sum(1 for line in (state / "chunks.jsonl").read_text().splitlines() if line.endswith("}"))
    except FileNotFoundError:
        return 0


def test_rig_b_copies_rig_a_volume_resumes_a_killed_copy_at_its_last_chunk_and_a_second_deploy_changes_nothing(fleet, fresh_rig):
    client, inventory, folder, rig_b = fleet
    total = sum(p.stat().st_size for p in SOURCE.rglob("*") if p.is_file())
    refused = finish(start_deploy(folder / "inventory-paramiko.py", folder / "refused.log"), folder / "refused.log")
    assert refused.returncode != 0 and "Traceback" not in refused.output, refused.output[-4000:]
    assert ("weights.source rig rig-a volume rigkit-weights-relay-a: the copy between rigs runs over OpenSSH's `ssh`, "
            "which cannot reach rig rig-b as the deploy does: its inventory data gives paramiko's own arguments "
            "(banner_timeout)") in refused.output, refused.output[-4000:]
    with pytest.raises(docker.errors.NotFound):  # neither rig was touched
        client.volumes.get("rigkit-weights-relay-b")
    proc = start_deploy(inventory, folder / "first.log")

    # Kill rig B's receiver once it has journaled a few chunks (its container, as an OOM kill or a crash would).
    def receiving():
        try:
            return rigkit_dir(client, "rigkit-weights-relay-b")
        except docker.errors.NotFound:
            return None
    # A deploy that ends before rig B's receiver starts is a failure to read in its own output, not 300 s of waiting.
    state = wait_for("rig B's receiver to create its volume", lambda: receiving() or proc.poll() is not None, 300,
                     every_s=0.05)
    assert isinstance(state, Path), (folder / "first.log").read_text()[-6000:]
    # 9 journal lines: config.json's one chunk (first in the manifest's order) and 8 of the shard's.
    wait_for("rig B's receiver to journal 9 chunks", lambda: journaled(state) >= 9 or proc.poll() is not None, 300,
             every_s=0.01)  # the kill lands mid-relay: look often
    assert proc.poll() is None, (folder / "first.log").read_text()[-4000:]
    client.containers.get("rigkit-weights-relay-b-receive").kill()
    first = finish(proc, folder / "first.log")
    assert first.returncode != 0, first.output[-4000:]
    assert "relay-b: the target rig's receiver failed" in first.output, first.output[-4000:]
    assert "Traceback" not in first.output
    assert not (state / "complete").exists()
    sizes = {str(p.relative_to(SOURCE)): p.stat().st_size for p in SOURCE.rglob("*") if p.is_file()}
    kept = journaled_bytes(state, sizes, CHUNK_BYTES)  # on disk and journaled when the receiver died
    cut = {str(p.relative_to(state.parent))[:-len(".rigkit-partial")] for p in state.parent.rglob("*.rigkit-partial")}
    assert 8 * CHUNK_BYTES <= sum(kept.values()) < total

    # Rig B reboots, now reaching its engine's volumes folder: the resumed copy is received there.
    rig_b.engine_volumes = True
    rig_b.start(log=lambda m: print(m, file=sys.stderr))
    second = finish(start_deploy(inventory, folder / "second.log"), folder / "second.log")
    assert second.returncode == 0, second.output[-6000:]
    record = json.loads((state / "last-copy.json").read_text())
    assert record["volume_path"] == str(state.parent), record  # on rig B's shell, not in a container at /v
    source_path = Path(client.volumes.get("rigkit-weights-relay-a").attrs["Mountpoint"])
    assert f"sent again; {source_path} to {state.parent}" in second.output, second.output[-6000:]
    # Bytes the copier recorded: at most one chunk crossed again; the rest resumed in place.
    assert record["resent_bytes"] <= CHUNK_BYTES, record
    assert record["received_bytes"] == total - sum(kept.values()), record
    assert record["rehashed_bytes"] == sum(kept.get(p, 0) for p in cut), record
    assert record["resumed_at"] == {p: kept[p] for p in cut if kept.get(p)}, record
    assert (state / "complete").exists()
    # An independent read: rig B's volume holds the source's bytes.
    volume = state.parent
    assert {p: h for p, h in sha256s(volume).items() if not p.startswith(".rigkit")} == sha256s(SOURCE)
    manifest = json.loads((state / "manifest.json").read_text())
    shard = next(e for e in manifest["files"] if e["path"].endswith(".safetensors"))
    assert shard["proof"] == ["safetensors-header"]
    # Rig A's model compiled its graphs at its start (the first deploy); rig B took them with the weights (same
    # image, GPU model and driver), so its first start loaded them.
    started_a, started_b = last_start(fresh_rig, "relay-a"), last_start(rig_b, "relay-b")
    key = started_a["compile_cache"]["key"]
    assert started_a["compile_cache"]["cache"] == "miss" and key, started_a
    assert f"relay-b: compiled graphs {key[:12]} taken from rig rig-a, " in second.output, second.output[-6000:]
    assert started_b["compile_cache"]["cache"] == "hit" and started_b["compile_cache"]["key"] == key, started_b
    assert started_b["compile_cache"]["paths"] == [f"torch_compile_cache/{key}"] == started_a["compile_cache"]["paths"]

    third = finish(start_deploy(inventory, folder / "third.log"), folder / "third.log")
    assert third.returncode == 0, third.output[-6000:]
    assert third.changed_operations() == 0, third.output[-6000:]

    # `rigkit rollout`: one rig at a time (--limit), so rig B's deploy connects to rig A itself to read
    # its manifest; nothing changes on either rig.
    rollout = subprocess.run([sys.executable, "-m", "rigkit.cli", "rollout", str(inventory)], cwd=REPO, timeout=600,
                             env=dict(os.environ, RIGKIT_STATE=str(STATE_ROOT)), capture_output=True, text=True)
    output = rollout.stdout + rollout.stderr
    assert rollout.returncode == 0, output[-6000:]
    runs = output.split("rigkit rollout: rig ")[1:]
    assert len(runs) == 2 and sum(_changed(run) for run in runs) == 0, output[-6000:]
