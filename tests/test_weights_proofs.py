"""Source integrity in the weights copier (templates/weights/copier/proofs.py), run directly on local
folders as tests/test_weights_copier.py does. No Docker.

Real: the Hugging Face cache layout (a snapshot folder of symlinks into ../../blobs, LFS blobs named
by their SHA-256, small files by their git blob hash) and the safetensors format, both written here.
Simulated: a damaged download, by changing a blob's bytes after it was named (same size: the
failure huggingface_hub#3643 reports as success); a corrupt volume whose manifest was edited to
match it; an old copier's volume, by a copy with the checks switched off (RIGKIT_WEIGHTS_PROOFS=off).
"""

from __future__ import annotations

import hashlib
import json
import struct
from pathlib import Path

import pytest

from tests.test_weights_copier import COPIER, git_blob_sha1, hf_snapshot, load_copier, run, safetensors


def flip_byte(path: Path, offset: int) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x01
    path.write_bytes(bytes(data))


def state(dst: Path) -> dict:
    rigkit = dst / ".rigkit"
    return {"complete": (rigkit / "complete").exists(), "manifest": (rigkit / "manifest.json").exists()}


def manifest(dst: Path) -> dict[str, dict]:
    return {e["path"]: e for e in json.loads((dst / ".rigkit" / "manifest.json").read_text())["files"]}


def blob_of(snapshot: Path, name: str) -> Path:
    return (snapshot / name).resolve()


@pytest.fixture
def hub(tmp_path):
    repo, snapshot, files = hf_snapshot(tmp_path)
    dst = tmp_path / "volume"
    dst.mkdir()
    return repo, snapshot, files, dst


def test_a_clean_snapshot_is_proven_by_the_hubs_names_and_verify_proves_it_again(hub):
    repo, snapshot, files, dst = hub
    code, result = run("copy", snapshot, dst, repo)
    assert code == 0 and result["status"] == "copied", result
    assert result["proven"] == {"git-blob-sha1": 2, "hub-sha256": 1, "safetensors-header": 1}
    entries = manifest(dst)
    assert entries["model.safetensors"]["proof"] == ["hub-sha256", "safetensors-header"]
    assert entries["model.safetensors"]["hub"] == blob_of(snapshot, "model.safetensors").name
    assert entries["config.json"]["proof"] == ["git-blob-sha1"]
    assert entries["config.json"]["hub"] == git_blob_sha1(files["config.json"])
    assert state(dst) == {"complete": True, "manifest": True}
    code, verified = run("verify", snapshot, dst, repo)
    assert code == 0 and verified["status"] == "verified" and verified["proven"] == result["proven"], verified


@pytest.mark.parametrize("name, offset, check", [
    ("model.safetensors", -5, "hub-sha256"),  # an LFS blob, one byte flipped in its tensor data, same size
    ("config.json", 3, "git-blob-sha1"),       # a small file: its git blob hash no longer matches its name
])
def test_a_blob_whose_bytes_are_not_its_name_is_refused_and_nothing_is_complete(hub, name, offset, check):
    repo, snapshot, files, dst = hub
    blob = blob_of(snapshot, name)
    flip_byte(blob, offset)
    damaged = blob.read_bytes()
    found = git_blob_sha1(damaged) if check == "git-blob-sha1" else hashlib.sha256(damaged).hexdigest()
    code, result = run("copy", snapshot, dst, repo)
    assert code == 4 and result["status"] == "error", result
    assert result["refused"] == [f"{name}: {check}: expected {blob.name} (the name of its blob in blobs/), found {found}"]
    assert result["error"].startswith("1 source file(s) are not what their checks say, so nothing was marked complete: "
                                      f"{name}: {check}: expected {blob.name}")
    assert state(dst) == {"complete": False, "manifest": False}
    assert not (dst / name).exists() and not list(dst.rglob("*.rigkit-partial"))  # the damaged bytes stay out

    # The download fixed, the next run copies only that file and completes, the others resumed.
    flip_byte(blob, offset)
    code, result = run("copy", snapshot, dst, repo)
    assert code == 0 and result["resumed_files"] == 2 and result["copied_bytes"] == len(files[name]), result
    assert (dst / name).read_bytes() == files[name] and state(dst)["complete"]
    assert manifest(dst)[name]["proof"][0] == check


