"""Does a model fit its GPUs (rigkit/fit): the arithmetic on the shapes of published models' config.json, and
`rigkit check` on the catalog's weight_bytes. Pure; the deploy's refusal on the simulated rig is in
tests/test_deploy.py."""

from __future__ import annotations

import subprocess
import sys

import pytest

from rigkit.sizing.memory import GIB, fit
from rigkit.sizing.shape import kv_bytes_per_token, model_shape
from rigkit.sizing.variant import variant_problems
from tests.conftest import DATA, REPO

# The keys rigkit reads of published config.json files (Hugging Face, each model's main branch).
LLAMA_31_8B = {"num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8, "hidden_size": 4096,
               "torch_dtype": "bfloat16", "max_position_embeddings": 131072}
LLAMA_31_70B = {**LLAMA_31_8B, "num_hidden_layers": 80, "hidden_size": 8192, "num_attention_heads": 64}
DEEPSEEK_V3 = {"num_hidden_layers": 61, "num_attention_heads": 128, "num_key_value_heads": 128, "hidden_size": 7168,
               "kv_lora_rank": 512, "qk_rope_head_dim": 64, "torch_dtype": "bfloat16", "max_position_embeddings": 163840}
GEMMA_3_27B = {"text_config": {"num_hidden_layers": 62, "num_attention_heads": 32, "num_key_value_heads": 16,
                               "head_dim": 128, "hidden_size": 5376, "sliding_window": 1024,
                               "max_position_embeddings": 131072}, "torch_dtype": "bfloat16"}
RTX_4090 = 24 * GIB  # 24564 MiB as its nvidia-smi reports; the table's 24 GiB here


def test_kv_per_token_from_published_configs():
    assert kv_bytes_per_token(model_shape(LLAMA_31_8B), "auto", "auto", 1, 1) == 2 * 32 * 8 * 128 * 2  # 128 KiB
    assert kv_bytes_per_token(model_shape(LLAMA_31_8B), "auto", "fp8", 1, 1) == 64 * 1024
    assert kv_bytes_per_token(model_shape(LLAMA_31_70B), "auto", "auto", 4, 1) == 2 * 80 * 2 * 128 * 2  # heads split
    assert kv_bytes_per_token(model_shape(LLAMA_31_70B), "auto", "auto", 16, 1) == 2 * 80 * 1 * 128 * 2  # copied
    assert kv_bytes_per_token(model_shape(LLAMA_31_8B), "auto", "auto", 1, 2) == 2 * 16 * 8 * 128 * 2  # stages
    assert kv_bytes_per_token(model_shape(DEEPSEEK_V3), "auto", "auto", 8, 1) == 61 * 576 * 2  # one latent, whole
    gemma = model_shape(GEMMA_3_27B)
    assert gemma.upper_bound and gemma.head_dim == 128 and gemma.max_position == 131072
    assert model_shape({"model_type": "standin"}) is None


def test_an_8b_at_its_own_context_on_a_4090_is_refused_with_the_context_that_fits():
    """vLLM would load 15 GiB and then stop: 131072 tokens of KV need 16 GiB where 5.6 GiB is left."""
    found = fit("llama", int(14.96 * GIB), "RTX 4090", RTX_4090, 0.9, 1, 1, model_shape(LLAMA_31_8B), None)
    assert found.problems == [
        "llama: one sequence of its own context (max_model_len unset) 131072 needs 16.0 GiB of KV cache per GPU (128 "
        "KiB a token); each RTX 4090 gives vLLM 21.6 GiB (24.0 GiB x gpu_memory_utilization 0.9), less ~1 GiB for its "
        "CUDA context and activations, and the weights take 15.0 GiB: 5.6 GiB is left. Use max_model_len 46192 or "
        "less, kv_cache_dtype fp8 (half the KV cache), or more GPUs"]
    ok = fit("llama", int(14.96 * GIB), "RTX 4090", RTX_4090, 0.9, 1, 1, model_shape(LLAMA_31_8B), 32768)
    assert ok.problems == [] and ok.summary == \
        "llama: weights 15.0 GiB per GPU, KV cache room 5.6 GiB: 46202 tokens, 1.4 sequences of 32768"
    assert fit("llama", int(14.96 * GIB), "RTX 4090", RTX_4090, 0.9, 1, 1, model_shape(LLAMA_31_8B), 46192,
               kv_cache_dtype="fp8").problems == []


