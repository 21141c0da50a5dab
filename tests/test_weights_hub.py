"""Weights from a hub repository through the real parts: huggingface_hub 2.4.0 (in the serving image, as vLLM's
images carry it) downloading on rig A from a stand-in hub, the copier proving each blob against the hash the
hub named it by, a planted corrupted file refused, then rig B taking rig A's volume through the relay. Rig A's
model is offered in two variants; the deploy serves the one its GPUs run and says why not the other.

Simulated: the Hugging Face Hub (tests/hub_standin: its HTTP answers for the calls huggingface_hub makes,
checked against that client in tests/test_hub_standin.py), served on the controller's loopback, which the
download's container reaches because it has the host's network and both simulated rigs use the host's Docker
Engine; the GPUs (tests/simrig) and vLLM (tests/vllm_standin). For that shared engine rig B's model has
another name than rig A's (each its own volume) and names rig A's volume as its source, as
test_weights_relay_rigs does; on separate machines the same model name pairs the two by itself
(docs/weights.md). The hub cache is a folder under /srv/rigkit-sim-models, the same path on the host (where
the engine mounts it) and in the rigs (where the copier's check reads it).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import docker
import pytest

from tests.conftest import DATA, REPO, STATE_ROOT, DeployRun
from tests.hub_standin.server import Repo, serving
from tests.simrig.rig import SimRig, ssh_keypair
from tests.simrig.weights import SIM_MODELS
from tests.test_weights_relay_rigs import remove_leftovers
from tests.test_weights import make_checkpoint, sha256s

pytestmark = pytest.mark.simrig

RIG_B = ("rigkit-hub-b", 2234)
PORTS = {"hub-a": 18221, "hub-b": 18222}
REPO_ID = "rigkit-test/hub-tiny"
CACHE = SIM_MODELS / "hub-cache"
TOKEN = "hf_rigkitteststandintoken0123456789"
SHARD = "model-00001-of-00001.safetensors"


@pytest.fixture(scope="module")
def fleet(fresh_rig, tmp_path_factory):
    from tests.vllm_standin.image import ensure_standin_image

    ensure_standin_image()
    client = docker.from_env()
    remove_leftovers(client, PORTS)
    shutil.rmtree(CACHE, ignore_errors=True)
    CACHE.mkdir(mode=0o755, parents=True)
    os.chmod(CACHE, 0o755)  # as Docker would make it for the download (the rigs mount SIM_MODELS read-only)
    folder = tmp_path_factory.mktemp("hub")
    checkpoint = folder / "checkpoint"
    make_checkpoint(checkpoint, shards=1, shard_bytes=4 * 1024 * 1024, seed=52)
    repo = Repo(REPO_ID, {str(p.relative_to(checkpoint)): p.read_bytes() for p in checkpoint.rglob("*") if p.is_file()},
                private=True, token=TOKEN)
    # The CDN on a port of its own, as the Hub's is another host: the client sends it no token.
    with serving([repo], cdn="separate") as (hub, endpoint):
        rig_b = SimRig(name=RIG_B[0], ssh_port=RIG_B[1]).start(log=lambda m: print(m, file=sys.stderr))
        (folder / "models").mkdir()
        sources = {"hub-a": (f"{{hub: {{repo: {REPO_ID}, revision: {repo.commit}, endpoint: '{endpoint}', "
                             f"cache: {CACHE}}}}}"),
                   "hub-b": "{source: {rig: rig-a, volume: rigkit-weights-hub-a}}"}
        for name, weights in sources.items():
            (folder / "models" / f"{name}.yml").write_text(
                f"image: rigkit-vllm-standin:sim\nweights: {weights}\ngpus: [0]\nport: {PORTS[name]}\n"
                "vllm: {dtype: bfloat16}\nready_timeout_s: 30\n")
        # Rig A's model offered in two variants: the first's quantization needs a newer GPU than the 4090.
        (folder / "models" / "hub-a.yml").write_text(
            (folder / "models" / "hub-a.yml").read_text().replace(f"weights: {sources['hub-a']}\n", "")
            + f"variants:\n  - name: fp4\n    vllm: {{quantization: fp_quant}}\n    weights: {sources['hub-a']}\n"
            f"  - name: bf16\n    weights: {sources['hub-a']}\n")
        token = folder / "hf-token"
        token.write_text(TOKEN + "\n")
        token.chmod(0o600)
        base = (DATA / "rigs" / "serving.yml").read_text().replace("models: [test-alpha, test-beta]", "models: [MODEL]")
        (folder / "rig-a.yml").write_text(base.replace("MODEL", "hub-a") + f"hub_token_file: {token}\n")
        (folder / "rig-b.yml").write_text(base.replace("MODEL", "hub-b"))
        ssh = {"ssh_hostname": "127.0.0.1", "ssh_user": "root", "ssh_key": str(ssh_keypair()),
               "ssh_known_hosts_file": "/dev/null", "ssh_strict_host_key_checking": "off",
               "catalog_dir": str(folder / "models"), "rigkit_verify": "never"}
        hosts = [("rig-a", {**ssh, "ssh_port": fresh_rig.ssh_port, "rig_file": str(folder / "rig-a.yml")}),
                 ("rig-b", {**ssh, "ssh_port": RIG_B[1], "rig_file": str(folder / "rig-b.yml")})]
        (folder / "inventory.py").write_text(f"rigs = {hosts!r}\n")
        try:
            yield client, folder, hub, repo, checkpoint
        finally:
            remove_leftovers(client, PORTS)
            rig_b.remove()
            shutil.rmtree(CACHE, ignore_errors=True)


def deploy(folder: Path, log: str) -> DeployRun:
    proc = subprocess.run([sys.executable, "-m", "rigkit.plumbing.pyinfra_start", "-y", str(folder / "inventory.py"),
                           "deploy.py"], cwd=REPO, env=dict(os.environ, RIGKIT_STATE=str(STATE_ROOT)),
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=600)
    (folder / log).write_text(proc.stdout)
    return DeployRun(proc.returncode, proc.stdout)


def volume(client, name: str) -> Path:
    return Path(client.volumes.get(name).attrs["Mountpoint"])


def test_one_download_for_two_rigs_proven_against_the_hubs_hashes_a_corrupted_file_refused(fleet, fresh_rig):
    client, folder, hub, repo, checkpoint = fleet
    shard_sha = hashlib.sha256((checkpoint / SHARD).read_bytes()).hexdigest()

    # A token the hub does not know: refused in one line, the token nowhere in it, nothing downloaded.
    token = folder / "hf-token"
    token.write_text("hf_notthetokenthehubknows\n")
    refused = deploy(folder, "refused.log")
    assert refused.returncode != 0, refused.output[-6000:]
    assert (f"hub-a: weights from hub {REPO_ID}@{repo.commit[:12]}: the hub did not give {REPO_ID} to this rig: it "
            "does not exist, or it is gated or private and the token (hub_token_file) is not allowed it") in refused.output
    assert "hf_notthetoken" not in refused.output and "Traceback" not in refused.output
    assert not hub.requests("GET", "/cdn/") and all(r.status == 401 for r in hub.requests())
    token.write_text(TOKEN + "\n")

    # The hub's CDN sends the shard with one byte changed (the right size): huggingface_hub keeps it under the
    # hash the hub named; the copy refuses it and nothing is marked complete.
    hub.corrupt_cdn_path = SHARD
    first = deploy(folder, "first.log")
    assert first.returncode != 0, first.output[-6000:]
    assert f"{SHARD}: hub-sha256: expected {shard_sha}" in first.output, first.output[-6000:]
    assert "Traceback" not in first.output and TOKEN not in first.output
    assert not (volume(client, "rigkit-weights-hub-a") / ".rigkit" / "complete").exists()

    # As the deploy's message says: remove the blob named, deploy again. Only that file is fetched again.
    hub.corrupt_cdn_path = None
    blob = next(CACHE.glob(f"models--*/blobs/{shard_sha}"))
    blob.unlink()
    hub.clear_log()
    second = deploy(folder, "second.log")
    assert "hub-a: variant bf16, the first of 2 in its catalog that this rig's GPUs run and hold; not fp4: " \
        "quantization fp_quant needs compute capability 10.0" in second.output, second.output[-6000:]
    code, compose = fresh_rig.exec("cat /etc/rigkit/stacks/hub-a/compose.yml")
    assert code == 0 and "fp_quant" not in compose and "--dtype" in compose, compose
    assert second.returncode == 0, second.output[-6000:]
    fetched = hub.requests("GET", "/cdn/")
    assert [r.path.rsplit("/", 1)[1] for r in fetched] == [shard_sha], hub.requests()
    # The token went to the hub (the repository is private) and not to its CDN.
    assert all(r.authorization for r in hub.requests() if r.listener == "hub") and hub.requests("HEAD", "/")
    assert not any(r.authorization for r in fetched), fetched
    assert TOKEN not in second.output
    assert f"hub-a: hub rigkit-test/hub-tiny@{repo.commit[:12]} in the rig's cache: 3 files" in second.output
    assert "hub-b: hub rigkit-test" not in first.output + second.output  # rig B never asks the hub
    # Both volumes hold the repository's files, each proven against the hash the hub gave for it.
    for name in ("rigkit-weights-hub-a", "rigkit-weights-hub-b"):
        root = volume(client, name)
        assert (root / ".rigkit" / "complete").exists()
        assert {p: h for p, h in sha256s(root).items() if not p.startswith(".rigkit")} == sha256s(checkpoint)
        proofs = {e["path"]: e["proof"] for e in json.loads((root / ".rigkit" / "manifest.json").read_text())["files"]}
        assert "hub-sha256" in proofs[SHARD] and "git-blob-sha1" in proofs["config.json"], proofs

    hub.clear_log()
    third = deploy(folder, "third.log")
    assert third.returncode == 0, third.output[-6000:]
    assert third.changed_operations() == 0, third.output[-6000:]
    assert hub.requests() == []  # a converged fleet asks the hub nothing
