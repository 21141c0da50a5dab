"""Config validation: every kind of bad input is refused with file, line, field, value and what is allowed."""

from __future__ import annotations

from pathlib import Path

import pytest

from rigkit.config.errors import ConfigError
from rigkit.config.loader import load_model, load_rig

REPO = Path(__file__).resolve().parents[1]
CATALOG = REPO / "inventory" / "models"

GOOD_RIG = """\
os: linux
psu_w: 1200
system_w: 200
gpus:
  - index: 0
    model: RTX 4090
    power_limit_w: 330
    clock_lock_mhz: [0, 2200]
  - index: 1
    model: RTX 4090
    power_limit_w: 330
    clock_lock_mhz: 2200
"""


def write(tmp_path: Path, text: str, name: str = "rig.yml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def problems(tmp_path: Path, text: str) -> list[str]:
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as caught:
        load_rig(path, CATALOG)
    return [str(p) for p in caught.value.problems]


@pytest.mark.parametrize("rig", sorted((REPO / "inventory" / "rigs").glob("*.yml")), ids=lambda p: p.stem)
def test_shipped_rigs_and_their_models_validate(rig):
    config = load_rig(rig, CATALOG)
    assert config.spec.gpus


def test_good_rig_normalises_clock_lock(tmp_path):
    config = load_rig(write(tmp_path, GOOD_RIG), CATALOG)
    locks = [(g.clock_lock_mhz.floor_mhz, g.clock_lock_mhz.ceiling_mhz) for g in config.spec.gpus]
    assert locks == [(0, 2200), (0, 2200)]  # a bare ceiling means floor 0, so cards idle
    assert config.spec.psu_headroom_share == 0.20
    assert config.name == "rig"


def test_cap_outside_the_gpus_range(tmp_path):
    [msg] = problems(tmp_path, GOOD_RIG.replace("power_limit_w: 330\n    clock_lock_mhz: 2200", "power_limit_w: 700\n    clock_lock_mhz: 2200"))
    assert "rig.yml, line 11: gpus[1].power_limit_w: 700: 700 W is outside 150-600 W" in msg
    assert "RTX 4090" in msg


def test_floor_above_ceiling(tmp_path):
    [msg] = problems(tmp_path, GOOD_RIG.replace("[0, 2200]", "[2200, 0]"))
    assert "line 8: gpus[0].clock_lock_mhz: [2200, 0]: floor 2200 MHz is above ceiling 0 MHz" in msg


def test_unknown_key_names_the_allowed_keys(tmp_path):
    [msg] = problems(tmp_path, GOOD_RIG.replace("    power_limit_w: 330\n    clock_lock_mhz: 2200", "    power_limt_w: 330"))
    assert "line 11: gpus[1].power_limt_w: unknown key (a typo?)" in msg
    assert "allowed here: index, model, power_limit_w, clock_lock_mhz" in msg


def test_wrong_type_is_not_coerced(tmp_path):
    [msg] = problems(tmp_path, GOOD_RIG.replace("psu_w: 1200", 'psu_w: "1200"'))
    assert "line 2: psu_w: '1200': Input should be a valid integer" in msg


def test_os_names_the_allowed_values(tmp_path):
    [msg] = problems(tmp_path, GOOD_RIG.replace("os: linux", "os: macos"))
    assert "os: 'macos': Input should be 'linux' or 'windows'" in msg


def test_yaml_syntax_error_gives_the_line(tmp_path):
    [msg] = problems(tmp_path, GOOD_RIG.replace("  - index: 1\n", "  - index: 1\n   bad: [\n"))
    assert "rig.yml, line 10" in msg or "rig.yml, line 11" in msg
    assert "YAML syntax error" in msg


def test_duplicate_gpu_index(tmp_path):
    [msg] = problems(tmp_path, GOOD_RIG.replace("index: 1", "index: 0"))
    assert "gpus: " in msg and "GPU index 0 is listed more than once" in msg


def test_duplicate_yaml_key_is_not_silently_dropped(tmp_path):
    [msg] = problems(tmp_path, GOOD_RIG + "psu_w: 1600\n")
    assert "line 13: psu_w: key given twice (first on line 2)" in msg


def test_missing_field(tmp_path):
    [msg] = problems(tmp_path, GOOD_RIG.replace("system_w: 200\n", ""))
    assert "system_w: required field is missing" in msg


def test_every_problem_is_reported_at_once(tmp_path):
    found = problems(tmp_path, GOOD_RIG.replace("psu_w: 1200", "psu_w: -5").replace("os: linux", "os: bsd"))
    assert len(found) == 2


def test_unknown_model_in_rig_lists_the_catalog(tmp_path):
    [msg] = problems(tmp_path, GOOD_RIG + "models: [qwen-typo]\n")
    assert "models[0]: 'qwen-typo': no catalog file" in msg
    assert "qwen3-27b-awq" in msg


def test_model_catalog_refuses_unpinned_image(tmp_path):
    path = write(tmp_path, (CATALOG / "qwen3-27b-awq.yml").read_text().replace(":v0.11.0", ":latest"), "m.yml")
    with pytest.raises(ConfigError) as caught:
        load_model(path)
    assert "image: 'vllm/vllm-openai:latest': pin the image to a tag or digest" in str(caught.value)


def test_model_catalog_unknown_nested_key(tmp_path):
    text = (CATALOG / "qwen3-27b-awq.yml").read_text().replace("  kv_cache_dtype: fp8", "  kv_cache: fp8")
    with pytest.raises(ConfigError) as caught:
        load_model(write(tmp_path, text, "m.yml"))
    assert "vllm.kv_cache: unknown key" in str(caught.value)
    assert "kv_cache_dtype" in str(caught.value)


def test_rigkit_check_cli(tmp_path, capsys):
    from rigkit.cli import main

    assert main(["check", str(REPO / "inventory/rigs/sim.yml"), "--catalog", str(CATALOG)]) == 0
    bad = write(tmp_path, GOOD_RIG.replace("os: linux", "os: linx"))
    assert main(["check", str(bad), "--catalog", str(CATALOG)]) == 2
    assert "os: 'linx'" in capsys.readouterr().err


@pytest.mark.parametrize("value, always, never", [(None, False, False), ("after-changes", False, False),
                                                  ("always", True, False), ("never", False, True)])
def test_the_verify_switch_takes_three_values(value, always, never):
    from types import SimpleNamespace

    from rigkit.config.inventory import run_options
    options = run_options(SimpleNamespace(name="rig-1", data={"rigkit_verify": value} if value else {}))
    assert (options.verify_always, options.verify_never) == (always, never)


def test_a_misspelt_verify_switch_is_refused_with_the_allowed_values():
    from types import SimpleNamespace

    from rigkit.config.inventory import RigConfigError, run_options
    with pytest.raises(RigConfigError, match=r"rig-1: rigkit_verify is 'nevr'; allowed: after-changes, always, never"):
        run_options(SimpleNamespace(name="rig-1", data={"rigkit_verify": "nevr"}))