def test_weights_that_do_not_fit_name_the_gpus_that_would():
    found = fit("llama70", 141 * GIB, "RTX 4090", RTX_4090, 0.9, 2, 1, model_shape(LLAMA_31_70B), 8192)
    assert found.problems == [
        "llama70: its weights are 141.0 GiB, 70.5 GiB per GPU over 2; each RTX 4090 gives vLLM 21.6 GiB (24.0 GiB x "
        "gpu_memory_utilization 0.9), less ~1 GiB for its CUDA context and activations: they do not fit. Use more "
        "GPUs, or a smaller variant (a 4-bit one is about a quarter of 16-bit weights)"]
    on_h200 = fit("llama70", 141 * GIB, "H200", 141 * GIB, 0.9, 1, 1, model_shape(LLAMA_31_70B), 8192)
    assert "tensor parallel over 2 GPUs" in on_h200.problems[0]


def test_a_context_longer_than_the_model_is_refused_and_a_windowed_model_only_warned():
    found = fit("llama", int(14.96 * GIB), "H200", 141 * GIB, 0.9, 1, 1, model_shape(LLAMA_31_8B), 262144)
    assert found.problems[0] == ("llama: max_model_len 262144 is longer than the model's own context (131072, from "
                                 "config.json's max_position_embeddings); vLLM refuses it at start unless "
                                 "VLLM_ALLOW_LONG_MAX_MODEL_LEN=1 is in the model's env")
    assert not fit("llama", int(14.96 * GIB), "H200", 141 * GIB, 0.9, 1, 1, model_shape(LLAMA_31_8B), 262144,
                   long_context_allowed=True).problems
    gemma = fit("gemma", 16 * GIB, "RTX 4090 48GB", 48 * GIB, 0.9, 1, 1, model_shape(GEMMA_3_27B), None)
    assert gemma.problems == [] and gemma.warnings[0].startswith("gemma: perhaps; one sequence of its own context")
    assert "some of its layers keep a window or no KV cache at all" in gemma.warnings[0]


def test_a_model_without_layer_counts_is_judged_on_its_weights_alone():
    found = fit("standin", 2 * GIB, "RTX 4090", RTX_4090, 0.9, 1, 1, None, None)
    assert found.problems == [] and "config.json gives no layer counts" in found.summary


def test_a_quantization_below_vllms_floor_for_it_is_refused_naming_what_runs():
    assert variant_problems("m", "awq", [(0, "RTX 2080 Ti", (7, 5))]) == []  # 7.5 is AWQ's floor
    assert variant_problems("m", "fp8", [(0, "RTX 3090", (8, 6))]) == []  # runs (as W8A16: a lint warning)
    assert variant_problems("m", "mxfp4", [(0, "RTX 3090", (8, 6)), (1, "T4", (7, 5))]) == [
        "m: quantization mxfp4 needs compute capability 8.0 or newer (vLLM 0.32's floor for it); GPU 1 (T4) is 7.5, "
        "so vLLM would refuse it at start. Use a 16-bit variant or one quantized as gptq, awq, fp8, compressed-tensors"]
    assert variant_problems("m", "gptq", [(0, "P100", (6, 0))]) == []
    assert variant_problems("m", "made-up", [(0, "P100", (6, 0))]) == []  # unknown: left to vLLM
    assert variant_problems("m", "mxfp4", [(0, "RTX 9999", None)]) == []  # capability unknown: left to the deploy
    assert variant_problems("m", None, [(0, "T4", (7, 5))]) == []