@pytest.mark.parametrize("cut", [1, 1000])
def test_a_truncated_safetensors_file_is_refused_in_any_folder(tmp_path, cut):
    """A plain model folder (no hub names): the header says how long the file must be."""
    src, dst = tmp_path / "model", tmp_path / "volume"
    src.mkdir()
    dst.mkdir()
    whole = safetensors({"a": 4096, "b": 2048})
    (src / "model-00001-of-00001.safetensors").write_bytes(whole[:-cut])
    (src / "config.json").write_text("{}")
    code, result = run("copy", src, dst)
    header = struct.unpack("<Q", whole[:8])[0]
    assert code == 4, result
    assert result["refused"] == [
        f"model-00001-of-00001.safetensors: safetensors-header: expected 8 + {header} header + 6144 tensor bytes "
        f"= {len(whole)} bytes, found {len(whole) - cut}"]
    assert state(dst) == {"complete": False, "manifest": False}


def test_many_refused_files_are_all_listed_in_the_report_and_five_in_its_line(tmp_path):
    src, dst = tmp_path / "model", tmp_path / "volume"
    src.mkdir()
    dst.mkdir()
    for n in range(7):
        (src / f"m{n}.safetensors").write_bytes(safetensors({"a": 64})[:-1])
    code, result = run("copy", src, dst)
    assert code == 4 and len(result["refused"]) == 7 and result["error"].startswith("7 source file(s)"), result
    assert "m4.safetensors: safetensors-header" in result["error"] and "m5.safetensors" not in result["error"]
    assert "; and 2 more. The download is damaged" in result["error"]


def test_resume_proves_each_finished_file_again_and_keeps_its_proof(hub):
    """An interrupted copy (its marker and manifest gone, progress.jsonl kept): every finished file
    is re-read in the volume, proven again and kept with its proof, and none is copied again."""
    repo, snapshot, files, dst = hub
    assert run("copy", snapshot, dst, repo)[0] == 0
    before = manifest(dst)
    (dst / ".rigkit" / "complete").unlink()
    (dst / ".rigkit" / "manifest.json").unlink()
    code, result = run("copy", snapshot, dst, repo)
    assert code == 0 and result["resumed_files"] == 3 and result["copied_bytes"] == 0, result
    assert result["hashed_bytes"] == sum(len(d) for d in files.values())
    assert manifest(dst) == before


def test_a_volume_copied_without_the_checks_is_caught_on_resume_and_by_verify(hub, monkeypatch):
    """A damaged blob copied by a copier without the checks (an older rigkit): its manifest and its
    progress lines agree with the damaged bytes. Verify proves it against the source's blob name,
    and a resumed copy does not trust the progress line: it copies again and refuses the source."""
    repo, snapshot, files, dst = hub
    blob = blob_of(snapshot, "model.safetensors")
    flip_byte(blob, -1)
    monkeypatch.setenv("RIGKIT_WEIGHTS_PROOFS", "off")
    code, result = run("copy", snapshot, dst, repo)
    monkeypatch.delenv("RIGKIT_WEIGHTS_PROOFS")
    assert code == 0 and result["proven"] == {"copied-sha256": 3} and "hub" not in manifest(dst)["config.json"]

    code, verified = run("verify", snapshot, dst, repo)
    assert code == 1 and verified["bad"] == ["model.safetensors"], verified
    assert verified["reasons"]["model.safetensors"].startswith(f"model.safetensors: hub-sha256: expected {blob.name}")
    assert not state(dst)["complete"]

    assert run("copy", snapshot, dst, repo)[0] == 4
    (dst / "model.safetensors").write_bytes(blob.read_bytes())  # as the unchecked copy left it
    code, result = run("copy", snapshot, dst, repo)  # progress.jsonl lists it with its damaged sha256
    assert code == 4 and result["refused"][0].startswith("model.safetensors: hub-sha256"), result
    assert state(dst) == {"complete": False, "manifest": True}  # the old copy's manifest stays; no marker


