"""The compile cache shipped with the weights (rigkit/weights/compile_cache.py): what is shipped, where it fits,
and the two ends of its stream run here by the rig's `sh` and GNU tar on folders laid out as vLLM's cache root.
Nothing is simulated but the rigs' answers to the identity command (their text, as the rig prints it); the
shipping between two rigs is shown in tests/test_weights_relay_rigs.py."""

from __future__ import annotations

import subprocess

from rigkit.weights.compile_cache import (commit_script, identity_command, image_mismatch, mismatch, parse_identity,
                                          receive_script, send_script, shipped_paths)

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


AOT = f"torch_compile_cache/torch_aot_compile/{'ab' * 32}"
GRAPHS = f"torch_compile_cache/{KEY}"


def test_only_the_folders_a_start_used_are_shipped_and_only_names_that_are_cache_keys():
    assert shipped_paths({"compile_cache": {"cache": "hit", "key": KEY, "paths": [AOT, GRAPHS]}}) == [GRAPHS, AOT]
    assert shipped_paths({"compile_cache": {"cache": "miss", "key": KEY, "paths": [GRAPHS]}}) == [GRAPHS]  # compiled, kept
    assert shipped_paths({"compile_cache": {"cache": "none", "key": None, "paths": []}}) == []  # eager: nothing compiled
    assert shipped_paths({"compile_cache": {"cache": "hit", "key": KEY}}) == []  # a table from before paths were kept
    assert shipped_paths({"compile_cache": {"cache": "hit", "paths": ["torch_compile_cache/../../etc", "/etc/x",
                                                                      f"{GRAPHS}/../x", 7]}}) == []  # never a path out
    assert shipped_paths(None) == []


def test_graphs_go_only_where_image_gpu_model_and_driver_match_and_the_reason_names_the_difference():
    source = identity()
    assert mismatch([0], source, [1], identity(), "rig-a") is None  # another index, the same GPU model
    assert image_mismatch(source, identity(), "rig-a") is None
    assert image_mismatch(source, identity(image="sha256:bb22"), "rig-a") == \
        "the image differs (rig rig-a sha256:aa11, this rig sha256:bb22)"
    assert image_mismatch(source, identity(image=""), "rig-a") == \
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
        (folder / AOT / "rank_0_0").mkdir(parents=True)
        (folder / AOT / "rank_0_0" / "model").write_bytes(b"m")
    return folder


def stream(source, target, paths, cut_at=None):
    """The send script in `source` piped to the receive script in `target` (optionally cut after `cut_at` bytes)."""
    sent = subprocess.run(["sh", "-c", send_script(paths)], cwd=source, capture_output=True, timeout=60)
    data = sent.stdout if cut_at is None else sent.stdout[:cut_at]
    got = subprocess.run(["sh", "-c", receive_script()], cwd=target, input=data, capture_output=True, timeout=60)
    return sent, got


def commit(target, paths):
    return subprocess.run(["sh", "-c", commit_script(paths)], cwd=target, capture_output=True, timeout=60)


def test_a_whole_stream_lands_in_place_only_when_committed_and_a_cut_one_leaves_nothing(tmp_path):
    source = cache_root(tmp_path / "a", aot=True)
    target = cache_root(tmp_path / "b", key="0123456789")  # the target's own graphs of another config
    sent, got = stream(source, target, [GRAPHS, AOT], cut_at=6000)
    assert sent.returncode == 0 and got.returncode != 0, got.stdout
    assert sorted(p.name for p in (target / "torch_compile_cache").iterdir()) == ["0123456789"]  # nothing half there
    assert commit(target, [GRAPHS, AOT]).returncode != 0  # nothing received: nothing to move
    sent, got = stream(source, target, [GRAPHS, AOT])
    assert got.returncode == 0 and got.stdout.decode().strip().splitlines()[-1].startswith("received-kib="), got
    assert not (target / GRAPHS).exists()  # received beside the cache, not yet in it
    done = commit(target, [GRAPHS, AOT])
    assert done.returncode == 0 and done.stdout.decode().strip() == "committed", done
    assert (target / GRAPHS / "rank_0_0" / "backbone" / "graph").read_bytes() == b"g" * 5000
    assert (target / AOT / "rank_0_0" / "model").read_bytes() == b"m"
    assert sorted(p.name for p in (target / "torch_compile_cache").iterdir()) == ["0123456789", KEY, "torch_aot_compile"]


def test_a_source_without_one_of_the_folders_sends_nothing_and_says_so(tmp_path):
    source = cache_root(tmp_path / "a")  # the graphs, not the AOT function
    sent = subprocess.run(["sh", "-c", send_script([GRAPHS, AOT])], cwd=source, capture_output=True, timeout=60)
    assert sent.returncode == 3 and sent.stdout == b""
