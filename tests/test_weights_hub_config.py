"""`weights.hub` and `hub_token_file` as `rigkit check` reads them: the real CLI on the test rig file and a
catalog copied with one change. Nothing is simulated: no rig is reached and no hub is asked."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from rigkit.config.schema import WeightsSpec
from tests.conftest import DATA, REPO

COMMIT = "0123456789abcdef0123456789abcdef01234567"
FOLDER = "  source: /srv/rigkit-sim-models/test-alpha\n"


def check(catalog, rig_file=DATA / "rigs" / "serving.yml") -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "rigkit.cli", "check", str(rig_file), "--catalog", str(catalog)],
                          cwd=REPO, capture_output=True, text=True, timeout=60)


def test_a_hub_source_is_its_snapshot_folder_in_the_rigs_cache():
    weights = WeightsSpec.model_validate({"hub": {"repo": "Qwen/Qwen3-8B", "revision": COMMIT}})
    assert weights.source == f"/var/lib/rigkit/hub/models--Qwen--Qwen3-8B/snapshots/{COMMIT}"
    assert str(weights.hub) == "hub Qwen/Qwen3-8B@0123456789ab" and weights.hub.endpoint == "https://huggingface.co"


@pytest.mark.parametrize("hub, message", [
    ("{repo: Qwen/Qwen3-8B, revision: main}", "weights.hub.revision"),
    (f"{{repo: Qwen/Qwen3--8B, revision: {COMMIT}}}", "may not contain '--' or '..'"),
    (f"{{repo: 'Qwen/Qwen3 8B; rm -rf /', revision: {COMMIT}}}", "weights.hub.repo"),
    (f"{{repo: Qwen/Qwen3-8B, revision: {COMMIT}, endpoint: 'file:///etc'}}", "weights.hub.endpoint"),
    (f"{{repo: Qwen/Qwen3-8B, revision: {COMMIT}, cache: /var/lib/../../etc}}", "without '.', '..' or '//'"),
    (f"{{repo: Qwen/Qwen3-8B, revision: {COMMIT}, cache: /var/lib/docker/volumes}}", "a folder of the system or of "
     "Docker's own"),
    (f"{{repo: Qwen/Qwen3-8B, revision: {COMMIT}, cache: /}}", "give a folder's own absolute path below /"),
    (f"{{repo: Qwen/Qwen3-8B.git, revision: {COMMIT}}}", "or end in '.git'"),
], ids=["branch", "double-dash", "shell", "endpoint", "dotdot-cache", "docker-cache", "root-cache", "dot-git"])
def test_rigkit_check_refuses_a_hub_source_the_hub_or_a_shell_would_not_take(tmp_path, hub, message):
    from tests.conftest import copy_catalog

    proc = check(copy_catalog(tmp_path, test_alpha=[(FOLDER, f"  hub: {hub}\n")]))
    assert proc.returncode != 0 and message in proc.stderr, proc.stderr
    assert "test-alpha.yml" in proc.stderr and "Traceback" not in proc.stderr


def test_a_hub_source_beside_a_folder_is_refused(tmp_path):
    from tests.conftest import copy_catalog

    proc = check(copy_catalog(tmp_path, test_alpha=[(FOLDER, f"{FOLDER}  hub: {{repo: a/b, revision: {COMMIT}}}\n")]))
    assert proc.returncode != 0, proc.stderr
    assert "give either source (a folder, or {rig: NAME}) or hub ({repo, revision}), not both" in proc.stderr, proc.stderr


def test_a_hub_source_on_a_bind_mount_is_refused(tmp_path):
    from tests.conftest import copy_catalog

    proc = check(copy_catalog(tmp_path, test_alpha=[(FOLDER, f"  hub: {{repo: a/b, revision: {COMMIT}}}\n  storage: bind\n")]))
    assert proc.returncode != 0, proc.stderr
    assert "weights from the hub are proven by their copy onto a volume; use storage: volume" in proc.stderr, proc.stderr


def test_a_hub_token_file_others_can_read_is_refused_and_a_private_one_taken(tmp_path):
    from tests.conftest import copy_catalog

    catalog = copy_catalog(tmp_path, test_alpha=[(FOLDER, f"  hub: {{repo: a/b, revision: {COMMIT}}}\n")])
    token = tmp_path / "hf-token"
    token.write_text("hf_secretsecretsecret\n")
    os.chmod(token, 0o644)
    rig_file = tmp_path / "serving.yml"
    rig_file.write_text((DATA / "rigs" / "serving.yml").read_text() + f"hub_token_file: {token}\n")
    proc = check(catalog, rig_file)
    assert proc.returncode != 0 and f"hub_token_file {token} is readable by others; run chmod 600 {token}" in proc.stderr
    assert "hf_secret" not in proc.stdout + proc.stderr
    os.chmod(token, 0o600)
    proc = check(catalog, rig_file)
    assert proc.returncode == 0, proc.stderr
    assert "hf_secret" not in proc.stdout + proc.stderr
    # The token would cross the network in clear to an http endpoint that is not the rig's own loopback.
    plain = copy_catalog(tmp_path / "plain", test_alpha=[(FOLDER, f"  hub: {{repo: a/b, revision: {COMMIT}, "
                                                                  "endpoint: 'http://mirror.lan:8080'}\n")])
    proc = check(plain, rig_file)
    assert proc.returncode != 0 and "would cross the network unencrypted: use https" in proc.stderr, proc.stderr


def test_a_hub_model_not_downloaded_yet_is_judged_from_what_the_hub_says(tmp_path):
    """Also simulated here: the Hub (tests/hub_standin on 127.0.0.1), answering the controller's own read.
    A Llama-3.1-8B-shaped config.json at a 262144-token context: one sequence's KV cache (32 GiB) cannot fit a
    4090, and the shards the index names (not the consolidated copy beside them) are the weights counted."""
    import json as json_

    from rigkit.config.loader import load_rig
    from rigkit.fit.check import model_fit
    from rigkit.fit.hub_read import HubReadError, hub_answer
    from tests.conftest import copy_catalog
    from tests.hub_standin.server import Repo, serving

    config = {"num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8, "hidden_size": 4096,
              "torch_dtype": "bfloat16", "max_position_embeddings": 262144}
    shards = {f"model-0000{n}-of-00002.safetensors": bytes([n]) * (300_000 + n) for n in (1, 2)}
    index = {"weight_map": {"a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"}}
    files = {"config.json": json_.dumps(config).encode(), "model.safetensors.index.json": json_.dumps(index).encode(),
             "consolidated.safetensors": b"x" * 500_000, **shards}
    repo = Repo("rigkit-test/llama-shaped", files, private=True, token="hf_right")
    with serving([repo], cdn="separate") as (hub, endpoint):
        hub.page_size = 2  # the listing's pages are followed
        catalog = copy_catalog(tmp_path, test_alpha=[(FOLDER, f"  hub: {{repo: rigkit-test/llama-shaped, revision: "
                                                              f"{repo.commit}, endpoint: '{endpoint}'}}\n")])
        rig = load_rig(DATA / "rigs" / "serving.yml", catalog)
        model = rig.models[0]
        with pytest.raises(HubReadError, match=r"refused \(401\)"):
            hub_answer(model.name, model.spec.weights.hub, "hf_wrong")
        answer = hub_answer(model.name, model.spec.weights.hub, "hf_right")
        assert not hub.requests("GET", "/cdn/")  # config.json and the index are git files: no weights were fetched
    assert answer["weights_bytes"] == 600_003 and answer["config"]["max_position_embeddings"] == 262144
    found = model_fit(model, rig, answer, {0: 24564, 1: 24564})
    assert found.problems and "one sequence of its own context (max_model_len unset) 262144 needs 32.0 GiB of KV " \
        "cache per GPU" in found.problems[0], found.problems


def test_what_a_hostile_hub_sends_the_fits_read_bounds_and_the_token_goes_nowhere_else(tmp_path):
    """Simulated: a hostile hub (a small HTTP server on 127.0.0.1): a listing whose next page is on another
    host (127.0.0.2 here), a config.json without end. Real: rigkit.fit.hub_read's httpx client."""
    import http.server
    import threading

    from rigkit.config.schema import HubSource
    from rigkit.fit.hub_read import PAGE_MAX_BYTES, HubReadError, hub_answer

    seen = []

    class Hostile(http.server.BaseHTTPRequestHandler):
        def log_message(self, *_):
            pass

        def do_GET(self):
            seen.append((self.server.server_address[0], self.path, self.headers.get("Authorization")))
            self.send_response(200)
            if "/tree/" in self.path and self.server.server_address[0] == "127.0.0.1" and "page=2" not in self.path:
                self.send_header("Link", f'<http://127.0.0.2:{other.server_address[1]}{self.path}&page=2>; rel="next"')
                body = b'[{"type": "file", "path": "config.json", "size": 10}]'
            else:
                body = b"[" + b" " * (PAGE_MAX_BYTES + 10) + b"]"
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Hostile)
    other = http.server.ThreadingHTTPServer(("127.0.0.2", 0), Hostile)
    for s in (server, other):
        threading.Thread(target=s.serve_forever, daemon=True).start()
    try:
        hub = HubSource(repo="a/b", revision=COMMIT, endpoint=f"http://127.0.0.1:{server.server_address[1]}")
        with pytest.raises(HubReadError, match=r"its next page is on another host \(127\.0\.0\.2\)"):
            hub_answer("m", hub, "hf_secret_token")
        assert [host for host, _, _ in seen] == ["127.0.0.1"]  # nothing, the token least, went to the other host
        seen.clear()
        hub = HubSource(repo="a/b", revision=COMMIT, endpoint=f"http://127.0.0.2:{other.server_address[1]}")
        with pytest.raises(HubReadError, match="the file listing: more than"):
            hub_answer("m", hub, None)
    finally:
        for s in (server, other):
            s.shutdown()
            s.server_close()


