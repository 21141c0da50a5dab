"""Weights onto Docker volumes, against the real local Docker Engine.

Real: Docker volumes, the helper container (the vLLM stand-in's image stands in for the
serving image: any image with python3 works), the copy, kill and verify. The checkpoint
is generated here: safetensors-shaped files (an 8-byte header length, a JSON header,
tensor bytes) plus config JSON.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
import subprocess
import tempfile
import threading
import time
from contextlib import contextmanager
from pathlib import Path

import docker
import pytest

from rigkit.config.schema import ModelConfig, ModelSpec
from rigkit.weights.volumes import WeightsError, copy, needs_copy
from tests.vllm_standin.image import STABLE_TAG, ensure_standin_image

pytestmark = pytest.mark.simrig

SOURCE_ROOT = Path("/srv/rigkit-test-weights")


def make_checkpoint(folder: Path, shards: int, shard_bytes: int, seed: int = 0) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    block = hashlib.sha256(str(seed).encode()).digest() * (1 << 15)  # 1 MiB of non-repeating-looking bytes
    for n in range(shards):
        header = json.dumps({"w": {"dtype": "BF16", "shape": [shard_bytes // 2], "data_offsets": [0, shard_bytes]}}).encode()
        with open(folder / f"model-{n + 1:05d}-of-{shards:05d}.safetensors", "wb") as f:
            f.write(struct.pack("<Q", len(header)) + header)
            left = shard_bytes
            while left:
                piece = block[: min(left, len(block))]
                f.write(piece)
                left -= len(piece)
    (folder / "config.json").write_text(json.dumps({"model_type": "standin", "shards": shards}))
    (folder / "tokenizer").mkdir(exist_ok=True)
    (folder / "tokenizer" / "tokenizer.json").write_text("{}")


def sha256s(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def client():
    ensure_standin_image()
    return docker.from_env()


@pytest.fixture
def model(client, request):
    name = f"wtest-{request.node.name[5:30].replace('_', '-')}"
    source = SOURCE_ROOT / name
    spec = ModelSpec.model_validate({
        "image": STABLE_TAG, "weights": {"source": str(source)}, "gpus": [0], "port": 18900,
    })
    config = ModelConfig(name, spec, Path(f"{name}.yml"))
    yield config
    for volume in client.volumes.list(filters={"name": f"rigkit-weights-{name}"}):
        volume.remove(force=True)
    for path in sorted(source.rglob("*"), reverse=True) if source.exists() else []:
        path.unlink() if path.is_file() else path.rmdir()


def volume_files(client, model) -> dict[str, str]:
    """Hashes of the files in the volume, read by a separate container (not by rigkit's helper)."""
    out = client.containers.run(
        STABLE_TAG, ["sh", "-c", "cd /v && find . -type f ! -path './.rigkit/*' -exec sha256sum {} +"],
        entrypoint=[], volumes={f"rigkit-weights-{model.name}": {"bind": "/v", "mode": "ro"}}, remove=True,
    ).decode()
    return {line.split()[1][2:]: line.split()[0] for line in out.splitlines()}


def marker_present(client, model) -> bool:
    code = client.containers.run(
        STABLE_TAG, ["sh", "-c", "test -f /v/.rigkit/complete && echo yes || echo no"], entrypoint=[],
        volumes={f"rigkit-weights-{model.name}": {"bind": "/v", "mode": "ro"}}, remove=True,
    ).decode().strip()
    return code == "yes"


def test_copy_verifies_and_a_rerun_reads_no_file_contents(client, model):
    source = Path(model.spec.weights.source)
    make_checkpoint(source, shards=4, shard_bytes=3 << 20)
    assert needs_copy(client, model)

    [report] = copy(client, model)
    assert report.status == "copied" and report.files == 6
    assert report.copied_bytes == report.bytes == sum(p.stat().st_size for p in source.rglob("*") if p.is_file())
    assert volume_files(client, model) == sha256s(source)
    assert marker_present(client, model)
    assert "copied" in report.line() and "MB/s" in report.line()

    # Same size and mtime, different bytes: a rerun that read contents would notice. It must not.
    shard = source / "model-00001-of-00004.safetensors"
    stat = shard.stat()
    data = bytearray(shard.read_bytes())
    data[-1] ^= 0xFF
    shard.write_bytes(bytes(data))
    os.utime(shard, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert not needs_copy(client, model)
    [again] = copy(client, model)
    assert again.status == "unchanged" and again.hashed_bytes == 0 and again.copied_bytes == 0


def test_killed_copy_leaves_no_marker_and_the_next_run_completes(client, model):
    source = Path(model.spec.weights.source)
    make_checkpoint(source, shards=6, shard_bytes=96 << 20)
    before = sha256s(source)
    errors = []
    worker = threading.Thread(target=lambda: _copy_catching(client, model, errors))
    worker.start()
    helper = f"rigkit-weights-{model.name}-helper"
    for _ in range(600):  # until the copy has written its first file, bounded
        time.sleep(0.05)
        try:
            out = client.containers.get(helper).exec_run(["sh", "-c", "wc -l < /dst/.rigkit/progress.jsonl"])
            if out.exit_code == 0 and int(out.output.strip() or 0) >= 1:
                break
        except (docker.errors.NotFound, docker.errors.APIError, ValueError):
            continue
    client.containers.get(helper).kill()
    worker.join(timeout=60)
    assert errors, "the killed copy must not report success"
    assert not marker_present(client, model)
    assert sha256s(source) == before

    [report] = copy(client, model)
    assert report.status == "copied"
    assert 0 < report.copied_bytes < report.bytes  # resumed: finished files were not copied again
    assert marker_present(client, model)
    assert volume_files(client, model) == before == sha256s(source)


def _copy_catching(client, model, errors):
    try:
        copy(client, model)
    except Exception as exc:  # the helper was killed under it
        errors.append(exc)


def test_a_flipped_byte_is_caught_by_verify_and_repaired(client, model):
    source = Path(model.spec.weights.source)
    make_checkpoint(source, shards=3, shard_bytes=2 << 20)
    copy(client, model)
    client.containers.run(
        STABLE_TAG,
        ["python3", "-c", "f=open('/v/model-00002-of-00003.safetensors','r+b'); f.seek(1000); b=f.read(1); f.seek(1000); f.write(bytes([b[0]^1]))"],
        entrypoint=[], volumes={f"rigkit-weights-{model.name}": {"bind": "/v", "mode": "rw"}}, remove=True,
    )
    assert not needs_copy(client, model)  # metadata cannot see it
    verified, repaired = copy(client, model, verify=True)
    assert verified.status == "corrupt" and verified.bad == ("model-00002-of-00003.safetensors",)
    assert repaired.status == "copied"
    assert repaired.copied_bytes == (source / "model-00002-of-00003.safetensors").stat().st_size  # only that file
    assert volume_files(client, model) == sha256s(source)
    [clean, unchanged] = copy(client, model, verify=True)
    assert clean.status == "verified" and unchanged.status == "unchanged"


@contextmanager
def small_disk_volume(client, model, options: str):
    """The model's volume on a small disk: a host tmpfs of `options` (size, inodes) bind-mounted as the
    volume (the local driver's type=none, o=bind), so it keeps its data like a disk does. A volume of
    type=tmpfs would not: rigkit refuses those (they empty when unmounted)."""
    disk = Path(tempfile.mkdtemp(prefix="rigkit-small-disk-"))
    subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(disk)], check=True)
    try:
        client.volumes.create(f"rigkit-weights-{model.name}", driver="local",
                              driver_opts={"type": "none", "o": "bind", "device": str(disk)})
        yield disk
    finally:
        for volume in client.volumes.list(filters={"name": f"rigkit-weights-{model.name}"}):
            volume.remove(force=True)
        subprocess.run(["umount", "-l", str(disk)], check=False)
        disk.rmdir()


