"""deploy.py end to end: the real pyinfra CLI over real SSH to the simulated rig.

Simulated: the GPUs behind nvidia-smi (tests/simrig/nvidia-smi).
"""

from __future__ import annotations

import hashlib

import pytest

from tests.conftest import OPERATIONS_STARTED, POLICY_RIG, run_deploy

SIM_RIG = POLICY_RIG.read_text()

pytestmark = pytest.mark.simrig


def test_deploy_reads_gpu_facts_over_ssh(simrig):
    run = run_deploy(simrig)
    assert run.returncode == 0, run.output
    assert "[sim-rig] Connected" in run.output
    assert OPERATIONS_STARTED in run.output  # the line the refusal tests look for, as pyinfra prints it
    assert "GPU 0: NVIDIA GeForce RTX 4090" in run.output
    assert "GPU 1: NVIDIA GeForce RTX 4090" in run.output


def test_bad_config_stops_before_any_operation(simrig, tmp_path):
    bad = tmp_path / "bad.yml"
    bad.write_text(SIM_RIG.replace("power_limit_w: 330", "power_limit_w: 900", 1))
    run = run_deploy(simrig, bad)
    assert run.returncode != 0
    assert "gpus[0].power_limit_w: 900: 900 W is outside 150-600 W" in run.output
    assert "nothing was changed on any rig" in run.output
    assert OPERATIONS_STARTED not in run.output


def test_deploy_refuses_a_rig_whose_gpus_differ_from_its_file(simrig, tmp_path):
    three = tmp_path / "three.yml"
    third = "  - index: 2\n    model: RTX 4090\n    power_limit_w: 330\n"
    three.write_text(SIM_RIG.replace("# The simulated rig shares", third + "# The simulated rig shares"))
    run = run_deploy(simrig, three)
    assert run.returncode != 0
    assert "GPU 2 is in the rig file, but the rig reports GPUs: 0, 1" in run.output


def test_runtime_modules_edited_on_the_rig_are_put_back_by_one_operation_and_the_keeper_restarts(simrig):
    """The rig-side runtime ships as one operation (rigkit.plumbing.files.put_all): a module edited by hand and
    one whose mode was changed are both put back, the operation counts as one change, and the GPU
    policy keeper, which imports the runtime, is restarted; the next deploy changes nothing."""
    from rigkit.rigside.names import RUNTIME_DIR
    from roles.rigside import runtime_files

    assert run_deploy(simrig, verify=False).returncode == 0
    code, out = simrig.exec(f"echo '# edited' >> {RUNTIME_DIR}/probe.py && chmod 600 {RUNTIME_DIR}/lock.py")
    assert code == 0, out
    run = run_deploy(simrig, verify=False)
    assert run.returncode == 0, run.output
    results = run.output.split("--> Results:", 1)[1]
    runtime = [line for line in results.splitlines() if "Rig-side runtime:" in line]
    assert len(runtime) == 1 and runtime[0].split()[-4:] == ["1", "1", "-", "-"], runtime
    assert "Restart the GPU policy keeper (new version)" in results
    assert run.changed_operations() == 2, results
    expected = runtime_files()
    for name in ("probe.py", "lock.py"):
        code, out = simrig.exec(f"stat -c %a {RUNTIME_DIR}/{name} && sha256sum {RUNTIME_DIR}/{name}")
        mode, digest = out.split()[:2]
        assert (mode, digest) == ("644", hashlib.sha256(expected[f"{RUNTIME_DIR}/{name}"]).hexdigest()), out
    assert run_deploy(simrig, verify=False).changed_operations() == 0


def refused_at_preflight(rig, tmp_path, config: dict):
    """A deploy of one model, `fit-model`, whose folder on the rig holds `config` as its config.json beside a
    1 KiB shard: its output, once it was refused with nothing on the rig changed."""
    import json

    from tests.conftest import DATA, OPERATIONS_STARTED
    from tests.simrig.weights import SIM_MODELS, ensure_checkpoint

    (ensure_checkpoint("fit-model") / "config.json").write_text(json.dumps(config))
    catalog = tmp_path / "models"
    catalog.mkdir()
    (catalog / "fit-model.yml").write_text(f"image: rigkit-vllm-standin:sim\nweights:\n  source: {SIM_MODELS}/fit-model\n"
                                           "gpus: [0]\nport: 18131\n")
    rig_file = tmp_path / "rig.yml"
    rig_file.write_text((DATA / "rigs" / "serving.yml").read_text().replace("models: [test-alpha, test-beta]",
                                                                           "models: [fit-model]"))
    _, files_before = rig.exec("ls -R /etc/rigkit/stacks 2>/dev/null; true")
    run = run_deploy(rig, rig_file, catalog=catalog)
    assert run.returncode != 0, run.output
    assert "nothing was changed" in run.output and OPERATIONS_STARTED not in run.output, run.output
    assert rig.exec("ls -R /etc/rigkit/stacks 2>/dev/null; true")[1] == files_before
    return run.output


LLAMA_70B_256K = {"architectures": ["LlamaForCausalLM"], "num_hidden_layers": 80, "num_attention_heads": 64,
                  "num_key_value_heads": 8, "hidden_size": 8192, "torch_dtype": "bfloat16",
                  "max_position_embeddings": 262144}


def test_a_model_whose_kv_cache_cannot_hold_its_context_is_refused_before_anything_changes(simrig, tmp_path):
    """The preflight reads the model's config.json and its weights' bytes in the folder on the rig and each GPU's
    memory as nvidia-smi reports it (simulated: 49140 MiB, a 48 GB RTX 4090's): Llama 3.1 70B's shape at a context of
    256K tokens needs 80 GiB of KV cache per GPU, which vLLM would find out only after loading. Simulated: the GPUs;
    the checkpoint is config.json with the published model's keys beside a 1 KiB shard."""
    output = refused_at_preflight(simrig, tmp_path, LLAMA_70B_256K)
    assert ("fit-model: one sequence of its own context (max_model_len unset) 262144 needs 80.0 GiB of KV cache per "
            "GPU (320 KiB a token); each RTX 4090 gives vLLM 43.2 GiB (48.0 GiB x gpu_memory_utilization 0.9)") in output
    assert "Use max_model_len 138240 or less, kv_cache_dtype fp8" in output, output


def test_a_quantization_the_gpu_cannot_run_is_refused_before_anything_changes(simrig, tmp_path):
    """config.json says the checkpoint is MXFP4 (gpt-oss's), whose floor in vLLM 0.32 is compute capability 8.0; the
    rig's GPUs report 7.5 (Turing). Simulated: the GPUs (tests/simrig, compute_cap)."""
    from tests.simrig.rig import SimGpu

    simrig.gpus = [SimGpu(compute_cap="7.5"), SimGpu(compute_cap="7.5")]
    simrig.write_gpu_config()
    try:
        output = refused_at_preflight(simrig, tmp_path, {**LLAMA_70B_256K, "max_position_embeddings": 8192,
                                                          "quantization_config": {"quant_method": "mxfp4"}})
    finally:
        simrig.gpus = [SimGpu(), SimGpu()]
        simrig.write_gpu_config()
    assert ("fit-model: quantization mxfp4 needs compute capability 8.0 or newer (vLLM 0.32's floor for it); GPU 0 "
            "(RTX 4090) is 7.5, so vLLM would refuse it at start. Use a 16-bit variant or one quantized as gptq, awq, "
            "fp8, compressed-tensors") in output, output
