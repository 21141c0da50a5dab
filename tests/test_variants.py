"""A catalog's variants of one model (docs/serving.md, "Variants") as `rigkit check` and the loader read them: the
real CLI on the test rig file (two RTX 4090s, compute capability 8.9, 24 GiB) and a catalog copied with one model
offered in variants. Nothing is simulated: no rig is reached."""

from __future__ import annotations

import subprocess
import sys

from rigkit.config.loader import load_rig
from rigkit.serving.compose import render_compose
from tests.conftest import DATA, REPO, copy_catalog

BASE = "ready_timeout_s: 30\n"  # the last line of test-alpha.yml
FP4 = "  - name: fp4\n    vllm: {quantization: fp_quant}\n    weight_bytes: 9000000000\n"  # needs cc 10.0
BIG = "  - name: bf16\n    weight_bytes: 60000000000\n"  # 55.9 GiB on a 24 GiB card
FP8 = "  - name: fp8\n    vllm: {quantization: fp8}\n    weight_bytes: 9000000000\n"


def offered(tmp_path, *variants: str):
    return copy_catalog(tmp_path, test_alpha=[(BASE, BASE + "variants:\n" + "".join(variants))])


def check(catalog) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "rigkit.cli", "check", str(DATA / "rigs" / "serving.yml"), "--catalog",
                           str(catalog)], cwd=REPO, capture_output=True, text=True, timeout=60)


def test_the_first_variant_the_gpus_run_and_hold_is_served_and_said(tmp_path):
    catalog = offered(tmp_path, FP4, BIG, FP8)
    proc = check(catalog)
    assert proc.returncode == 0, proc.stderr
    assert "test-alpha: variant fp8, the first of 3 in its catalog that this rig's GPUs run and hold; not fp4: " \
        "quantization fp_quant needs compute capability 10.0 or newer" in proc.stdout, proc.stdout
    assert "; not bf16: its weights are 55.9 GiB, 55.9 GiB per GPU over 1; each RTX 4090 gives vLLM 21.6 GiB" \
        in proc.stdout, proc.stdout
    rig = load_rig(DATA / "rigs" / "serving.yml", catalog)
    model = rig.models[0]
    assert model.variant == "fp8" and [n for n, _ in model.variants] == ["fp4", "bf16", "fp8"]
    # The variant's vllm adds to the model's own: its quantization, the model's dtype and drafter kept.
    assert model.spec.vllm.quantization == "fp8" and model.spec.vllm.dtype == "bfloat16" and model.spec.vllm.speculative
    compose = render_compose(model, with_api_key=False)
    assert "--quantization" in compose and "fp8" in compose and "fp_quant" not in compose


def test_no_variant_that_runs_and_fits_is_refused_naming_why_each_is_not(tmp_path):
    proc = check(offered(tmp_path, FP4, BIG))
    assert proc.returncode != 0 and "Traceback" not in proc.stderr, proc.stderr
    assert ("variants: no variant of test-alpha runs on and fits this rig's GPUs: fp4: quantization fp_quant needs "
            "compute capability 10.0") in proc.stderr, proc.stderr
    assert "; bf16: its weights are 55.9 GiB" in proc.stderr, proc.stderr


def test_a_variant_is_checked_like_the_model_where_it_is_written(tmp_path):
    cases = [
        (FP8.replace("vllm: {quantization: fp8}", "vllm: {dtype: float99}"), "variants[0].vllm.dtype: 'float99'"),
        (FP8 + "    gpus: [1]\n", "variants[0].gpus: a variant may set only: name, image, image_requires, weights"),
        (FP8 + FP8, "variants[1].name: 'fp8': each variant needs a name of its own"),
        (FP8.replace("name: fp8", "name: 'FP8; rm -rf /'"), "variants[0].name"),
    ]
    for n, (variants, message) in enumerate(cases):
        proc = check(offered(tmp_path / str(n), variants))
        assert proc.returncode != 0 and message in proc.stderr, (variants, proc.stderr)
        assert "test-alpha.yml, line " in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
