"""The rig file's on_demand, offline: what it is checked for, and what it makes of the compose files, the readiness
settings, rigkit-ondemand's settings, the watchdog's and status' view. Nothing simulated: pure functions and
`rigkit check` as a user runs it."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from rigkit.config.errors import ConfigError
from rigkit.config.loader import load_rig
from rigkit.fit.check import shared_gpu_problems
from rigkit.ondemand.plan import conflicts, front_config
from rigkit.serving.compose import render_compose, stack_settings
from rigkit.serving.watchdog import watched
from tests.conftest import DATA, REPO, SERVING_RIG, copy_catalog

BOTH = "on_demand:\n  hold_s: 45\n  models:\n    - {name: test-alpha}\n    - {name: test-beta, swap: stop, idle_park_s: 30}\n"
ON_GPU_0 = [("gpus: [1]", "gpus: [0]"), ("vllm:\n", "vllm:\n  gpu_memory_utilization: 0.6\n")]
SHARE = [("vllm:\n", "vllm:\n  gpu_memory_utilization: 0.6\n")]


def rig_with(tmp_path, extra: str, catalog=None):
    path = tmp_path / "rigs" / "od.yml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(SERVING_RIG.read_text() + extra)
    return path, catalog or DATA / "models"


def problems(tmp_path, extra: str, catalog=None) -> str:
    with pytest.raises(ConfigError) as caught:
        load_rig(*rig_with(tmp_path, extra, catalog))
    return str(caught.value)


def test_each_on_demand_model_gets_an_engine_port_behind_its_front_and_sleep_mode_where_it_sleeps(tmp_path):
    rig = load_rig(*rig_with(tmp_path, BOTH))
    alpha, beta = rig.models
    assert (alpha.engine_port, beta.engine_port) == (28101, 28102)
    compose = render_compose(alpha, with_api_key=False)
    assert '"--host", "127.0.0.1", "--port", "28101"' in compose and '"--enable-sleep-mode"' in compose
    assert '"VLLM_SERVER_DEV_MODE": "1"' in compose and 'restart: "no"' in compose
    stopped = render_compose(beta, with_api_key=False, host="0.0.0.0")
    assert '"--host", "127.0.0.1"' in stopped and "--enable-sleep-mode" not in stopped and "DEV_MODE" not in stopped
    assert json.loads(stack_settings(alpha, False))["port"] == 28101  # rigkit-stack proves the engine itself
    assert watched(rig) == []


def test_a_rig_without_on_demand_renders_every_file_as_before(tmp_path):
    plain = load_rig(SERVING_RIG, DATA / "models")
    for model in plain.models:
        compose = render_compose(model, with_api_key=True)
        assert "restart: unless-stopped\n" in compose and f'"--port", "{model.spec.port}"' in compose
        assert "sleep" not in compose and "DEV_MODE" not in compose
        assert json.loads(stack_settings(model, True))["port"] == model.spec.port


def test_rigkit_ondemands_settings_name_each_front_engine_and_the_models_it_takes_turns_with(tmp_path):
    catalog = copy_catalog(tmp_path, test_alpha=SHARE, test_beta=ON_GPU_0)
    rig = load_rig(*rig_with(tmp_path, BOTH, catalog))
    assert conflicts(rig) == {"test-alpha": {"test-beta"}, "test-beta": {"test-alpha"}}
    settings = json.loads(front_config(rig, with_api_key=True))
    alpha, beta = settings["models"]
    assert settings["hold_s"] == 45 and settings["api_key_env_file"] == "/etc/rigkit/secrets/vllm-api-key.env"
    assert alpha["listen"] == ["127.0.0.1", 18101] and alpha["engine_url"] == "http://127.0.0.1:28101"
    assert alpha["conflicts"] == ["test-beta"] and beta["swap"] == "stop" and beta["idle_park_s"] == 30
    assert alpha["held_mib"] == int(0.6 * 24 * 1024)  # an RTX 4090's 24 GiB, from the GPU table
    assert set(settings) == {"hold_s", "state_file", "api_key_env_file", "models", "release_clocks_on"}  # no key
    assert settings["release_clocks_on"] == [0]  # only on-demand models use GPU 0: its clock lock goes while parked
    assert alpha["proof_file"] == "/var/lib/rigkit/ondemand/test-alpha.json"
    assert alpha["config_file"] == "/etc/rigkit/stacks/test-alpha/compose.yml"  # the proven config, as rigkit-stack keeps it
    # they share GPU 0 without shared_gpus: they take turns; the fit counts each with the models always loaded
    assert shared_gpu_problems(rig) == []


def test_a_gpu_a_model_always_loaded_uses_keeps_its_clock_lock(tmp_path):
    """test-beta stays loaded on GPU 1 beside on-demand test-alpha there; GPU 0 serves nothing."""
    catalog = copy_catalog(tmp_path, test_alpha=[("gpus: [0]", "gpus: [1]\nshared_gpus: true"), *SHARE],
                           test_beta=[("gpus: [1]", "gpus: [1]\nshared_gpus: true"),
                                      ("vllm:\n", "vllm:\n  gpu_memory_utilization: 0.3\n")])
    rig = load_rig(*rig_with(tmp_path, "on_demand:\n  models:\n    - {name: test-alpha}\n", catalog))
    assert [m.spec.gpus for m in rig.models] == [[1], [1]]
    assert json.loads(front_config(rig, with_api_key=False))["release_clocks_on"] == []


def test_models_that_fit_together_do_not_take_turns(tmp_path):
    small = [("gpus: [1]", "gpus: [0]"), ("vllm:\n", "vllm:\n  gpu_memory_utilization: 0.4\n")]
    catalog = copy_catalog(tmp_path, test_alpha=[("vllm:\n", "vllm:\n  gpu_memory_utilization: 0.4\n")],
                           test_beta=small)
    rig = load_rig(*rig_with(tmp_path, BOTH, catalog))
    assert conflicts(rig) == {"test-alpha": set(), "test-beta": set()}


def test_an_on_demand_model_beside_one_always_loaded_must_fit_with_it(tmp_path):
    shared = [("ready_timeout_s", "shared_gpus: true\nready_timeout_s")]
    catalog = copy_catalog(tmp_path, test_alpha=SHARE + shared, test_beta=ON_GPU_0 + shared)
    rig = load_rig(*rig_with(tmp_path, "on_demand:\n  models:\n    - {name: test-beta}\n", catalog))
    assert shared_gpu_problems(rig) == ["GPU 0: test-alpha 0.6 + test-beta 0.6 = 1.2 of its memory; models sharing a "
                                        "GPU must ask for at most 1 together (the second would not start); lower "
                                        "their gpu_memory_utilization"]


def test_bad_on_demand_entries_are_refused_with_the_field_and_what_is_allowed(tmp_path):
    found = problems(tmp_path, "on_demand:\n  models:\n    - {name: nope}\n    - {name: test-beta}\n    - {name: test-beta}\n")
    assert "on_demand.models[0].name: 'nope': not one of this rig's models (test-alpha, test-beta)" in found
    assert "on_demand.models[2].name: 'test-beta': listed twice; once per model" in found
    clash = problems(tmp_path, "on_demand:\n  models:\n    - {name: test-alpha, engine_port: 18102}\n")
    assert ("on_demand.models[0].engine_port: 18102: port 18102 is the port of model test-beta; give test-alpha's "
            "engine a port of its own") in clash
    wrong = problems(tmp_path, "on_demand:\n  hold_s: 1\n  models:\n    - {name: test-alpha, swap: hibernate}\n")
    assert "hold_s" in wrong and "greater than or equal to 5" in wrong and "'sleep', 'checkpoint' or 'stop'" in wrong
    tool = problems(tmp_path, "on_demand:\n  cuda_checkpoint: 'cuda-checkpoint; reboot'\n  models:\n    - {name: test-alpha}\n")
    assert "on_demand.cuda_checkpoint" in tool and "should match pattern '^/[A-Za-z0-9_./-]*$'" in tool, tool


def test_a_model_spanning_gpus_is_not_parked_by_checkpoint(tmp_path):
    """cuda-checkpoint does not move memory shared between processes (NCCL): a model on two GPUs is refused."""
    catalog = copy_catalog(tmp_path, test_alpha=[("gpus: [0]", "gpus: [0, 1]\nparallel: {tensor: 2}\nshared_gpus: true")])
    found = problems(tmp_path, "on_demand:\n  models:\n    - {name: test-alpha, swap: checkpoint}\n", catalog)
    assert ("on_demand.models[0].swap: 'checkpoint': test-alpha spans GPUs ([0, 1]): cuda-checkpoint does not move "
            "the memory its processes share (NCCL); a model on one GPU only, else sleep or stop") in found, found
    rig = load_rig(*rig_with(tmp_path, "on_demand:\n  models:\n    - {name: test-beta, swap: checkpoint}\n"))
    assert [m.on_demand.swap for m in rig.models if m.on_demand] == ["checkpoint"]
    settings = json.loads(front_config(rig, with_api_key=True))
    assert [m["checkpoint_tool"] for m in settings["models"]] == ["/usr/local/bin/cuda-checkpoint"]
    assert "--enable-sleep-mode" not in render_compose(rig.models[1], with_api_key=True)


def test_rigkit_check_refuses_on_demand_on_a_windows_rig(tmp_path):
    rig = tmp_path / "rigs" / "win.yml"
    rig.parent.mkdir(parents=True)
    rig.write_text((DATA / "rigs" / "windows.yml").read_text() + "on_demand:\n  models:\n    - {name: win-alpha}\n")
    proc = subprocess.run([sys.executable, "-m", "rigkit.cli", "check", str(rig), "--catalog", str(DATA / "models")],
                          cwd=REPO, capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0 and "Traceback" not in proc.stderr + proc.stdout
    assert "on-demand models run behind rigkit-ondemand, a systemd service of Linux rigs" in proc.stdout + proc.stderr


def test_status_takes_an_on_demand_model_not_running_or_asleep_as_parked_not_down(tmp_path):
    from rigkit.status.collect import wanted_files
    from rigkit.status.report import build_status
    from rigkit.status.table import status_table
    from tests.test_status_report import COMMANDS, NOW, gpus, probe, results, weights

    def drift_and_failures(rig, written_s_ago=1.0):
        facts = probe(rig)
        facts["stacks"]["test-alpha"]["containers"][0].update(running=False, status="exited")
        facts["stacks"]["test-beta"]["ready"] = {"ok": False, "seconds": 0.01, "port": 28102,
                                                 "error": "HTTP 503: The model is sleeping"}
        facts["ondemand"] = {"now": 1000.0, "gpus_parked": ["0"], "state": {
            "written_at": 1000.0 - written_s_ago, "models": {
                "test-alpha": {"state": "parked", "parked_as": "stopped"}, "test-beta": {"state": "parked", "parked_as": "asleep"}}}}
        doc = build_status(rig, "rig1", COMMANDS, gpus(), facts, weights(rig=rig), wanted_files(rig), results(rig=rig),
                           NOW, "rigkit-gpu-policy.service")
        return doc, {d["what"] for d in doc["drift"]} | {f["what"] for f in doc["failures"]}

    doc, found = drift_and_failures(load_rig(*rig_with(tmp_path, BOTH)))
    assert found == set() and [s["on_demand"] for s in doc["stacks"]] == ["stopped", "asleep"]
    assert doc["gpus_parked"] == [0]
    text = status_table({**doc, "ok": True})
    assert "on demand: stopped" in text and "on demand: asleep" in text, text
    assert "clock locks released while parked (on-demand models): GPU 0" in text, text
    stale, _ = drift_and_failures(load_rig(*rig_with(tmp_path, BOTH)), written_s_ago=60)
    assert [s["on_demand"] for s in stale["stacks"]] == ["unknown (rigkit-ondemand's state is 60 s old)"] * 2
    _, found = drift_and_failures(load_rig(SERVING_RIG, DATA / "models"))
    assert found == {"stack test-alpha", "stack test-beta readiness"}  # the same facts, always loaded: wrong
