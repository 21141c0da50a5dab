"""The Hugging Face Hub stand-in (tests/hub_standin/server.py) against the real client.

Simulated: the Hugging Face Hub (tree API, repo info, /resolve, the LFS redirect to a CDN, its errors and
their X-Error-Code headers), served in threads on 127.0.0.1.
Real: huggingface_hub 2.4.0's client, `snapshot_download` over httpx2, talking to it over loopback, into a
tmp cache_dir; no Xet (the stand-in offers no Xet hash, and HF_HUB_DISABLE_XET is set besides).

huggingface_hub reads its environment once, at import (constants.py: HF_HUB_OFFLINE, HF_HUB_DISABLE_XET,
HF_HUB_DISABLE_TELEMETRY, HF_TOKEN_PATH...), and this module imports it before any fixture runs: the
fixture below sets the variables and also patches those constants, and every call passes endpoint= and
cache_dir= rather than relying on HF_ENDPOINT / HF_HOME.
"""

from __future__ import annotations

import hashlib
import http.client
import json
import random
import signal
import socket
import struct
import subprocess
import sys
from pathlib import Path

import pytest
from huggingface_hub import constants, hf_hub_download, snapshot_download
from huggingface_hub.errors import (
    GatedRepoError,
    RemoteEntryNotFoundError,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)

from tests.hub_standin import server as standin_server
from tests.hub_standin.server import Repo, git_blob_sha1, serving

TOKEN = "hf_standin_private_token"