@pytest.mark.parametrize("change, message", [
    (("gpus: [0]\n", "gpus: [0]\nweight_bytes: 60000000000\n"),
     "test-alpha: its weights are 55.9 GiB, 55.9 GiB per GPU over 1; each RTX 4090 "),
    (("vllm:\n", "vllm:\n  quantization: fp_quant\n"),
     "test-alpha: quantization fp_quant needs compute capability 10.0 or newer (vLLM 0.32's floor for it); GPU 0 "
     "(RTX 4090) is 8.9"),
], ids=["weights", "variant"])
def test_rigkit_check_refuses_weights_the_rig_files_gpus_cannot_hold(tmp_path, change, message):
    from tests.conftest import copy_catalog

    catalog = copy_catalog(tmp_path, test_alpha=[change])
    proc = subprocess.run([sys.executable, "-m", "rigkit.cli", "check", str(DATA / "rigs" / "serving.yml"), "--catalog",
                           str(catalog)], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0 and message in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr


def test_models_sharing_a_gpu_ask_for_at_most_all_of_it(tmp_path):
    from tests.conftest import copy_catalog

    share = ("gpus: [0]\n", "gpus: [0]\nshared_gpus: true\n")
    catalog = copy_catalog(tmp_path, test_alpha=[share], test_beta=[("gpus: [1]\n", "gpus: [0]\nshared_gpus: true\n")])
    proc = subprocess.run([sys.executable, "-m", "rigkit.cli", "check", str(DATA / "rigs" / "serving.yml"), "--catalog",
                           str(catalog)], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0, proc.stderr
    assert "GPU 0: test-alpha 0.9 + test-beta 0.9 = 1.8 of its memory; models sharing a GPU must ask for at most 1 " \
        "together (the second would not start); lower their gpu_memory_utilization" in proc.stderr, proc.stderr


def test_the_roofline_reads_a_dense_models_bytes_from_the_rig_and_leaves_a_mixture_of_experts_to_the_catalog():
    from rigkit.config.loader import load_rig
    from rigkit.fit.roofline import far_below, roofline_tok_s

    rig = load_rig(DATA / "rigs" / "serving.yml", DATA / "models")
    alpha = next(m for m in rig.models if m.name == "test-alpha")
    dense = {"config": LLAMA_31_8B, "weights_bytes": 16_060_000_000}
    assert roofline_tok_s(rig, alpha, dense) == pytest.approx(1008e9 / 16.06e9)  # one RTX 4090: 62.8 tok/s
    moe = {"config": {**LLAMA_31_8B, "num_local_experts": 8}, "weights_bytes": 93_000_000_000}
    assert roofline_tok_s(rig, alpha, moe) is None  # Mixtral reads 2 of its 8 experts a token: not its file size
    assert roofline_tok_s(rig, alpha, {}) is None
    assert far_below(alpha, 10.0, 62.8, dense).startswith("decode 10.0 tok/s is 16% of the 63 tok/s")
    assert far_below(alpha, 40.0, 62.8, dense) is None  # 64%: what a real engine reaches
    assert far_below(alpha, 10.0, 62.8, {"config": {}, "weights_bytes": 2048}) is None  # a test model: bound by launches


def test_the_rig_read_sends_back_the_keys_and_the_bytes_vllm_loads(tmp_path):
    """ModelShapes' command run here by `sh` as the rig runs it: a snapshot-like folder (the shard a symlink), a
    folder with no config.json, and a volume that is not there (nothing read, not the working folder's files)."""
    import json as json_

    from rigkit.fit.facts import ModelShapes

    model = tmp_path / "m"
    (model / "original").mkdir(parents=True)
    (model / "config.json").write_text(json_.dumps({**LLAMA_31_8B, "quantization_config": {"quant_method": "awq"},
                                                    "vocab_size": 128256, "rope_scaling": {"rope_type": "llama3"},
                                                    "num_local_experts": 8}))
    (tmp_path / "blob").write_bytes(b"x" * 3000)
    (model / "model-00001-of-00002.safetensors").symlink_to(tmp_path / "blob")
    (model / "model-00002-of-00002.safetensors").write_bytes(b"y" * 1000)
    (model / "original" / "consolidated.00.pth").write_bytes(b"z" * 5000)  # not what vLLM loads
    (model / "consolidated.safetensors").write_bytes(b"c" * 4000)  # Mistral's repos: a second copy, not loaded
    (model / "model.safetensors.index.json").write_text(json_.dumps({"weight_map": {
        "a.weight": "model-00001-of-00002.safetensors", "b.weight": "model-00002-of-00002.safetensors",
        "c.weight": "model-00002-of-00002.safetensors"}}))
    (tmp_path / "config.json").write_text("{}")  # in the working folder: never read for a missing volume
    command = ModelShapes().command(places=(("m", "folder", str(model)), ("empty", "folder", str(tmp_path / "none")),
                                            ("gone", "volume", "rigkit-weights-never-made")))
    done = subprocess.run(["sh", "-c", command], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    found = ModelShapes().process(done.stdout.splitlines())
    assert found["m"]["weights_bytes"] == 4000
    assert found["m"]["config"] == {**LLAMA_31_8B, "quant_method": "awq", "rope_scaling": {"rope_type": "llama3"},
                                    "num_local_experts": 8}  # only the keys the arithmetic reads
    from rigkit.sizing.shape import is_moe
    assert is_moe(found["m"]["config"])  # so no roofline from its files (they are not what a token reads)
    assert found["empty"]["config"] is None and found["empty"]["weights_bytes"] == 0
    assert found["gone"] == {"name": "gone", "config": None, "weights_bytes": 0}


def test_what_vllm_holds_is_not_always_what_the_files_weigh():
    """A float32 checkpoint loads as 16-bit under dtype auto; a quantization asked of the catalog that config.json
    does not name is done at load, so the weights on the GPU are a guess and a refusal becomes a warning."""
    from rigkit.config.loader import load_rig
    from rigkit.fit.check import held_weights, model_fit

    rig = load_rig(DATA / "rigs" / "serving.yml", DATA / "models")
    alpha = next(m for m in rig.models if m.name == "test-alpha")
    fp32 = {**LLAMA_31_8B, "torch_dtype": "float32"}
    assert held_weights(alpha, 32 * GIB, fp32) == (16 * GIB, True)
    assert model_shape(fp32).dtype_bytes == 4 and kv_bytes_per_token(model_shape(fp32), "auto", "auto", 1, 1) == 128 * 1024
    quantized = alpha.spec.model_copy(update={"vllm": alpha.spec.vllm.model_copy(update={"quantization": "fp8"})})
    from dataclasses import replace
    fp8 = replace(alpha, spec=quantized)
    assert held_weights(fp8, 60 * GIB, LLAMA_31_8B) == (60 * GIB, False)
    found = model_fit(fp8, rig, {"config": LLAMA_31_8B, "weights_bytes": 60 * GIB}, {})
    assert found.problems == [] and found.warnings[0].startswith("test-alpha: perhaps; its weights are 60.0 GiB")
    assert "quantized as it loads them" in found.warnings[0]


def test_rope_scaling_follows_vllm_032s_rule_and_a_longer_context_is_only_warned():
    from rigkit.sizing.shape import max_context

    linear = {**LLAMA_31_8B, "max_position_embeddings": 4096, "rope_scaling": {"type": "linear", "factor": 4.0}}
    assert max_context(linear, linear) == (16384, True)
    yarn = {**LLAMA_31_8B, "max_position_embeddings": 32768, "rope_scaling": {"rope_type": "yarn", "factor": 4.0,
                                                                            "original_max_position_embeddings": 32768}}
    assert max_context(yarn, yarn) == (32768, True)  # 0.32 leaves YaRN's as it is
    found = fit("qwen", 15 * GIB, "H200", 141 * GIB, 0.9, 1, 1, model_shape(yarn), 131072)
    assert found.problems == [] and found.warnings[0].startswith("qwen: perhaps; max_model_len 131072 is longer")


def test_hybrid_and_linear_attention_models_are_an_upper_bound_and_a_context_that_fits_nothing_says_so():
    qwen3_next = {**LLAMA_31_8B, "layer_types": ["linear_attention", "full_attention"]}
    nemotron_h = {**LLAMA_31_8B, "hybrid_override_pattern": "M-M-M-M*-"}
    assert model_shape(qwen3_next).upper_bound and model_shape(nemotron_h).upper_bound
    assert not model_shape(LLAMA_31_8B).upper_bound
    full = fit("big", int(20.6 * GIB) - 2**20, "RTX 4090", RTX_4090, 0.9, 1, 1, model_shape(LLAMA_31_8B), 8192)
    assert full.problems[0].endswith("Use more GPUs or a smaller variant")