@pytest.mark.parametrize("damage, reason", [
    ("rewrite-lfs", "model.safetensors: hub-sha256: expected {hub}"),
    ("truncate", "model.safetensors: safetensors-header: expected 8 + "),
])
def test_verify_proves_the_volume_even_where_its_manifest_was_changed_to_match(hub, damage, reason):
    """A volume file damaged and its manifest's sha256 edited to agree: the SHA-256 alone passes;
    the hub name the manifest records, or the safetensors header, does not."""
    repo, snapshot, files, dst = hub
    assert run("copy", snapshot, dst, repo)[0] == 0
    copied = dst / "model.safetensors"
    data = copied.read_bytes()
    copied.write_bytes(data[:-7] if damage == "truncate" else data[:-1] + bytes([data[-1] ^ 1]))
    path = dst / ".rigkit" / "manifest.json"
    edited = json.loads(path.read_text())
    for e in edited["files"]:
        if e["path"] == "model.safetensors":
            e["sha256"], e["size"] = hashlib.sha256(copied.read_bytes()).hexdigest(), copied.stat().st_size
    path.write_text(json.dumps(edited))
    code, verified = run("verify", snapshot, dst, repo)
    assert code == 1 and verified["bad"] == ["model.safetensors"], verified
    hub_name = manifest(dst)["model.safetensors"]["hub"]
    assert reason.format(hub=hub_name) in verified["reasons"]["model.safetensors"]
    assert not copied.exists() and not state(dst)["complete"]


def header_file(header: dict, data_bytes: int, length: int | None = None) -> bytes:
    text = json.dumps(header).encode()
    return struct.pack("<Q", len(text) if length is None else length) + text + bytes(data_bytes)


T = {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}


@pytest.mark.parametrize("content, problem", [
    (header_file({"__metadata__": {"k": "v"}, "a": T, "e": {"dtype": "U8", "shape": [0], "data_offsets": [8, 8]},
                  "b": {"dtype": "F8_E4M3", "shape": [3, 1], "data_offsets": [8, 11]}}, 11), None),
    (header_file({"a": T, "x": {"dtype": "F4", "shape": [7], "data_offsets": [8, 12]}}, 12), None),  # sub-byte: not sized
    (b"\x05\0\0", "expected at least the 8-byte header length, found a file of 3 bytes"),
    (header_file({"a": T}, 8, length=10**9), "expected a header length of at most 100000000 bytes, found 1000000000"),
    (header_file({"a": T}, 8, length=400), "expected 8 + 400 header bytes, found a file of 77 bytes"),
    (struct.pack("<Q", 4) + b"{no}" + bytes(8), "expected a JSON header of 4 bytes, found one that does not parse"),
    (header_file([1], 0), "expected a JSON object as the header, found list"),
    (header_file({"a": {"dtype": "F32", "shape": [2], "data_offsets": [8, 0]}}, 8),
     "tensor 'a': expected data_offsets [begin, end] with 0 <= begin <= end, found [8, 0]"),
    (header_file({"a": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}}, 8),
     "tensor 'a': expected 12 bytes (F32 [3]), found data_offsets spanning 8"),
    (header_file({"a": T, "b": {"dtype": "U8", "shape": [4], "data_offsets": [12, 16]}}, 16),
     "tensor 'b': expected its data to start at 8, found 12 (a gap before it)"),
    (header_file({"a": T, "b": {"dtype": "U8", "shape": [4], "data_offsets": [4, 8]}}, 8),
     "tensor 'b': expected its data to start at 8, found 4 (it overlaps the tensor before it)"),
    (header_file({"a": T}, 9), "expected 8 + 61 header + 8 tensor bytes = 77 bytes, found 78"),
], ids=["valid", "valid-sub-byte-dtype", "shorter-than-8", "header-over-limit", "header-past-end", "not-json",
        "not-an-object", "bad-offsets", "shape-vs-offsets", "gap", "overlap", "trailing-byte"])