@pytest.fixture(autouse=True)
def hub_env(tmp_path, monkeypatch):
    """Online, no Xet, no telemetry, and no token but what a test passes (none from HF_TOKEN or a token file)."""
    for name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_TOKEN", "HUGGING_FACE_HUB_TOKEN",
                 "HF_OIDC_RESOURCE", "HF_ENDPOINT"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HF_HUB_DISABLE_XET", "1")
    monkeypatch.setenv("HF_HUB_DISABLE_TELEMETRY", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf_home"))
    # Read at import time, so the environment alone would not reach them:
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(constants, "HF_HUB_DISABLE_XET", True)
    monkeypatch.setattr(constants, "HF_HUB_DISABLE_TELEMETRY", True)
    monkeypatch.setattr(constants, "HF_HUB_DISABLE_IMPLICIT_TOKEN", False)
    monkeypatch.setattr(constants, "HF_TOKEN_PATH", str(tmp_path / "hf_home" / "token"))


def safetensors_bytes(payload_size: int, seed: int = 7) -> bytes:
    """A valid-looking safetensors file: 8-byte header length, JSON header, then random 'weights'."""
    header = json.dumps({"__metadata__": {"format": "pt"},
                         "w": {"dtype": "U8", "shape": [payload_size], "data_offsets": [0, payload_size]}}).encode()
    header += b" " * (-len(header) % 8)
    return struct.pack("<Q", len(header)) + header + random.Random(seed).randbytes(payload_size)


def small_files(model_size: int = 200_000) -> dict:
    return {
        "config.json": json.dumps({"architectures": ["StandIn"], "hidden_size": 8}).encode(),
        "tokenizer.json": json.dumps({"version": "1.0", "model": {"vocab": {"a": 0, "b": 1}}}).encode(),
        "model.safetensors": safetensors_bytes(model_size),
        "sub/generation_config.json": b'{"max_new_tokens": 16}',
    }


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def repo_folder(cache: Path) -> Path:
    return cache.resolve() / "models--org--name"


def blob_of(snapshot: Path, rel: str) -> Path:
    link = snapshot / rel
    assert link.is_symlink(), f"{rel} is not a symlink into blobs/"
    return link.resolve()


def test_snapshot_at_commit_lands_in_cache_layout_and_second_run_fetches_nothing(tmp_path):
    files = small_files()
    repo = Repo("org/name", files)
    cache = tmp_path / "cache"
    with serving([repo]) as (server, endpoint):
        path = Path(snapshot_download("org/name", revision=repo.commit, cache_dir=cache, endpoint=endpoint))

        assert path == repo_folder(cache) / "snapshots" / repo.commit
        blobs = repo_folder(cache) / "blobs"
        for rel, content in files.items():
            blob = blob_of(path, rel)
            assert blob.parent == blobs
            expected = sha256(content) if repo.entries[rel].lfs else git_blob_sha1(content)
            assert blob.name == expected, rel
            assert blob.read_bytes() == content
        assert repo.entries["model.safetensors"].lfs and not repo.entries["config.json"].lfs
        for blob in blobs.iterdir():  # every blob hashes to its name, by one rule or the other
            data = blob.read_bytes()
            assert blob.name in (sha256(data), git_blob_sha1(data))
        assert not (repo_folder(cache) / "refs").exists()  # a commit revision writes no ref

        # What the client asked, the first time: one tree listing, a HEAD per file, the bytes.
        assert [r.path for r in server.requests("GET", "/api/")] == [f"/api/models/org/name/tree/{repo.commit}"]
        assert len(server.requests("HEAD", "/org/name/resolve/")) == len(files)
        assert {r.status for r in server.requests("HEAD", "/org/name/resolve/")} == {200, 302}
        cdn_gets = server.requests("GET", "/cdn/")
        assert [r.path for r in cdn_gets] == [f"/cdn/{sha256(files['model.safetensors'])}"]

        server.clear_log()
        again = snapshot_download("org/name", revision=repo.commit, cache_dir=cache, endpoint=endpoint)
        assert Path(again) == path
        assert server.requests("GET") == []  # no file GET; in fact nothing at all:
        assert server.request_log == []  # the tree listing is cached on disk, the pointers exist


def test_branch_revision_is_resolved_through_the_revision_endpoint(tmp_path):
    repo = Repo("org/name", small_files())
    cache = tmp_path / "cache"
    with serving([repo]) as (server, endpoint):
        path = snapshot_download("org/name", revision="main", cache_dir=cache, endpoint=endpoint)
        assert Path(path).name == repo.commit
        assert (repo_folder(cache) / "refs" / "main").read_text() == repo.commit
        assert server.requests("GET", "/api/")[0].path == "/api/models/org/name/revision/main"


def test_connection_cut_mid_lfs_file_is_resumed_with_range(tmp_path):
    """The client keeps what it had and asks for the rest with `Range: bytes=N-` (file_download.py http_get).
    It writes in chunks of constants.DOWNLOAD_CHUNK_SIZE (10 MiB; httpx2's ByteChunker holds back a partial
    chunk), so N is a multiple of it: the file here is 12 MiB, cut after 11 MiB."""
    chunk = constants.DOWNLOAD_CHUNK_SIZE
    files = {"config.json": b"{}", "model.safetensors": safetensors_bytes(12 * 1024 * 1024)}
    repo = Repo("org/name", files)
    cache = tmp_path / "cache"
    with serving([repo]) as (server, endpoint):
        server.cut_after_bytes = 11 * 1024 * 1024
        path = Path(snapshot_download("org/name", revision=repo.commit, cache_dir=cache, endpoint=endpoint))
        gets = server.requests("GET", "/cdn/")
        assert [(g.range, g.status) for g in gets] == [(None, 200), (f"bytes={chunk}-", 206)]
    blob = blob_of(path, "model.safetensors")
    assert blob.name == sha256(files["model.safetensors"])
    assert sha256(blob.read_bytes()) == blob.name


def test_connection_cut_within_the_first_chunk_restarts_without_range(tmp_path):
    """Cut before 10 MiB arrived: the client had written nothing (the partial chunk is dropped), so its retry
    is a whole GET again, without Range. The blob is whole all the same."""
    files = small_files()
    repo = Repo("org/name", files)
    cache = tmp_path / "cache"
    with serving([repo]) as (server, endpoint):
        server.cut_after_bytes = 50_000
        path = Path(snapshot_download("org/name", revision=repo.commit, cache_dir=cache, endpoint=endpoint))
        assert [(g.range, g.status) for g in server.requests("GET", "/cdn/")] == [(None, 200), (None, 200)]
    blob = blob_of(path, "model.safetensors")
    assert sha256(blob.read_bytes()) == blob.name == sha256(files["model.safetensors"])


def test_corrupted_cdn_bytes_are_accepted_by_the_client(tmp_path):
    """huggingface_hub checks only the size of what it downloads (http_get: expected_size against the
    bytes received), never the sha256 it names the blob after: a flipped byte lands in the cache under
    the right name. Refusing such a blob is the job of whoever copies it on (rigkit's copier)."""
    files = small_files()
    repo = Repo("org/name", files)
    cache = tmp_path / "cache"
    with serving([repo]) as (server, endpoint):
        server.corrupt_cdn_path = "model.safetensors"
        path = Path(snapshot_download("org/name", revision=repo.commit, cache_dir=cache, endpoint=endpoint))
    blob = blob_of(path, "model.safetensors")
    data = blob.read_bytes()
    assert blob.name == sha256(files["model.safetensors"])
    assert len(data) == len(files["model.safetensors"])
    assert sha256(data) != blob.name
    assert sum(a != b for a, b in zip(data, files["model.safetensors"])) == 1
    assert blob_of(path, "config.json").read_bytes() == files["config.json"]  # the rest is untouched


def test_unknown_revision_raises_revision_not_found(tmp_path):
    repo = Repo("org/name", small_files())
    with serving([repo]) as (server, endpoint):
        with pytest.raises(RevisionNotFoundError):
            snapshot_download("org/name", revision="0" * 40, cache_dir=tmp_path / "a", endpoint=endpoint)
        with pytest.raises(RevisionNotFoundError):
            snapshot_download("org/name", revision="no-such-branch", cache_dir=tmp_path / "b", endpoint=endpoint)
        assert [(r.path, r.status) for r in server.request_log] == [
            (f"/api/models/org/name/tree/{'0' * 40}", 404),
            ("/api/models/org/name/revision/no-such-branch", 404),
        ]
        with pytest.raises(RepositoryNotFoundError):
            snapshot_download("org/other", revision=repo.commit, cache_dir=tmp_path / "c", endpoint=endpoint)
        assert server.request_log[-1].status == 401


def test_unknown_file_raises_entry_not_found_and_is_remembered(tmp_path):
    repo = Repo("org/name", small_files())
    cache = tmp_path / "cache"
    with serving([repo]) as (_server, endpoint):
        with pytest.raises(RemoteEntryNotFoundError):
            hf_hub_download("org/name", "missing.txt", revision=repo.commit, cache_dir=cache, endpoint=endpoint)
    assert (repo_folder(cache) / ".no_exist" / repo.commit / "missing.txt").exists()  # from X-Repo-Commit


@pytest.mark.parametrize("cdn", ["same", "separate"])
def test_private_repo_needs_its_token_and_where_the_token_goes(tmp_path, cdn):
    """Without the token: the Hub's 401 RepoNotFound, which the client raises as RepositoryNotFoundError.
    With it: the download. The Authorization header goes to /api and /resolve; to the CDN only when the
    CDN is on the same origin: the client follows a same-origin redirect with the header (and reads the
    metadata from the CDN's answer), while for another origin it stops at the 302 and drops the header
    (file_download.py _get_metadata_or_catch_error, utils/_http.py _is_same_or_hub_host)."""
    files = small_files()
    repo = Repo("org/secret", files, private=True, token=TOKEN)
    with serving([repo], cdn=cdn) as (server, endpoint):
        for token in (None, "hf_wrong_token"):
            with pytest.raises((RepositoryNotFoundError, GatedRepoError)) as caught:
                snapshot_download("org/secret", revision=repo.commit, cache_dir=tmp_path / "anon",
                                  endpoint=endpoint, token=token)
            assert caught.value.response.status_code == 401
            assert caught.value.response.headers["X-Error-Code"] == "RepoNotFound"
        assert [(r.path, r.authorization, r.status) for r in server.request_log] == [
            (f"/api/models/org/secret/tree/{repo.commit}", False, 401),
            (f"/api/models/org/secret/tree/{repo.commit}", True, 401),
        ]
        server.clear_log()

        path = Path(snapshot_download("org/secret", revision=repo.commit, cache_dir=tmp_path / "authed",
                                      endpoint=endpoint, token=TOKEN))
        for rel, content in files.items():
            assert blob_of(path, rel).read_bytes() == content

        hub = [r for r in server.request_log if not r.path.startswith("/cdn/")]
        assert hub and all(r.authorization for r in hub)
        assert {r.path.split("/")[1] for r in hub} == {"api", "org"}
        cdn_requests = [(r.method, r.authorization, r.listener) for r in server.requests(path_prefix="/cdn/")]
        if cdn == "same":
            assert cdn_requests == [("HEAD", True, "cdn+hub"), ("GET", True, "cdn+hub")]
        else:
            assert cdn_requests == [("GET", False, "cdn")]


def test_tree_pagination_follows_link_headers(tmp_path):
    files = small_files()
    files.update({f"sub/shard-{i}.txt": f"shard {i}".encode() for i in range(4)})
    files["sub/deeper/notes.md"] = b"notes"
    repo = Repo("org/name", files)
    listing = repo.listing("", recursive=True)
    assert {item["path"] for item in listing if item["type"] == "directory"} == {"sub", "sub/deeper"}
    cache = tmp_path / "cache"
    with serving([repo]) as (server, endpoint):
        server.page_size = 2
        path = Path(snapshot_download("org/name", revision=repo.commit, cache_dir=cache, endpoint=endpoint))
        pages = server.requests("GET", "/api/")
        assert len(pages) == -(-len(listing) // 2)
        assert "cursor=" not in pages[0].query and all("cursor=" in p.query for p in pages[1:])
    for rel, content in files.items():
        assert blob_of(path, rel).read_bytes() == content


def test_lfs_by_name_or_size_and_git_ids():
    big = b"\0" * (10 * 1024 * 1024 + 1)
    repo = Repo("org/name", {"a.bin": b"x", "big.txt": big, "small.txt": b"x"})
    assert repo.entries["a.bin"].lfs and repo.entries["big.txt"].lfs and not repo.entries["small.txt"].lfs
    pointer = f"version https://git-lfs.github.com/spec/v1\noid sha256:{sha256(big)}\nsize {len(big)}\n".encode()
    assert repo.entries["big.txt"].tree_item() == {
        "type": "file", "oid": git_blob_sha1(pointer), "size": len(big), "path": "big.txt",
        "lfs": {"oid": sha256(big), "size": len(big), "pointerSize": len(pointer)},
    }
    assert repo.entries["small.txt"].blob_id == "c1b0730e0133447badcfd47fd144e254807b06e1"  # git hash-object of "x"
    assert Repo("org/name", {"a.bin": b"x", "big.txt": big, "small.txt": b"x"}).commit == repo.commit


def test_bounds_bad_paths_unknown_routes_and_methods():
    repo = Repo("org/name", small_files())
    with serving([repo]) as (server, endpoint):
        host, port = endpoint.removeprefix("http://").split(":")
        answers = []
        for method, target in [("GET", "/org/name/resolve/main/../config.json"),
                               ("GET", "/org/name/resolve/main/%2e%2e/config.json"),
                               ("GET", "/nothing/here"),
                               ("POST", "/api/models/org/name"),
                               ("GET", "/cdn/" + "0" * 64)]:
            conn = http.client.HTTPConnection(host, int(port), timeout=5)
            conn.request(method, target, body=b"ignored" if method == "POST" else None)
            response = conn.getresponse()
            response.read()
            answers.append(response.status)
            conn.close()
        assert answers == [400, 400, 404, 405, 403]  # the last: a CDN URL without a valid signature


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_script_mode_serves_a_folder_with_the_standard_library_only(tmp_path):
    """`python3 server.py --port P --repo ORG/NAME=FOLDER --private-token-file F` (run with -S: no
    site-packages, as in a container that has only python3), its CDN on a port of its own."""
    folder = tmp_path / "folder"
    for rel, content in small_files().items():
        (folder / rel).parent.mkdir(parents=True, exist_ok=True)
        (folder / rel).write_bytes(content)
    (tmp_path / "token").write_text(TOKEN + "\n")
    port, cdn_port = free_port(), free_port()
    proc = subprocess.Popen(
        [sys.executable, "-I", "-S", standin_server.__file__, "--port", str(port), "--cdn-port", str(cdn_port),
         "--repo", f"org/name={folder}", "--private-token-file", str(tmp_path / "token")],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    try:
        banner = proc.stdout.readline()
        assert banner.startswith(f"hub stand-in on http://127.0.0.1:{port}"), banner + proc.stdout.read()
        repo_line = proc.stdout.readline().split()
        assert repo_line[:2] == ["repo", "org/name"] and repo_line[-1] == "private"
        commit = repo_line[3]
        assert commit == Repo("org/name", small_files()).commit  # the same commit from the folder as from bytes
        path = Path(snapshot_download("org/name", revision=commit, cache_dir=tmp_path / "cache",
                                      endpoint=f"http://127.0.0.1:{port}", token=TOKEN))
        for rel, content in small_files().items():
            assert blob_of(path, rel).read_bytes() == content
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=10) == 0