def test_the_download_refuses_a_snapshot_file_no_hash_would_prove(tmp_path):
    """The download's own script (rigkit.weights.hub.SCRIPT), run here by this machine's python with the real
    huggingface_hub 2.4.0, as the serving image runs it. Simulated: the Hub (tests/hub_standin on 127.0.0.1).
    A file of the snapshot replaced by a copy of itself (a cache where links could not be made, or a file put
    by hand) is refused: the copier would have proven it against nothing."""
    import json as json_
    import shutil

    from rigkit.weights.hub import SCRIPT
    from tests.hub_standin.server import Repo, serving

    files = {"config.json": b'{"model_type": "standin"}', "model.safetensors": b"\0" * 4096}
    repo = Repo("rigkit-test/tiny", files, private=True, token="hf_right")
    cache, token = tmp_path / "hub", tmp_path / "token"

    def download(endpoint):
        token.write_text("hf_right\n")
        env = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}
        env.update(HF_ENDPOINT=endpoint, HF_HUB_DISABLE_TELEMETRY="1", HF_HUB_DISABLE_SHARED_BLOBS="1")
        proc = subprocess.run([sys.executable, "-c", SCRIPT, repo.repo_id, repo.commit, str(cache), str(token),
                               "/var/lib/rigkit/hub"],
                              env=env, capture_output=True, text=True, timeout=60)
        return proc.returncode, json_.loads(proc.stdout.strip().splitlines()[-1]), proc.stdout + proc.stderr

    with serving([repo], cdn="separate") as (hub, endpoint):
        code, report, said = download(endpoint)
        assert code == 0 and report["status"] == "ok" and report["files"] == 2, said
        assert not token.exists()  # read once and removed
        assert "hf_right" not in said
        snapshot = cache / "models--rigkit-test--tiny" / "snapshots" / repo.commit
        weights = snapshot / "model.safetensors"
        real = weights.resolve()
        weights.unlink()
        shutil.copyfile(real, weights)
        code, report, said = download(endpoint)
    assert code != 0 and report["status"] == "error", said
    assert report["error"] == ("the snapshot is not the hub's commit: model.safetensors: not a link to a blob named by "
                               "its hash (nothing would prove it)"), report