def test_a_volume_of_type_tmpfs_is_refused_before_anything_is_copied(client, model):
    """Simulated: nothing (a real tmpfs volume of the rig's engine). It would be filled, marked complete,
    and empty again once the helper unmounts it; every deploy would copy again."""
    make_checkpoint(Path(model.spec.weights.source), shards=1, shard_bytes=1 << 20)
    client.volumes.create(f"rigkit-weights-{model.name}", driver="local",
                          driver_opts={"type": "tmpfs", "device": "tmpfs", "o": "size=64m"})
    with pytest.raises(WeightsError) as caught:
        copy(client, model)
    assert f"volume rigkit-weights-{model.name} is a tmpfs volume: it empties whenever" in str(caught.value)
    assert not client.containers.list(all=True, filters={"label": f"rigkit.weights-helper={model.name}"})


def test_a_full_disk_names_the_volume_and_the_space_needed(client, model):
    source = Path(model.spec.weights.source)
    make_checkpoint(source, shards=2, shard_bytes=8 << 20)
    with small_disk_volume(client, model, "size=4m"):
        with pytest.raises(WeightsError) as caught:
            copy(client, model)
    message = str(caught.value)
    assert f"volume rigkit-weights-{model.name} is out of space: the copy needs 0.02 GB more" in message
    assert not marker_present(client, model)


