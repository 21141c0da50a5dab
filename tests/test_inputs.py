"""Hostile and unlucky inputs refused before any rig is touched, with the file, field, value
and what is allowed. Pure: no rig, no Docker (one test runs the real Compose CLI's `config`,
which needs no engine). Simulates nothing."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
from pathlib import Path

import pytest
import yaml

from rigkit.cli import main
from rigkit.config.errors import ConfigError
from rigkit.config.loader import load_rig
from rigkit.plumbing.render import render
from rigkit.serving.api_key import SecretFileError, api_key_env_file, read_key_file
from tests.conftest import SERVING_RIG, TEST_CATALOG, copy_catalog

RULE = "names may use lowercase letters, digits, '-' and '_'"


def catalog_with(tmp_path: Path, name: str, text: str | None = None) -> Path:
    folder = copy_catalog(tmp_path)
    (folder / f"{name}.yml").write_text(text or (TEST_CATALOG / "test-alpha.yml").read_text())
    return folder


def rig_serving(tmp_path: Path, models: str, file_name: str = "rig.yml") -> Path:
    rig = tmp_path / file_name
    rig.write_text(SERVING_RIG.read_text().replace("models: [test-alpha, test-beta]", f"models: [{models}]"))
    return rig


@pytest.mark.parametrize("name", ["Llama-3.1-8B", "llama-3.1-8b", "a;b", "a b", "../x", "-x", "x" * 64, "é"])
def test_a_catalog_name_outside_the_name_rule_is_refused(tmp_path, name):
    rig = rig_serving(tmp_path, yaml.safe_dump([name], default_flow_style=True).strip()[1:-1])
    with pytest.raises(ConfigError) as refused:
        load_rig(rig, TEST_CATALOG)
    text = refused.value.render()
    assert f"{rig}, line" in text and "models[0]" in text and RULE in text


def test_the_error_suggests_a_name_that_follows_the_rule(tmp_path):
    with pytest.raises(ConfigError, match=r"for example 'llama-3-1-8b'"):
        load_rig(rig_serving(tmp_path, "Llama-3.1-8B"), TEST_CATALOG)


@pytest.mark.parametrize("served", ["Qwen/Qwen3-8B", "model 1", "smile\U0001f600", "x;reboot"])
def test_a_served_name_outside_the_rule_is_refused(tmp_path, served):
    text = (TEST_CATALOG / "test-alpha.yml").read_text().replace("vllm:\n", f"vllm:\n  served_model_name: {served!r}\n")
    folder = catalog_with(tmp_path, "test-alpha", text)
    with pytest.raises(ConfigError) as refused:
        load_rig(SERVING_RIG, folder)
    assert "vllm.served_model_name" in refused.value.render() and RULE in refused.value.render()


def test_rig_and_model_file_names_follow_the_rule(tmp_path):
    with pytest.raises(ConfigError, match="the rig's name is its file name"):
        load_rig(rig_serving(tmp_path, "test-alpha", "My Rig.yml"), TEST_CATALOG)


def test_an_image_tag_with_a_trailing_newline_is_refused(tmp_path):
    text = (TEST_CATALOG / "test-alpha.yml").read_text().replace(
        "image: rigkit-vllm-standin:sim", 'image: "rigkit-vllm-standin:sim\\n"')
    with pytest.raises(ConfigError, match="not a Docker image reference"):
        load_rig(SERVING_RIG, catalog_with(tmp_path, "test-alpha", text))


def test_a_non_utf8_rig_file_is_a_config_error(tmp_path):
    rig = tmp_path / "rig.yml"
    rig.write_bytes(b"os: linux\npsu_w: 1000 # \xff\n")
    with pytest.raises(ConfigError, match=r"line 2: not UTF-8 text \(byte 0xff"):
        load_rig(rig, TEST_CATALOG)


@pytest.mark.parametrize("text", ["a: " + "[" * 5000 + "]" * 5000, "a:\n" + "".join("  " * i + "b:\n" for i in range(1, 80))])
def test_deeply_nested_yaml_is_a_config_error(tmp_path, text):
    rig = tmp_path / "rig.yml"
    rig.write_text(text)
    with pytest.raises(ConfigError, match="nested"):
        load_rig(rig, TEST_CATALOG)


def test_check_reports_the_psu_budget_and_the_api_key_file_without_a_rig(tmp_path, capsys, monkeypatch):
    rig = tmp_path / "rigs" / "hot.yml"
    rig.parent.mkdir()
    rig.write_text(SERVING_RIG.read_text().replace("power_limit_w: 330", "power_limit_w: 600")
                   + f"api_key_file: {tmp_path / 'missing.key'}\n")
    shutil.copytree(TEST_CATALOG, tmp_path / "models")  # found beside rigs/, from any directory
    monkeypatch.chdir("/")
    assert main(["check", str(rig)]) == 2
    err = capsys.readouterr().err
    assert "PSU budget: GPU caps 600 + 600 W" in err
    assert f"api_key_file {tmp_path / 'missing.key'} does not exist" in err


@pytest.mark.parametrize("content, problem", [
    (b"", "is empty"),
    (b"a\nb\n", "one key on one line"),
    (b" padded\n", "starts or ends with a space"),
    (b"\xff\xfe", "not UTF-8"),
    ("sk-\u2018quoted\u2019\n".encode(), "outside ASCII"),
])
def test_a_bad_key_file_is_refused_with_the_reason(tmp_path, content, problem):
    key = tmp_path / "k"
    key.write_bytes(content)
    key.chmod(0o600)
    with pytest.raises(SecretFileError, match=problem):
        read_key_file(key, "api_key_file")


def test_a_key_file_readable_by_others_or_missing_is_refused(tmp_path):
    key = tmp_path / "k"
    with pytest.raises(SecretFileError, match="does not exist"):
        read_key_file(key, "api_key_file")
    key.write_text("k\n")
    key.chmod(0o640)
    with pytest.raises(SecretFileError, match="readable by others; run chmod 600"):
        read_key_file(key, "api_key_file")


def test_a_key_with_dollars_quotes_hashes_and_spaces_survives_compose_byte_for_byte(tmp_path):
    """The real Compose CLI reads the env file rigkit writes, as it will on the rig."""
    key = "s$k-'q' \"d\" #h ${HOME} `x` \\n end"
    key_file = tmp_path / "k"
    key_file.write_text(key + "\n")
    key_file.chmod(0o600)
    assert read_key_file(key_file, "api_key_file") == key
    env_file = tmp_path / "vllm-api-key.env"
    env_file.write_bytes(api_key_env_file(key))
    compose = render("serving/compose.yml.j2", **{
        "model_file": "m.yml", "project": "rigkit-k", "engine_service": "vllm", "image": "busybox:1", "command": ["x"],
        "environment": {"E": "\U0001f600 $x"}, "env_files": [{"path": str(env_file), "format": "raw"}],
        "mounts": [], "volumes": {}, "device_ids": ["0"], "windows_mount": False, "published": [], "memory_limit": None,
        "secrets": {}, "secret_mounts": [], "on_demand": False,
    })
    (tmp_path / "compose.yml").write_text(compose)
    out = subprocess.run(["docker", "compose", "-f", str(tmp_path / "compose.yml"), "config", "--format", "json"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    environment = yaml.safe_load(out.stdout)["services"]["vllm"]["environment"]
    # `config` prints $ doubled (re-escaped for interpolation); the container gets one $.
    assert environment["VLLM_API_KEY"].replace("$$", "$") == key
    assert environment["E"].replace("$$", "$") == "\U0001f600 $x"


def _rotation_rig(tmp_path: Path, sent: str, *others: str) -> Path:
    """A rig file whose api_key_file holds `sent` and whose accept_api_key_files hold `others`."""
    tmp_path.mkdir(exist_ok=True)
    paths = []
    for n, key in enumerate((sent, *others)):
        path = tmp_path / f"key-{n}"
        path.write_text(key + "\n")
        path.chmod(0o600)
        paths.append(str(path))
    rig = tmp_path / "rig.yml"
    rig.write_text(SERVING_RIG.read_text() + f"api_key_file: {paths[0]}\n"
                   + (f"accept_api_key_files: {paths[1:]}\n" if others else ""))
    return rig


def test_keys_accepted_during_a_rotation_reach_vllm_as_its_config_file_and_a_swap_changes_nothing(tmp_path):
    """What the servers take during a rotation: every key, sorted, as `vllm serve --config` reads it, through a
    Compose secret the real Compose CLI accepts; the compose file holds no key and no env file. Swapping the key
    rigkit sends with the one accepted beside it changes neither file, so no server restarts."""
    from rigkit.rigside.keyfile import compose_env
    from rigkit.rigside.names import ACCEPTED_KEYS_ENV
    from rigkit.serving.api_key import accepted_keys_config, read_accepted_keys, read_api_key
    from rigkit.serving.compose import ACCEPTED_KEYS_SECRET, render_compose

    old, new = "sk-old $x #1", "sk-new-2"
    rig = load_rig(_rotation_rig(tmp_path / "a", old, new), TEST_CATALOG)
    keys = read_accepted_keys(rig, read_api_key(rig))
    assert keys == sorted([old, new]) and yaml.safe_load(accepted_keys_config(keys)) == {"api-key": keys}
    swapped = load_rig(_rotation_rig(tmp_path / "b", new, old), TEST_CATALOG)
    assert accepted_keys_config(read_accepted_keys(swapped, read_api_key(swapped))) == accepted_keys_config(keys)
    compose = render_compose(rig.models[0], True, accepted_keys=True)
    assert compose == render_compose(swapped.models[0], True, accepted_keys=True)
    assert old not in compose and new not in compose
    (tmp_path / "compose.yml").write_text(compose)
    keys_file = tmp_path / "vllm-api-keys.yaml"
    keys_file.write_bytes(accepted_keys_config(keys))
    out = subprocess.run(["docker", "compose", "-f", str(tmp_path / "compose.yml"), "config", "--format", "json"],
                         capture_output=True, text=True, timeout=60, env=compose_env(str(keys_file)))
    assert out.returncode == 0, out.stderr
    config = yaml.safe_load(out.stdout)
    service = config["services"]["vllm"]
    assert service["command"][-2:] == ["--config", f"/run/secrets/{ACCEPTED_KEYS_SECRET}"]
    [mount] = service["secrets"]
    assert mount["target"] == ACCEPTED_KEYS_SECRET and mount["mode"] in ("0400", 0o400) and "env_file" not in service
    assert config["secrets"][mount["source"]]["environment"] == ACCEPTED_KEYS_ENV  # copied in, not bind-mounted
    assert "VLLM_API_KEY" not in service["environment"]


@pytest.mark.parametrize("others, problem", [
    (("sk-same",), "holds a key listed already"),
    (("sk-b", "sk-b"), "holds a key listed already"),
    (("-sk-dash",), "starts with '-', which vLLM would read as an option"),
])
def test_a_rotation_s_bad_key_is_refused_with_the_reason(tmp_path, others, problem):
    from rigkit.serving.api_key import read_accepted_keys, read_api_key

    rig = load_rig(_rotation_rig(tmp_path, "sk-same", *others), TEST_CATALOG)
    with pytest.raises(SecretFileError, match=problem):
        read_accepted_keys(rig, read_api_key(rig))


def test_keys_accepted_beside_none_sent_are_refused_before_any_rig(tmp_path):
    key = tmp_path / "k"
    key.write_text("sk-k\n")
    key.chmod(0o600)
    rig = tmp_path / "rig.yml"
    rig.write_text(SERVING_RIG.read_text() + f"accept_api_key_files: [{key}]\n")
    with pytest.raises(ConfigError, match="accept_api_key_files.*need api_key_file, the one rigkit sends"):
        load_rig(rig, TEST_CATALOG)


def test_docker_api_forward_is_a_socket_only_its_user_can_open():
    from rigkit.plumbing.ssh_forward import forward_docker

    with forward_docker(transport=None) as path:
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
        assert stat.S_IMODE(os.stat(os.path.dirname(path)).st_mode) == 0o700
        assert stat.S_ISSOCK(os.stat(path).st_mode)
    assert not os.path.exists(path)



def test_deploy_refuses_an_inventory_file_that_is_not_there(capsys):
    """pyinfra would take the missing file's name for a host name and report success on zero rigs."""
    assert main(["deploy", "inventory/no-such-rigs.py"]) == 2
    assert "rigkit deploy: inventory/no-such-rigs.py: no such inventory file" in capsys.readouterr().err
    assert main(["verify", "inventory/no-such-rigs.py"]) == 2


def test_deploy_dry_keeps_pyinfra_s_change_detection(monkeypatch):
    """`-y` skips pyinfra's prompt and, with it, the change table a dry run is for."""
    from rigkit.plumbing import pyinfra_command
    from rigkit.preflight import inventory_check

    asked = []
    monkeypatch.setattr(pyinfra_command, "run_here", lambda argv, command: asked.append(argv) or 0)
    # the offline checks before pyinfra (tests/test_hostile_inputs.py) need the rig's SSH key; not this test
    monkeypatch.setattr(inventory_check, "reached_rigs", lambda *args, **kwargs: ["sim-rig"])
    assert main(["deploy", "--dry", "inventory/sim.py"]) == 0
    assert main(["deploy", "inventory/sim.py"]) == 0
    assert asked == [["--dry", "inventory/sim.py", "deploy.py"], ["-y", "inventory/sim.py", "deploy.py"]]