def test_the_download_refuses_to_fill_the_caches_disk_before_it_takes_a_byte(tmp_path):
    """The download's own script, as above, with its cache on a 16 MiB tmpfs mounted in a mount namespace of its
    own (`unshare -m`: this machine's mounts are not touched). Simulated: the Hub (tests/hub_standin)."""
    import json as json_
    import shutil

    from rigkit.weights.hub import SCRIPT
    from tests.hub_standin.server import Repo, serving

    if shutil.which("unshare") is None or os.geteuid() != 0:
        pytest.fail("needs root and unshare(1), as ./run test has them")
    repo = Repo("rigkit-test/tiny", {"config.json": b"{}", "model.safetensors": b"\0" * 4 * 1024 * 1024})
    cache = tmp_path / "small-disk"
    cache.mkdir()
    with serving([repo], cdn="separate") as (hub, endpoint):
        env = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}
        env.update(HF_ENDPOINT=endpoint, HF_HUB_DISABLE_TELEMETRY="1", HF_HUB_DISABLE_SHARED_BLOBS="1")
        proc = subprocess.run(["unshare", "-m", "sh", "-c", 'mount -t tmpfs -o size=16m none "$1" && shift && exec "$@"',
                               "sh", str(cache), sys.executable, "-c", SCRIPT, repo.repo_id, repo.commit, str(cache),
                               str(tmp_path / "no-token"), "/var/lib/rigkit/hub"],
                              env=env, capture_output=True, text=True, timeout=60)
        fetched = hub.requests("GET", "/cdn/")
    assert proc.returncode == 5, proc.stdout + proc.stderr
    report = json_.loads(proc.stdout.strip().splitlines()[-1])
    assert report["error"].startswith("the rig's cache /var/lib/rigkit/hub has 0.02 GB free; the download needs 0.00 GB "
                                      "more and 1 GB to spare"), report
    assert fetched == []  # not a byte of the weights asked for
