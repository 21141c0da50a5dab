"""The compile cache shipped with the weights (rigkit/weights/compile_cache.py): what is shipped, where it fits,
and the two ends of its stream run here by the rig's `sh` and GNU tar on folders laid out as vLLM's cache root.
Nothing is simulated but the rigs' answers to the identity command (their text, as the rig prints it); the
shipping between two rigs is shown in tests/test_weights_relay_rigs.py."""

from __future__ import annotations

import subprocess

from rigkit.weights.compile_cache import identity_command, mismatch, parse_identity, receive_script, send_script, shipped_key

KEY = "3f9c2a7b1d"
H200 = "NVIDIA H200"


def identity(image="sha256:aa11", gpus=((0, H200, "570.86.15"), (1, H200, "570.86.15")), start=None) -> dict:
    lines = [f"image={image}"] + [f"gpu={i}, {name}, {driver}" for i, name, driver in gpus]
    if start is not None:
        lines.append("start=" + start)
    return parse_identity("\n".join(lines) + "\n")


def test_the_rigs_answer_is_read_whole_and_a_broken_table_is_no_table():
    found = identity(start='{"compile_cache": {"cache": "miss", "key": "3f9c2a7b1d"}}')
    assert found == {"image": "sha256:aa11", "gpus": {0: (H200, "570.86.15"), 1: (H200, "570.86.15")},
                     "start": {"compile_cache": {"cache": "miss", "key": KEY}}}
    assert identity(start='{"compile_cache": {"cac').get("start") is None
    assert parse_identity("image=\ngpu=No devices were found\n") == {"image": "", "gpus": {}, "start": None}
    assert "startup.json" in identity_command("vllm/vllm-openai:v0.32.0", "alpha")
    assert "startup.json" not in identity_command("vllm/vllm-openai:v0.32.0", None)


def test_only_a_key_a_start_used_is_shipped_and_only_a_key_that_is_a_key():
    assert shipped_key({"compile_cache": {"cache": "hit", "key": KEY}}) == KEY
    assert shipped_key({"compile_cache": {"cache": "miss", "key": KEY}}) == KEY  # compiled, and kept
    assert shipped_key({"compile_cache": {"cache": "none", "key": None}}) is None  # eager: nothing compiled
    assert shipped_key({"compile_cache": {"cache": "miss", "key": None}}) is None
    assert shipped_key({"compile_cache": {"cache": "hit", "key": "../../etc"}}) is None  # never a path
    assert shipped_key(None) is None


def test_graphs_go_only_where_image_gpu_model_and_driver_match_and_the_reason_names_the_difference():
    source = identity()
    assert mismatch([0], source, [1], identity(), "rig-a") is None  # another index, the same GPU model
    assert mismatch([0], source, [0], identity(image="sha256:bb22"), "rig-a") == \
        "the image differs (rig rig-a sha256:aa11, this rig sha256:bb22)"
    assert mismatch([0], source, [0], identity(image=""), "rig-a") == \
        "the image differs (rig rig-a sha256:aa11, this rig has none)"
    l40s = identity(gpus=((0, "NVIDIA L40S", "570.86.15"),))
    assert mismatch([0], source, [0], l40s, "rig-a") == "the GPUs differ (rig rig-a NVIDIA H200, this rig NVIDIA L40S)"
    assert mismatch([0, 1], source, [0, 1], identity(gpus=((0, H200, "570.86.15"),)), "rig-a") == \
        "the GPUs differ (rig rig-a NVIDIA H200, NVIDIA H200, this rig NVIDIA H200, ?)"
    newer = identity(gpus=((0, H200, "575.51.03"),))
    assert mismatch([0], source, [0], newer, "rig-a") == "the driver differs (rig rig-a 570.86.15, this rig 575.51.03)"


def cache_root(folder, key=KEY, aot=False):
    graphs = folder / "torch_compile_cache" / key / "rank_0_0" / "backbone"
    graphs.mkdir(parents=True)
    (graphs / "graph").write_bytes(b"g" * 5000)
    if aot:
        (folder / "torch_compile_cache" / "torch_aot_compile" / key / "rank_0_0").mkdir(parents=True)
        (folder / "torch_compile_cache" / "torch_aot_compile" / key / "rank_0_0" / "model").write_bytes(b"m")
    return folder


def stream(source, target, cut_at=None):
    """The send script in `source` piped to the receive script in `target` (optionally cut after `cut_at` bytes)."""
    sent = subprocess.run(["sh", "-c", send_script(KEY)], cwd=source, capture_output=True, timeout=60)
    data = sent.stdout if cut_at is None else sent.stdout[:cut_at]
    got = subprocess.run(["sh", "-c", receive_script(KEY)], cwd=target, input=data, capture_output=True, timeout=60)
    return sent, got


def test_a_whole_stream_lands_in_place_beside_what_the_cache_had_and_a_cut_one_leaves_nothing(tmp_path):
    source = cache_root(tmp_path / "a", aot=True)
    target = cache_root(tmp_path / "b", key="0123456789")  # the target's own graphs of another config
    sent, got = stream(source, target, cut_at=6000)
    assert sent.returncode == 0 and got.returncode != 0, got.stdout
    assert sorted(p.name for p in (target / "torch_compile_cache").iterdir()) == ["0123456789"]  # nothing half there
    sent, got = stream(source, target)
    assert got.returncode == 0 and got.stdout.decode().strip().splitlines()[-1].startswith("received-kib="), got
    assert (target / "torch_compile_cache" / KEY / "rank_0_0" / "backbone" / "graph").read_bytes() == b"g" * 5000
    assert (target / "torch_compile_cache" / "torch_aot_compile" / KEY / "rank_0_0" / "model").read_bytes() == b"m"
    assert (target / "torch_compile_cache" / "0123456789").is_dir()
    assert sorted(p.name for p in (target / "torch_compile_cache").iterdir()) == ["0123456789", KEY, "torch_aot_compile"]


def test_a_source_without_the_key_sends_nothing_and_says_so(tmp_path):
    (tmp_path / "a").mkdir()
    sent = subprocess.run(["sh", "-c", send_script(KEY)], cwd=tmp_path / "a", capture_output=True, timeout=60)
    assert sent.returncode == 3 and sent.stdout == b""
