"""Weights from another rig, without Docker: the copier's send and receive (templates/weights/copier/,
shipped as one file) run as local processes on two folders, this test pumping the sender's stdout into
the receiver's stdin as the controller's relay does over two SSH channels (rigkit/weights/relay.py;
the SSH path itself is tested in test_weights_relay_rigs.py); and the inventory's rig sources, refused
by `rigkit deploy` in one line before any rig is reached (the rigs' addresses here answer nothing).
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

from rigkit.config.rig_sources import FleetRig, share_sources
from rigkit.config.loader import load_rig
from tests.conftest import REPO
from tests.test_weights_copier import COPIER, safetensors

CHUNK = 64 * 1024


def source_volume(tmp_path: Path) -> tuple[Path, dict[str, bytes]]:
    """Rig A's complete volume, made by the copier itself from a folder."""
    files = {"config.json": b'{"model_type": "tiny"}', "model-1.safetensors": safetensors({"a": 600_000}),
             "sub/model-2.safetensors": safetensors({"b": 500_000, "c": 100_000})}
    for name, data in files.items():
        (tmp_path / "src" / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "src" / name).write_bytes(data)
    done = subprocess.run([sys.executable, str(COPIER), "copy", str(tmp_path / "src"), str(tmp_path / "a")],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout
    return tmp_path / "a", files


def journaled_bytes(state: Path, sizes: dict[str, int], chunk: int = CHUNK) -> dict[str, int]:
    """{path: bytes its journaled chunks cover}, read from the receiver's chunks.jsonl."""
    chunks: dict[str, int] = {}
    for line in (state / "chunks.jsonl").read_text().splitlines():
        if line.endswith("}"):
            path = json.loads(line)["path"]
            chunks[path] = chunks.get(path, 0) + 1
    return {p: min(sizes[p], n * chunk) for p, n in chunks.items()}


def relay(a: Path, b: Path, stop_after: int | None = None) -> tuple[int, dict, dict]:
    """(receiver's exit code, its report, the sender's report); `stop_after`: kill the receiver once
    this many bytes were pumped (as a crash or `docker kill` would)."""
    manifest = subprocess.run([sys.executable, str(COPIER), "manifest", str(a)], capture_output=True, timeout=60)
    rx = subprocess.Popen([sys.executable, str(COPIER), "receive", str(b), str(CHUNK)], stdin=subprocess.PIPE,
                          stdout=subprocess.PIPE)
    rx.stdin.write(manifest.stdout)
    rx.stdin.flush()
    plan = rx.stdout.readline()
    tx = subprocess.Popen([sys.executable, str(COPIER), "send", str(a)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE)
    tx.stdin.write(plan)
    tx.stdin.close()
    pumped = 0
    try:
        while block := tx.stdout.read1(65536):
            rx.stdin.write(block)
            pumped += len(block)
            if stop_after is not None and pumped >= stop_after:
                rx.stdin.flush()
                # Every byte pumped has reached the receiver once its journal covers them, or it died.
                rx.kill()
                break
        rx.stdin.close()
    except BrokenPipeError:
        pass
    out, code = rx.stdout.read().decode(), rx.wait(timeout=60)
    tx.kill()
    sent = tx.stderr.read().decode().strip().splitlines()
    tx.wait(timeout=60)
    last = out.strip().splitlines()
    return code, json.loads(last[-1]) if last else {}, json.loads(sent[-1]) if sent else {}


def test_a_killed_copy_resumes_at_its_last_journaled_chunk_and_a_rerun_sends_nothing(tmp_path):
    a, files = source_volume(tmp_path)
    b = tmp_path / "b"
    total = sum(len(d) for d in files.values())
    code, _, _ = relay(a, b, stop_after=700_000)
    assert code != 0
    assert not (b / ".rigkit" / "complete").exists()
    kept = journaled_bytes(b / ".rigkit", {p: len(d) for p, d in files.items()})
    durable = durable_files(b)
    code, report, sent = relay(a, b)
    assert code == 0, report
    assert report["resent_bytes"] <= CHUNK
    # Nothing journaled crossed again: the sender read only what the receiver did not have.
    assert sent["read_bytes"] == report["received_bytes"] == total - sum(kept.values())
    # What was journaled but not yet marked durable (the cut file, or one renamed into place just before the
    # kill) is re-read in place; a durable file is kept without a read.
    assert report["rehashed_bytes"] == sum(n for p, n in kept.items() if p not in durable)
    assert {p: (b / p).read_bytes() for p in files} == files
    assert (b / ".rigkit" / "complete").exists() and not (b / ".rigkit" / "chunks.jsonl").exists()
    manifest = json.loads((b / ".rigkit" / "manifest.json").read_text())
    assert {e["path"]: e["proof"] for e in manifest["files"]}["sub/model-2.safetensors"] == ["safetensors-header"]
    code, report, sent = relay(a, b)
    assert code == 0 and report["received_bytes"] == 0 and sent["read_bytes"] == 0


def durable_files(b: Path) -> set[str]:
    """The files the receiver marked durable (progress.jsonl): kept by the next run without a read."""
    progress = b / ".rigkit" / "progress.jsonl"
    lines = progress.read_text().splitlines() if progress.exists() else []
    return {json.loads(line)["path"] for line in lines if line.endswith("}") and json.loads(line).get("durable")}


def test_a_file_renamed_into_place_but_killed_before_its_progress_line_is_proven_by_its_chunks_not_sent_again(tmp_path):
    """The window between a finished file's rename and its durable line, made by hand on a finished copy: every
    file in place, its chunks journaled as the receiver journals them (chunks.jsonl), no progress line, no
    manifest, not complete. The next run proves each file by its chunks and asks the sender for nothing."""
    a, files = source_volume(tmp_path)
    b = tmp_path / "b"
    assert relay(a, b)[0] == 0
    state = b / ".rigkit"
    sha = {e["path"]: e["sha256"] for e in json.loads((a / ".rigkit" / "manifest.json").read_text())["files"]}
    with (state / "chunks.jsonl").open("w") as journal:
        for path, data in files.items():
            for index in range(0, max(1, -(-len(data) // CHUNK))):
                piece = data[index * CHUNK:(index + 1) * CHUNK]
                journal.write(json.dumps({"path": path, "file_sha256": sha[path], "chunk_bytes": CHUNK, "chunk": index,
                                          "sha256": hashlib.sha256(piece).hexdigest()}) + "\n")
    for name in ("progress.jsonl", "manifest.json", "complete"):
        (state / name).unlink()
    code, report, sent = relay(a, b)
    assert code == 0, report
    assert sent["read_bytes"] == report["received_bytes"] == 0  # nothing crossed again
    assert report["rehashed_bytes"] == sum(len(d) for d in files.values())  # each file re-read in place instead
    assert {p: (b / p).read_bytes() for p in files} == files and (state / "complete").exists()


def test_a_source_volume_file_that_differs_from_its_manifest_is_refused_by_name_and_nothing_is_complete(tmp_path):
    a, files = source_volume(tmp_path)
    shard = a / "model-1.safetensors"
    data = bytearray(shard.read_bytes())
    data[-1] ^= 1  # same size, one flipped byte: rig A's volume rotted after its copy
    shard.write_bytes(bytes(data))
    code, report, _ = relay(a, tmp_path / "b")
    assert code == 4
    assert "model-1.safetensors: sha256: expected" in report["error"]
    assert not (tmp_path / "b" / ".rigkit" / "complete").exists()
    assert not (tmp_path / "b" / "model-1.safetensors").exists()


def test_an_incomplete_source_volume_is_refused_and_the_sender_reads_only_what_the_manifest_lists(tmp_path):
    a, _ = source_volume(tmp_path)
    send = subprocess.run([sys.executable, str(COPIER), "send", str(a)], input=b'{"files": [["../../etc/passwd", 0]]}\n',
                          capture_output=True, timeout=60)
    assert send.returncode == 2 and b"which the source's manifest does not list" in send.stderr
    assert send.stdout == b""
    (a / ".rigkit" / "complete").unlink()
    manifest = subprocess.run([sys.executable, str(COPIER), "manifest", str(a)], capture_output=True, text=True,
                              timeout=60)
    assert manifest.returncode == 2 and "not complete" in manifest.stdout


# ----- the inventory's rig sources -----------------------------------------------------------------

MODEL = "image: rigkit-vllm-standin:sim\nweights: {source: SOURCE}\ngpus: [0]\nport: PORT\n"


def fleet(tmp_path: Path, sources: dict[str, str], rigs: dict[str, list[str]], ports: dict[str, int] | None = None,
          windows: str | None = None) -> Path:
    """An inventory: rig NAME serves the models listed, each model's weights.source as given."""
    (tmp_path / "models").mkdir()
    for n, (name, source) in enumerate(sources.items()):
        (tmp_path / "models" / f"{name}.yml").write_text(MODEL.replace("SOURCE", source).replace("PORT", str(18300 + n)))
    hosts = []
    base = (REPO / "tests" / "data" / "rigs" / "serving.yml").read_text()
    for n, (rig, models) in enumerate(rigs.items()):
        text = base.replace("models: [test-alpha, test-beta]", f"models: [{', '.join(models)}]")
        (tmp_path / f"{rig}.yml").write_text(text)
        hosts.append((rig, {"ssh_hostname": "127.0.0.1", "ssh_port": (ports or {}).get(rig, 1 + n),
                            "rig_file": str(tmp_path / f"{rig}.yml"), "catalog_dir": str(tmp_path / "models")}))
    inventory = tmp_path / "inventory.py"
    inventory.write_text(f"rigs = {hosts!r}\n")
    return inventory


def deploy(inventory: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "rigkit.cli", "deploy", str(inventory)], capture_output=True, text=True,
                          cwd=REPO, timeout=120)


@pytest.mark.parametrize("sources, rigs, said", [
    ({"m": "{rig: rig-z}"}, {"rig-a": ["m"]}, "weights.source rig rig-z: no rig of that name in the inventory; rigs: rig-a"),
    ({"m": "{rig: rig-a}"}, {"rig-a": ["m"]}, "names this rig itself"),
    ({"m": "/srv/m", "n": "{rig: rig-a, volume: rigkit-weights-x}"}, {"rig-a": ["m"], "rig-b": ["n"]},
     "rig rig-a keeps no weights volume rigkit-weights-x; its volumes: rigkit-weights-m"),
    ({"m": "{rig: rig-b, volume: rigkit-weights-n}", "n": "{rig: rig-a, volume: rigkit-weights-m}"},
     {"rig-a": ["m"], "rig-b": ["n"]}, "weights sources form a cycle"),
    ({"m": "{rig: 'a b'}"}, {"rig-a": ["m"]}, "weights.source"),
])
def test_bad_rig_sources_are_refused_in_one_line_before_any_rig_is_reached(tmp_path, sources, rigs, said):
    run = deploy(fleet(tmp_path, sources, rigs))
    assert run.returncode == 2, run.stdout + run.stderr
    assert said in run.stderr and "Traceback" not in run.stderr
    assert len(run.stderr.strip().splitlines()) <= 3, run.stderr


@pytest.mark.parametrize("data, said", [
    ({"ssh_password": "s3cret"}, "its inventory data gives a password (ssh_password or ssh_key_password)"),
    ({"ssh_paramiko_connect_kwargs": {"banner_timeout": 60}},
     "its inventory data gives paramiko's own arguments (banner_timeout); put such settings in an SSH config file"),
    ({"ssh_strict_host_key_checking": "ask"}, "ssh_strict_host_key_checking 'ask' would prompt; use yes, accept-new"),
])
def test_a_rig_source_the_relay_cannot_reach_over_openssh_is_refused_with_the_reason(tmp_path, data, said):
    """The relay's one transport is OpenSSH's `ssh`: a rig it cannot reach as the deploy does is refused
    as a source's target before any rig is reached (the addresses here answer nothing), and the secret
    itself is never printed."""
    inventory = fleet(tmp_path, {"m": "/srv/m", "n": "{rig: rig-a, volume: rigkit-weights-m}"},
                      {"rig-a": ["m"], "rig-b": ["n"]})
    hosts = eval(inventory.read_text().removeprefix("rigs = "))  # noqa: S307: the list this test wrote
    hosts[1][1].update(data)
    inventory.write_text(f"rigs = {hosts!r}\n")
    run = deploy(inventory)
    assert run.returncode == 2, run.stdout + run.stderr
    assert (f"weights.source rig rig-a volume rigkit-weights-m: the copy between rigs runs over OpenSSH's `ssh`, "
            f"which cannot reach rig rig-b as the deploy does: {said}") in run.stderr, run.stderr
    assert "s3cret" not in run.stdout + run.stderr and "Traceback" not in run.stderr


def test_another_rigs_bad_ssh_settings_do_not_stop_a_command_limited_to_one_rig(tmp_path):
    """Checking who the relay reaches reads every host's SSH settings; a rig whose key file is missing here
    is one the relay cannot reach, and an error only for a command that reaches that rig."""
    from rigkit.preflight.inventory_check import reached_rigs

    inventory = fleet(tmp_path, {"m": "/srv/m"}, {"rig-a": ["m"], "rig-b": ["m"]})
    hosts = eval(inventory.read_text().removeprefix("rigs = "))  # noqa: S307: the list this test wrote
    hosts[1][1]["ssh_key"] = str(tmp_path / "no-such-key")
    inventory.write_text(f"rigs = {hosts!r}\n")
    assert reached_rigs("deploy", str(inventory), "rig-a", whole_fleet=True) == ["rig-a"]
    assert reached_rigs("deploy", str(inventory), None, whole_fleet=True) == 2  # rig-b's own key: refused


def check_one_model(tmp_path: Path, weights: str, rig_file: str, models: str) -> subprocess.CompletedProcess:
    """`rigkit check` of a rig (a copy of tests/data/rigs/RIG_FILE) serving one model with these weights."""
    (tmp_path / "m.yml").write_text(MODEL.replace("SOURCE", weights).replace("PORT", "18300"))
    rig = tmp_path / "rig.yml"
    rig.write_text((REPO / "tests" / "data" / "rigs" / rig_file).read_text().replace(models, "[m]"))
    return subprocess.run([sys.executable, "-m", "rigkit.cli", "check", str(rig), "--catalog", str(tmp_path)],
                          capture_output=True, text=True, cwd=REPO, timeout=60)


def test_a_rig_source_with_a_bind_mount_is_refused(tmp_path):
    run = check_one_model(tmp_path, "{rig: rig-a}, storage: bind", "serving.yml", "[test-alpha, test-beta]")
    assert run.returncode != 0 and "use storage: volume" in run.stderr, run.stderr


def test_rigs_sharing_a_source_take_it_from_the_first_unless_they_are_one_machine(tmp_path):
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "m.yml").write_text(MODEL.replace("SOURCE", "/srv/m").replace("PORT", "18300"))
    (tmp_path / "rig.yml").write_text(
        (REPO / "tests" / "data" / "rigs" / "serving.yml").read_text().replace("[test-alpha, test-beta]", "[m]"))
    rig = load_rig(tmp_path / "rig.yml", tmp_path / "models")
    shared = share_sources([FleetRig("a", rig, "10.0.0.1:22"), FleetRig("b", rig, "10.0.0.2:22"),
                            FleetRig("c", rig, "10.0.0.1:22")])
    assert shared["a"].models[0].spec.weights.source == "/srv/m"
    assert str(shared["b"].models[0].spec.weights.source) == "rig a volume rigkit-weights-m"
    assert shared["c"].models[0].spec.weights.source == "/srv/m"  # rig a's own machine: its volume already
    # A rig the relay cannot reach (a password: no OpenSSH) is never paired: each copies from its folder.
    unreachable = share_sources([FleetRig("a", rig, "10.0.0.1:22"), FleetRig("b", rig, "10.0.0.2:22", "a password"),
                                 FleetRig("d", rig, "10.0.0.3:22")])
    assert [unreachable[n].models[0].spec.weights.source for n in "ab"] == ["/srv/m", "/srv/m"]
    assert str(unreachable["d"].models[0].spec.weights.source) == "rig a volume rigkit-weights-m"
    # The first rig unreachable: the next one it reaches is the one the others copy from.
    first_unreachable = share_sources([FleetRig("a", rig, "10.0.0.1:22", "a password"),
                                       FleetRig("b", rig, "10.0.0.2:22"), FleetRig("c", rig, "10.0.0.3:22")])
    assert [first_unreachable[n].models[0].spec.weights.source for n in "ab"] == ["/srv/m", "/srv/m"]
    assert str(first_unreachable["c"].models[0].spec.weights.source) == "rig b volume rigkit-weights-m"


def test_rigs_keeping_one_hub_model_take_it_from_the_first_which_alone_asks_the_hub(tmp_path):
    """The pairing for a hub source (docs/weights.md, "From the Hugging Face Hub"): the same repository at the
    same commit is the same snapshot folder in each rig's cache, so the others take the first rig's volume and
    keep no hub source of their own (they never download)."""
    commit = "0123456789abcdef0123456789abcdef01234567"
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "m.yml").write_text(
        MODEL.replace("{source: SOURCE}", f"{{hub: {{repo: org/m, revision: {commit}}}}}").replace("PORT", "18300"))
    (tmp_path / "rig.yml").write_text(
        (REPO / "tests" / "data" / "rigs" / "serving.yml").read_text().replace("[test-alpha, test-beta]", "[m]"))
    rig = load_rig(tmp_path / "rig.yml", tmp_path / "models")
    shared = share_sources([FleetRig("a", rig, "10.0.0.1:22"), FleetRig("b", rig, "10.0.0.2:22")])
    first, second = shared["a"].models[0].spec.weights, shared["b"].models[0].spec.weights
    assert first.hub is not None and first.source == f"/var/lib/rigkit/hub/models--org--m/snapshots/{commit}"
    assert second.hub is None and str(second.source) == "rig a volume rigkit-weights-m"


def test_verify_weights_on_a_copied_volume_removes_a_damaged_file_and_the_next_copy_takes_only_it(tmp_path):
    """--verify-weights on a rig whose volume came from another rig runs the copier's verify on it alone
    (rigkit.weights.relay.verify_volume: `verify /v /v`), then the relay."""
    a, files = source_volume(tmp_path)
    b = tmp_path / "b"
    assert relay(a, b)[0] == 0
    shard = b / "sub" / "model-2.safetensors"
    data = bytearray(shard.read_bytes())
    data[100] ^= 1
    shard.write_bytes(bytes(data))
    verify = subprocess.run([sys.executable, str(COPIER), "verify", str(b), str(b)], capture_output=True, text=True,
                            timeout=60)
    assert verify.returncode == 1
    assert json.loads(verify.stdout.strip().splitlines()[-1])["bad"] == ["sub/model-2.safetensors"]
    code, report, sent = relay(a, b)
    assert code == 0 and sent["read_bytes"] == report["received_bytes"] == len(files["sub/model-2.safetensors"])
    assert shard.read_bytes() == files["sub/model-2.safetensors"]


def test_a_rig_source_on_a_windows_rig_is_refused_by_check(tmp_path):
    run = check_one_model(tmp_path, "{rig: rig-a}", "windows.yml", "[win-alpha]")
    assert run.returncode == 2 and "copied only onto Linux rigs" in run.stderr, run.stderr
    assert len(run.stderr.strip().splitlines()) == 1
