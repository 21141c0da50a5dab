"""The weights copier (templates/weights/copier/) run directly on local folders, as the one file rigkit
ships (rigkit/weights/copier.py), the way the deploy's read-only fact runs its `check` on the rig. No Docker.

Simulated: a full disk, by pointing the copy's partial file at /dev/full (every write, or
the flush at close, fails with ENOSPC), as a volume that fills while a file is written.
Real: the Hugging Face cache layout (a snapshot folder of symlinks into ../../blobs).
"""

from __future__ import annotations

import errno
import hashlib
import importlib
import importlib.util
import json
import os
import struct
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from types import SimpleNamespace

import pytest

from tests.conftest import REPO



def shipped_copier() -> Path:
    """The copier as rigkit ships it, in a file of its own for this test process."""
    from rigkit.weights.copier import copier_source

    path = Path(tempfile.mkdtemp(prefix="rigkit-copier-")) / "rigkit-copier.py"
    path.write_text(copier_source())
    return path


COPIER = shipped_copier()


def run(mode: str, src: Path, dst: Path, root: Path | None = None) -> tuple[int, dict]:
    args = [sys.executable, str(COPIER), mode, str(src), str(dst), *([str(root)] if root else [])]
    proc = subprocess.run(args, capture_output=True, text=True, timeout=120)
    return proc.returncode, json.loads(proc.stdout.strip().splitlines()[-1])