def test_the_safetensors_header_must_tile_the_file_exactly(tmp_path, content, problem):
    """Pure: safetensors_problem on each kind of damage, and the streaming Proof reaching the same
    verdict whatever the chunks (the header split across 1- and 5-byte reads)."""
    copier = load_copier(tmp_path, tmp_path)
    found = copier.safetensors_problem(content, len(content))
    assert found is None if problem is None else found.startswith(problem), found
    for step in (1, 5, len(content) or 1):
        proof = copier.Proof("m.safetensors", len(content), None)
        for at in range(0, len(content), step):
            proof.update(content[at:at + step])
        _, passed, failed = proof.finish()
        assert failed == ([] if problem is None else [f"m.safetensors: safetensors-header: {found}"])
        assert passed == (["safetensors-header"] if problem is None else ["copied-sha256"])


def test_a_file_that_changes_size_while_copied_is_an_error_not_a_proof_failure(tmp_path):
    """The listing said one size, the read found another: the source is still being written."""
    src, dst = tmp_path / "src", tmp_path / "dst"
    src.mkdir()
    dst.mkdir()
    (src / "w.bin").write_bytes(b"12345")
    copier = load_copier(src, dst)
    with pytest.raises(copier.SourceError, match=r"w.bin changed size while it was copied \(9 bytes listed, 5 read\)"):
        copier.copy_file("w.bin", 0, copier.Proof("w.bin", 9, None))
    assert not list(dst.iterdir())


def test_a_source_error_reaches_the_deploy_as_one_line():
    """volumes._parse_report on the copier's report of a damaged source: one line with the model, the
    source and every refused file, never a traceback."""
    from rigkit.weights.volumes import WeightsError, _parse_report
    from tests.test_weights_copier import _alpha

    report = {"status": "error", "error": "1 source file(s) are not what their checks say, so nothing was marked "
              "complete: model.safetensors: hub-sha256: expected aa (the name of its blob in blobs/), found bb. "
              "The download is damaged: fetch these files again", "refused": ["..."]}
    with pytest.raises(WeightsError) as caught:
        _parse_report(_alpha(), 4, json.dumps(report), json.dumps(report))
    message = str(caught.value)
    assert "\n" not in message and message.startswith("test-alpha: weights from ")
    assert message.endswith(": " + report["error"])


def test_the_report_lines_say_what_proved_the_files_and_why_a_file_failed():
    from rigkit.weights.volumes import CopyReport

    copied = CopyReport("m", "v", "copied", files=3, bytes=3000, copied_bytes=3000, seconds=1.0,
                        proven=(("git-blob-sha1", 2), ("hub-sha256", 1)))
    assert copied.line().endswith("into volume v; proven: 2 git-blob-sha1, 1 hub-sha256")
    corrupt = CopyReport("m", "v", "corrupt", bad=("a",), reasons=("a: sha256: expected 1 (the manifest), found 2",))
    assert corrupt.line() == ("m: volume v has files that fail their check (copied again from the source next): "
                              "a: sha256: expected 1 (the manifest), found 2")


def test_the_bench_switch_turns_every_source_check_off(hub, monkeypatch):
    """bench/weights_copy.py measures the checks' cost with RIGKIT_WEIGHTS_PROOFS=off: it must really
    skip them (a damaged blob then copies), or the bench compares the checks with themselves."""
    repo, snapshot, files, dst = hub
    flip_byte(blob_of(snapshot, "config.json"), 0)
    monkeypatch.setenv("RIGKIT_WEIGHTS_PROOFS", "off")
    code, result = run("copy", snapshot, dst, repo)
    assert code == 0 and result["proven"] == {"copied-sha256": 3}, result
    assert COPIER.exists()
