"""Serving-config checks and compose rendering: pure functions, plus real `docker compose config`."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml

from rigkit.config.errors import ConfigError
from rigkit.config.loader import load_rig
from rigkit.serving.compose import render_compose, vllm_args
from tests.conftest import REPO, SERVING_RIG, TEST_CATALOG, copy_catalog


def alpha_with(tmp_path, *replacements, append=""):
    folder = copy_catalog(tmp_path, test_alpha=list(replacements))
    if append:
        (folder / "test-alpha.yml").write_text((folder / "test-alpha.yml").read_text() + append)
    return folder


def errors_for(catalog) -> str:
    with pytest.raises(ConfigError) as caught:
        load_rig(SERVING_RIG, catalog)
    return str(caught.value)


def warnings_for(catalog) -> list[str]:
    return list(load_rig(SERVING_RIG, catalog).warnings)


def test_good_catalog_has_no_errors_and_no_warnings():
    assert warnings_for(TEST_CATALOG) == []


@pytest.mark.parametrize(
    "replacements, append, expected",
    [
        ([("dtype: bfloat16", "dtype: half")], "", "vllm.dtype: 'half': half precision with speculative decoding"),
        ([("dtype: bfloat16", "dtype: float16")], "", "a bfloat16 drafter then accepts nothing"),
        ([("gpus: [0]", "gpus: [5]")], "", "gpus: [5]: GPU(s) [5] are not in"),
        ([("gpus: [0]", "gpus: [0, 1]")], "", "tensor 1 x pipeline 1 x data 1 = 1, but the service has 2 GPU(s)"),
        ([("port: 18101", "port: 18102")], "", "port: 18102: port 18102 is also used by test-alpha"),
        ([("gpus: [0]", "gpus: [1]")], "", "GPU(s) [1] are also used by test-alpha"),
        ([], "  extra_args: [--max-num-seq, '8']\n", "vllm.extra_args[0]: '--max-num-seq': not a `vllm serve` option"),
        ([], "  extra_args: ['--dtype=half']\n", "rigkit renders --dtype itself: set vllm.dtype instead"),
    ],
    ids=["half-with-spec", "float16-with-spec", "missing-gpu", "parallel-product", "same-port", "same-gpu",
         "unknown-option", "first-class-option"],
)
def test_each_error_fires_on_its_bad_input(tmp_path, replacements, append, expected):
    if append:
        replacements = [*replacements, ("  speculative:", append + "  speculative:")]
        append = ""
    assert expected in errors_for(alpha_with(tmp_path, *replacements, append=append))


def test_shared_gpus_must_be_explicit_on_both(tmp_path):
    folder = alpha_with(tmp_path, ("gpus: [0]", "gpus: [1]"), append="shared_gpus: true\n")
    assert "also used by test-alpha" in errors_for(folder)
    beta = (folder / "test-beta.yml").read_text() + "shared_gpus: true\n"
    (folder / "test-beta.yml").write_text(beta)
    load_rig(SERVING_RIG, folder)


@pytest.mark.parametrize(
    "replacements, expected",
    [
        ([("  dtype: bfloat16", "  dtype: bfloat16\n  enforce_eager: true")], "--enforce-eager disables CUDA graphs"),
        ([("  source: /srv/rigkit-sim-models/test-alpha", "  source: 'C:\\models\\alpha'\n  storage: bind")],
         "bind-mounted from Windows path C:\\models\\alpha"),
        ([("  source: /srv/rigkit-sim-models/test-alpha", "  source: /mnt/d/models/alpha\n  storage: bind"),
          ("  dtype: bfloat16", "  dtype: bfloat16\n  safetensors_load_strategy: lazy")], "use prefetch (1028 s -> 756 s)"),
        ([("gpus: [0]", "gpus: [0, 1]\nshared_gpus: true\nparallel: {tensor: 2}\nweight_bytes: 8000000000")],
         "tensor parallel 2 for 7.5 GiB of weights that fit on one 24 GiB card"),
        ([("  dtype: bfloat16", "  dtype: bfloat16\n  gpu_memory_utilization: 0.97")], "gpu_memory_utilization 0.97 leaves under 5%"),
    ],
    ids=["enforce-eager", "windows-bind", "windows-bind-not-prefetch", "tp-that-fits", "memory-utilisation"],
)
def test_each_warning_fires_on_its_input(tmp_path, replacements, expected):
    folder = alpha_with(tmp_path, *replacements)
    if "shared_gpus" in replacements[0][1]:
        (folder / "test-beta.yml").write_text((folder / "test-beta.yml").read_text() + "shared_gpus: true\n")
    if "C:\\" in replacements[0][1]:  # a Windows folder is a source only on a Windows rig (Docker Desktop)
        rig = tmp_path / "windows.yml"
        text = SERVING_RIG.read_text().replace("os: linux", "os: windows")
        rig.write_text(text[:text.index("base:")] if "base:" in text else text)  # base is Linux-only
        found = list(load_rig(rig, folder).warnings)
    else:
        found = warnings_for(folder)
    assert any(expected in w for w in found), found


def test_fp8_weights_on_ampere_warn(tmp_path):
    rig = tmp_path / "ampere.yml"
    rig.write_text(SERVING_RIG.read_text().replace("RTX 4090", "RTX 3090").replace("power_limit_w: 330", "power_limit_w: 250"))
    folder = alpha_with(tmp_path, ("  dtype: bfloat16", "  dtype: bfloat16\n  quantization: fp8"))
    found = load_rig(rig, folder).warnings
    assert any("FP8 weights on Ampere run as W8A16" in w for w in found), found
    assert not any("FP8" in w for w in load_rig(SERVING_RIG, folder).warnings)  # Ada has FP8


def test_bind_mount_gets_prefetch_and_volume_does_not():
    rig = load_rig(REPO / "inventory/rigs/win-2x4090-48gb.yml", REPO / "inventory/models")
    [model] = rig.models
    assert "--safetensors-load-strategy" not in vllm_args(model)  # on a volume
    bound = model.spec.model_copy(update={"weights": model.spec.weights.model_copy(update={"storage": "bind"})})
    args = vllm_args(type(model)(model.name, bound, model.file))
    assert args[args.index("--safetensors-load-strategy") + 1] == "prefetch"


def test_compose_quotes_values_and_doubles_dollars(tmp_path):
    folder = alpha_with(tmp_path, ("  dtype: bfloat16", "  dtype: bfloat16\n  extra_args: ['--chat-template', '$HOME/t: x\"y']"))
    model = next(m for m in load_rig(SERVING_RIG, folder).models if m.name == "test-alpha")
    parsed = yaml.safe_load(render_compose(model, with_api_key=True))
    service = parsed["services"]["vllm"]
    assert service["command"][-1] == '$$HOME/t: x"y'  # compose turns $$ back into $
    assert service["command"][0] == "/models/test-alpha"
    # raw: Compose neither interpolates nor unquotes the key file.
    assert service["env_file"] == [{"path": "/etc/rigkit/secrets/vllm-api-key.env", "format": "raw"}]
    assert "VLLM_API_KEY" not in render_compose(model, with_api_key=True)
    assert service["deploy"]["resources"]["reservations"]["devices"][0]["device_ids"] == ["0"]
    assert service["ipc"] == "host" and service["restart"] == "unless-stopped"
    assert "limits" not in service["deploy"]["resources"]  # no memory_limit_gb: no limit


def test_memory_limit_gb_becomes_the_containers_limit_and_zero_is_refused(tmp_path):
    folder = alpha_with(tmp_path, append="memory_limit_gb: 6\n")
    model = next(m for m in load_rig(SERVING_RIG, folder).models if m.name == "test-alpha")
    service = yaml.safe_load(render_compose(model, with_api_key=False))["services"]["vllm"]
    assert service["deploy"]["resources"]["limits"] == {"memory": "6g"}
    (folder / "test-alpha.yml").write_text((folder / "test-alpha.yml").read_text().replace("memory_limit_gb: 6", "memory_limit_gb: 0"))
    assert "memory_limit_gb" in errors_for(folder)


def _catalogs():
    yield REPO / "inventory/rigs/win-2x4090-48gb.yml", REPO / "inventory/models"
    yield REPO / "inventory/rigs/linux-4x3090.yml", REPO / "inventory/models"
    yield REPO / "inventory/rigs/sim.yml", REPO / "inventory/models"
    yield SERVING_RIG, TEST_CATALOG


@pytest.mark.parametrize("rig_file, catalog", list(_catalogs()), ids=lambda p: Path(p).stem)
def test_every_rendered_file_passes_docker_compose_config(tmp_path, rig_file, catalog):
    rig = load_rig(rig_file, catalog)
    for model in rig.models:
        path = tmp_path / f"{model.name}.yml"
        path.write_text(render_compose(model, with_api_key=False))
        result = subprocess.run(["docker", "compose", "-f", str(path), "config", "--quiet"], capture_output=True, text=True)
        assert result.returncode == 0, result.stderr


def test_ngram_lookup_lengths_reach_the_speculative_config_and_a_min_above_max_is_refused(tmp_path):
    """vLLM's ngram drafter takes prompt_lookup_max/min in --speculative-config (5 and 5 when neither is given)."""
    import json

    ngram = "  speculative: {method: ngram, num_speculative_tokens: 3, prompt_lookup_max: 3, prompt_lookup_min: 1}\n"
    catalog = alpha_with(tmp_path, ("  speculative: {method: mtp, num_speculative_tokens: 2}\n", ngram))
    model = next(m for m in load_rig(SERVING_RIG, catalog).models if m.name == "test-alpha")
    args = vllm_args(model)
    assert json.loads(args[args.index("--speculative-config") + 1]) == {
        "method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3, "prompt_lookup_min": 1}
    (catalog / "test-alpha.yml").write_text((catalog / "test-alpha.yml").read_text().replace(
        "prompt_lookup_min: 1", "prompt_lookup_min: 4"))
    assert "prompt_lookup_min 4 is above prompt_lookup_max 3 (vLLM refuses that)" in errors_for(catalog)