def safetensors(tensors: dict[str, int], pad: bytes = b"") -> bytes:
    """A safetensors file: BF16 tensors of the given byte sizes laid end to end (random bytes)."""
    header, at = {"__metadata__": {"format": "pt"}}, 0
    for name, size in tensors.items():
        header[name] = {"dtype": "BF16", "shape": [size // 2], "data_offsets": [at, at + size]}
        at += size
    text = json.dumps(header).encode()
    return struct.pack("<Q", len(text)) + text + os.urandom(at) + pad


def git_blob_sha1(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def hf_snapshot(tmp_path: Path) -> tuple[Path, Path, dict[str, bytes]]:
    """models--org--tiny/snapshots/<rev>/ of symlinks into ../../blobs/, as huggingface_hub makes it:
    an LFS file's blob is named by its SHA-256, a small (git) file's by its git blob hash."""
    repo = tmp_path / "hub" / "models--org--tiny"
    snapshot = repo / "snapshots" / "0123abcd"
    (repo / "blobs").mkdir(parents=True)
    (snapshot / "sub").mkdir(parents=True)
    files = {"config.json": b'{"model_type": "tiny"}', "model.safetensors": safetensors({"a": 200_000, "b": 100_000}),
             "sub/tokenizer.json": b'{"v": 1}'}
    for name, data in files.items():
        lfs = name.endswith(".safetensors")
        blob = repo / "blobs" / (hashlib.sha256(data).hexdigest() if lfs else git_blob_sha1(data))
        blob.write_bytes(data)
        link = snapshot / name
        link.symlink_to(os.path.relpath(blob, link.parent))
    return repo, snapshot, files


def test_a_hugging_face_snapshot_is_copied_with_the_bytes_behind_its_links(tmp_path):
    repo, snapshot, files = hf_snapshot(tmp_path)
    dst = tmp_path / "volume"
    dst.mkdir()
    code, result = run("copy", snapshot, dst, repo)
    assert code == 0 and result["status"] == "copied" and result["files"] == 3, result
    for name, data in files.items():
        copied = dst / name
        assert not copied.is_symlink() and copied.read_bytes() == data
    assert run("check", snapshot, dst, repo)[1]["status"] == "unchanged"
    assert run("verify", snapshot, dst, repo)[1]["status"] == "verified"


def test_links_that_dangle_or_leave_the_cache_are_refused(tmp_path):
    repo, snapshot, _ = hf_snapshot(tmp_path)
    dst = tmp_path / "volume"
    dst.mkdir()
    (snapshot / "outside.bin").symlink_to("/etc/hostname")
    code, result = run("copy", snapshot, dst, repo)
    assert code == 2 and "links to /etc/hostname, outside" in result["error"]
    (snapshot / "outside.bin").unlink()
    (snapshot / "half.bin").symlink_to("../../blobs/not-downloaded")
    code, result = run("check", snapshot, dst, repo)
    assert code == 2 and "dangling symlink" in result["error"] and "incomplete" in result["error"]
    assert not (dst / ".rigkit" / "complete").exists()


def test_without_the_cache_root_a_snapshot_cannot_be_copied_as_if_complete(tmp_path):
    _, snapshot, _ = hf_snapshot(tmp_path)
    dst = tmp_path / "volume"
    dst.mkdir()
    code, result = run("copy", snapshot, dst)  # ROOT defaults to the snapshot itself
    assert code == 2 and "outside" in result["error"]
    assert not (dst / ".rigkit" / "complete").exists()


@pytest.mark.parametrize("make, words", [
    (lambda p: p.mkdir(), "has no files"),
    (lambda p: None, "does not exist"),
])
def test_an_empty_or_missing_source_is_an_error_not_complete(tmp_path, make, words):
    src, dst = tmp_path / "src", tmp_path / "dst"
    make(src)
    dst.mkdir()
    code, result = run("copy", src, dst)
    assert code == 2 and words in result["error"]
    assert not (dst / ".rigkit" / "complete").exists()


def load_copier(src: Path, dst: Path) -> SimpleNamespace:
    """The copier's modules, imported from its package in templates/, its places set to these folders:
    the names a test calls (state, proofs, local_copy) in one namespace."""
    folder = REPO / "templates" / "weights" / "copier"
    if "rigkit_copier" not in sys.modules:
        spec = importlib.util.spec_from_file_location("rigkit_copier", folder / "__init__.py",
                                                      submodule_search_locations=[str(folder)])
        sys.modules["rigkit_copier"] = package = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(package)
    modules = [importlib.import_module(f"rigkit_copier.{name}") for name in ("state", "proofs", "local_copy")]
    modules[0].SRC, modules[0].DST, modules[0].ROOT = str(src), str(dst), str(src)
    return SimpleNamespace(**{k: v for m in modules for k, v in vars(m).items() if not k.startswith("__")})


@pytest.mark.parametrize("size", [100, 40 * 1024 * 1024])  # fails at close (buffered), and at a write mid-file
def test_a_disk_that_fills_during_a_file_ends_with_enospc_not_a_hang(tmp_path, size):
    src, dst = tmp_path / "src", tmp_path / "dst"
    src.mkdir()
    dst.mkdir()
    (src / "w.bin").write_bytes(b"\0" * size)
    (dst / "w.bin.rigkit-partial").symlink_to("/dev/full")
    copier = load_copier(src, dst)
    outcome = []

    def copy():
        try:
            copier.copy_file("w.bin", 0, copier.Proof("w.bin", size, None))
        except OSError as exc:
            outcome.append(exc.errno)

    worker = threading.Thread(target=copy, daemon=True)
    worker.start()
    worker.join(timeout=60)
    assert not worker.is_alive(), "the copy hung on a full disk"
    assert outcome == [errno.ENOSPC]


def test_the_space_check_counts_only_what_is_added(tmp_path, monkeypatch):
    """A changed 3 MB file replacing a 3 MB file needs no new space: statvfs is patched to
    report 1 MB free, and the copy still goes ahead."""
    src, dst = tmp_path / "src", tmp_path / "dst"
    src.mkdir()
    dst.mkdir()
    (src / "w.bin").write_bytes(os.urandom(3_000_000))
    copier = load_copier(src, dst)
    assert copier.copy() == 0
    (src / "w.bin").write_bytes(os.urandom(3_000_000))
    real = os.statvfs(dst)
    monkeypatch.setattr(os, "statvfs", lambda path: type("S", (), {"f_bavail": 1_000_000 // real.f_frsize,
                                                                   "f_frsize": real.f_frsize})())
    assert copier.copy() == 0
    assert (dst / "w.bin").read_bytes() == (src / "w.bin").read_bytes()
    (src / "new.bin").write_bytes(os.urandom(2_000_000))
    assert copier.copy() == 3  # 2 MB really added, 1 MB free: refused before copying


def test_the_volume_fact_finds_each_volume_by_its_exact_name(tmp_path):
    """WeightsVolumeStates' command under /bin/sh with a simulated `docker` that answers
    `volume inspect` as Docker's CLI does (found volumes printed, missing ones skipped, exit 1).
    Names that awk would read as equal numbers ("100" and "1e2") must not swap mountpoints."""
    from rigkit.weights.facts import WeightsVolumeStates

    source = tmp_path / "model"
    source.mkdir()
    (source / "w.bin").write_bytes(b"w")
    mounts = {"1e2": tmp_path / "mp one", "100": tmp_path / "mp-two"}
    for folder in mounts.values():
        folder.mkdir()
    (mounts["100"] / ".rigkit").mkdir()
    (mounts["100"] / ".rigkit" / "complete").write_text("")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    table = "".join(f'  {name}) echo "{name} {path}";;\n' for name, path in mounts.items())
    (bin_dir / "docker").write_text(f'#!/bin/sh\n[ "$1" = ps ] && {{ printf "rigkit-weights-m-helper=m\\nBad;rm=m\\n"; exit 0; }}\n'
                                    f'shift 4\nfor v in "$@"; do case "$v" in\n{table}  *) rc=1;; esac; done\n'
                                    'exit ${rc:-0}\n')
    (bin_dir / "docker").chmod(0o755)
    pairs = (("1e2", str(source)), ("100", str(source)), ("absent", str(source)))
    out = subprocess.run(["sh", "-c", WeightsVolumeStates().command(pairs)], capture_output=True, text=True,
                         env={"PATH": f"{bin_dir}:/usr/bin:/bin"}, timeout=60)
    states = WeightsVolumeStates().process(out.stdout.splitlines())
    assert states["1e2"]["complete"] is False and states["100"]["complete"] is True  # each read its own volume
    assert states["absent"] == {"status": "missing"}
    # A helper a killed copy left behind, named on a line of its own (a name rigkit would not give: dropped).
    assert states[""] == {"status": "helpers", "helpers": {"rigkit-weights-m-helper": "m"}}


def test_the_shipped_copier_is_one_file_of_the_standard_library_that_runs_every_verb(tmp_path):
    """It runs as `python3 -c` in any image with python3: isolated (-I) and without site-packages (-S), from
    a folder with nothing else in it, its verbs copy, check, verify, manifest and answer as they do in the
    other tests; and it carries every module of its package (a module added there travels with it)."""
    from rigkit.weights.copier import copier_source

    src, dst = tmp_path / "src", tmp_path / "dst"
    src.mkdir()
    (src / "w.bin").write_bytes(b"weights")
    for verb, args, status in (("copy", [src, dst], "copied"), ("check", [src, dst], "unchanged"),
                               ("verify", [dst, dst], "verified"), ("manifest", [dst], "ok")):
        proc = subprocess.run([sys.executable, "-I", "-S", "-c", copier_source(), verb, *map(str, args)],
                              capture_output=True, text=True, timeout=60, cwd=tmp_path, env={})
        assert proc.returncode == 0, (verb, proc.stdout, proc.stderr)
        assert json.loads(proc.stdout.strip().splitlines()[-1])["status"] == status, (verb, proc.stdout)
    package = {p.stem for p in (REPO / "templates" / "weights" / "copier").glob("*.py")}
    assert package >= {"__init__", "state", "proofs", "check", "local_copy", "verify", "send", "receive", "main"}
    assert all(f"    {name!r}: " in copier_source() for name in package)


def test_check_each_refuses_an_incomplete_argument_list():
    """check-each takes NAME SRC DST ROOT per volume; anything else is a usage error, not a guess."""
    proc = subprocess.run([sys.executable, str(COPIER), "check-each", "vol", "/src", "/dst"], capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 2
    assert json.loads(proc.stdout.strip().splitlines()[-1])["error"].startswith("usage: check-each NAME SRC DST ROOT")


def test_check_each_answers_for_every_volume_when_one_fails_unexpectedly(tmp_path):
    """A manifest that parses but lacks its fields is that volume's error; the next volume is still checked."""
    source = tmp_path / "model"
    source.mkdir()
    (source / "w.bin").write_bytes(b"w")
    odd, fine = tmp_path / "odd", tmp_path / "fine"
    for volume in (odd, fine):
        (volume / ".rigkit").mkdir(parents=True)
    (odd / ".rigkit" / "complete").write_text("")
    (odd / ".rigkit" / "manifest.json").write_text('{"files": [{"path": "w.bin"}]}')
    proc = subprocess.run([sys.executable, str(COPIER), "check-each", "odd", str(source), str(odd), str(source),
                           "fine", str(source), str(fine), str(source)], capture_output=True, text=True, timeout=60)
    lines = proc.stdout.strip().splitlines()
    assert proc.returncode == 0 and lines[0] == "volume odd" and lines[2] == "volume fine", proc.stdout
    assert json.loads(lines[1]) == {"status": "error", "error": "KeyError: 'size'"}
    assert json.loads(lines[3])["status"] == "needed"


def _alpha():
    from rigkit.config.loader import load_rig
    from tests.conftest import SERVING_RIG, TEST_CATALOG

    return next(m for m in load_rig(SERVING_RIG, TEST_CATALOG).models if m.name == "test-alpha")


@pytest.mark.parametrize("options, refused", [({"type": "tmpfs", "device": "tmpfs"}, True), ({}, False),
                                              ({"type": "none", "o": "bind"}, False)])
def test_a_volume_that_keeps_nothing_once_unmounted_is_refused(options, refused):
    """Pure: a tmpfs volume would be filled, marked complete and empty again when the helper exits."""
    from types import SimpleNamespace

    from rigkit.weights.volumes import WeightsError, refuse_volatile

    volume = SimpleNamespace(name="rigkit-weights-test-alpha", attrs={"Driver": "local", "Options": options})
    if not refused:
        refuse_volatile(_alpha(), volume)
        return
    with pytest.raises(WeightsError) as caught:
        refuse_volatile(_alpha(), volume)
    assert str(caught.value) == (
        "test-alpha: volume rigkit-weights-test-alpha is a tmpfs volume: it empties whenever no container has it "
        "mounted, so the weights cannot stay on it. Remove it (docker volume rm rigkit-weights-test-alpha) and "
        "deploy again: rigkit creates it on the engine's disk")


@pytest.mark.parametrize("code, output, reason", [
    (137, "", "137 (killed by SIGKILL: the kernel's out-of-memory killer or a `docker kill`); it printed nothing"),
    (1, "Traceback ...\nOSError: boom", "1 (it printed no report); its last output: Traceback ...\nOSError: boom"),
])
def test_a_helper_that_dies_without_a_report_is_named_with_what_its_exit_means(code, output, reason):
    from rigkit.weights.volumes import WeightsError, _parse_report

    with pytest.raises(WeightsError) as caught:
        _parse_report(_alpha(), code, output, output.splitlines()[-1] if output else "")
    assert str(caught.value) == (f"test-alpha: the weights helper exited {reason}. Nothing was marked complete: "
                                 "deploy again and the copy resumes")


def test_a_failed_copy_is_one_clear_line_and_no_traceback(tmp_path):
    """The real pyinfra CLI on @local (no rig): a python.call that fails as copy_on_rig does prints the
    reason and fails the deploy without Python's traceback (any other exception gets one)."""
    import subprocess
    import sys

    from tests.conftest import REPO

    deploy = tmp_path / "deploy.py"
    deploy.write_text(
        "from pyinfra import host, logger\nfrom pyinfra.operations import python\n"
        "from rigkit.weights.operation import CopyFailed\n\n"
        "def fail():\n"
        "    host.log_styled('weights: m: volume v is out of space', fg='red', log_func=logger.error)\n"
        "    raise CopyFailed('m: volume v is out of space')\n\n"
        "python.call(name='Weights of m onto volume', function=fail)\n")
    run = subprocess.run([sys.executable, "-m", "pyinfra", "-y", "@local", str(deploy)], cwd=REPO,
                         capture_output=True, text=True, timeout=120, env={**__import__("os").environ,
                                                                           "PYTHONPATH": str(REPO)})
    output = run.stdout + run.stderr
    assert run.returncode != 0, output
    assert "weights: m: volume v is out of space" in output and "Traceback" not in output, output