def test_a_hugging_face_snapshot_is_copied_and_verified_through_the_helper(client, model):
    """The Hugging Face cache layout: the snapshot folder holds only symlinks into ../../blobs."""
    from dataclasses import replace

    from tests.test_weights_copier import hf_snapshot

    repo, snapshot, files = hf_snapshot(Path(model.spec.weights.source))
    hub_model = replace(model, spec=model.spec.model_copy(
        update={"weights": model.spec.weights.model_copy(update={"source": str(snapshot)})}))
    assert needs_copy(client, hub_model)
    [report] = copy(client, hub_model)
    assert report.status == "copied" and report.files == 3
    assert volume_files(client, hub_model) == {n: hashlib.sha256(d).hexdigest() for n, d in files.items()}
    [verified, unchanged] = copy(client, hub_model, verify=True)
    assert verified.status == "verified" and unchanged.status == "unchanged"


def test_a_volume_that_fills_during_the_copy_ends_with_no_space_not_a_hang(client, model):
    """tmpfs with few inodes: the byte count fits, so the copy starts, and creating a file
    fails with ENOSPC part-way (as a disk that another writer fills)."""
    source = Path(model.spec.weights.source)
    make_checkpoint(source, shards=6, shard_bytes=1 << 20)
    outcome = []
    with small_disk_volume(client, model, "size=64m,nr_inodes=8"):
        worker = threading.Thread(target=lambda: outcome.append(_copy_error(client, model)), daemon=True)
        worker.start()
        worker.join(timeout=180)
    assert not worker.is_alive(), "the copy hung on a full volume"
    assert "is out of space" in outcome[0]
    assert not marker_present(client, model)


def _copy_error(client, model) -> str:
    try:
        copy(client, model)
    except WeightsError as exc:
        return str(exc)
    return "no error"


def test_the_rig_engine_client_keeps_few_sessions_open(client):
    """Each connection through the forward is an SSH session on a real rig (sshd allows 10).
    Here each "session" is a plain connection to the local engine's socket, counted while open."""
    import socket as socketlib

    from rigkit.weights.engine import rig_engine

    open_now, most = set(), [0]

    class Session(socketlib.socket):
        def exec_command(self, command):
            assert command == "docker system dial-stdio"

        def close(self):
            open_now.discard(self)
            super().close()

    class Transport:
        def open_session(self):
            session = Session(socketlib.AF_UNIX)
            session.connect("/var/run/docker.sock")
            open_now.add(session)
            most[0] = max(most[0], len(open_now))
            return session

    with rig_engine(Transport()) as engine:
        helper = engine.containers.create(STABLE_TAG, ["true"], entrypoint=[])
        for _ in range(3):  # many distinct URLs: each used to leave its own pooled connection open
            helper.reload()
            engine.containers.get(helper.id)
            engine.volumes.list()
            engine.images.list()
            engine.version()
        helper.remove(force=True)
    assert most[0] <= 3, f"{most[0]} sessions open at once"


def test_a_damaged_hub_blob_is_refused_through_the_helper_and_resumes_once_fixed(client, model):
    """Simulated: a download that reported success with one byte wrong (huggingface_hub#3643): an LFS
    blob flipped after it was named, same size. Real: the helper, the volume, the deploy's error.
    The copy refuses it in one line naming the file and both hashes, marks nothing complete (read by
    a separate container); once the blob is fetched again, the next copy adds only that file."""
    from dataclasses import replace

    from tests.test_weights_copier import hf_snapshot

    repo, snapshot, files = hf_snapshot(Path(model.spec.weights.source))
    hub_model = replace(model, spec=model.spec.model_copy(
        update={"weights": model.spec.weights.model_copy(update={"source": str(snapshot)})}))
    blob = (snapshot / "model.safetensors").resolve()
    damaged = bytearray(files["model.safetensors"])
    damaged[-3] ^= 0x10
    blob.write_bytes(bytes(damaged))
    with pytest.raises(WeightsError) as caught:
        copy(client, hub_model)
    message = str(caught.value)
    assert "\n" not in message and message.startswith(f"{model.name}: weights from {snapshot}: 1 source file(s)")
    assert (f"model.safetensors: hub-sha256: expected {blob.name} (the name of its blob in blobs/), "
            f"found {hashlib.sha256(damaged).hexdigest()}") in message
    assert not marker_present(client, hub_model)
    assert "model.safetensors" not in volume_files(client, hub_model)

    blob.write_bytes(files["model.safetensors"])  # downloaded again
    [report] = copy(client, hub_model)
    assert report.status == "copied" and report.copied_bytes == len(files["model.safetensors"])
    assert dict(report.proven) == {"git-blob-sha1": 2, "hub-sha256": 1, "safetensors-header": 1}
    assert marker_present(client, hub_model)
    [verified, unchanged] = copy(client, hub_model, verify=True)
    assert verified.status == "verified" and unchanged.status == "unchanged"
    assert dict(verified.proven) == dict(report.proven)
