"""Verification of a Windows rig: `rigkit verify` (verify.py) over the `@winssh` connector.

Real: pyinfra's CLI, verify.py and roles/verify.py; rigkit's `@winssh` connector over real SSH;
the benchmark from the control machine through an SSH port forward (direct-tcpip on that
connection) to the model's port on the rig's loopback; the telemetry sampler
(rigkit/verify/telemetry.py) in a short-lived container that reserves GPUs, created, fed and
read back through the Docker Engine API over the same SSH connection (`docker.exe system
dial-stdio`); the verdicts, the JSON result and the PNG chart. The weights reach their volume
through the real deploy first.

Simulated: Windows (tests/simrig/powershell.exe; its task runs start nothing, so the test sets
the GPU policy with the simulated nvidia-smi and brings the model's stack up with `docker compose`
in the rig, as the bootstrap task would); Docker Desktop (tests/simrig/docker.exe: a container
that reserves GPUs gets the simulated NVML, tests/simrig/pynvml.py, and a snapshot of the
simulated GPUs' settings, where Docker Desktop gives WSL2's NVML of the real GPUs); vLLM
(tests/vllm_standin). The telemetry is therefore steady simulated load, marked `simulated`.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import urllib.request

import docker
import pytest

from tests.conftest import DATA, REPO, RESULTS, STATE_ROOT, WINDOWS_TEST_MODELS, copy_catalog, run_deploy
from tests.simrig.weights import ensure_checkpoint

WIN_RIG = DATA / "rigs" / "windows.yml"
INVENTORY = "tests/data/windows-rig.py"
PORT = WINDOWS_TEST_MODELS["win-alpha"]
COMPOSE = "/C:/ProgramData/rigkit/stacks/win-alpha/compose.yml"  # C:\ProgramData\rigkit\stacks\... in the rig

pytestmark = pytest.mark.simrig
SERVED_MODELS = WINDOWS_TEST_MODELS  # serving_rig's: their checkpoints made, their stacks removed


@pytest.fixture(scope="module")
def rig(serving_rig, tmp_path_factory):
    """Deployed (weights on their volume from C:\\models\\win-alpha), the policy applied and the stack up."""
    rig = serving_rig
    shutil.copytree(ensure_checkpoint("win-alpha"), rig.windows_drive / "models" / "win-alpha")
    rig.catalog = copy_catalog(tmp_path_factory.mktemp("win-verify"), win_alpha=[
        ("source: /srv/rigkit-sim-models/win-alpha", "source: 'C:\\models\\win-alpha'")])
    run = run_deploy(rig, WIN_RIG, catalog=rig.catalog, inventory=INVENTORY, verify=False)
    assert run.returncode == 0, run.output
    # What the tasks would have done on Windows: the policy of windows.yml, then the stack.
    for command in ("nvidia-smi -pl 330", "nvidia-smi -lgc 0,2200", f"docker compose -f {COMPOSE} up -d"):
        code, out = rig.exec(command)
        assert code == 0, out
    deadline = time.monotonic() + 60
    while True:
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{PORT}/v1/models", timeout=2)
            break
        except OSError:
            assert time.monotonic() < deadline, "win-alpha's stand-in did not answer within 60 s"
            time.sleep(0.5)
    shutil.rmtree(RESULTS / "windows", ignore_errors=True)
    return rig


def verify(rig):
    return run_deploy(rig, WIN_RIG, "--data", "rigkit_verify=always", catalog=rig.catalog,
                      inventory=INVENTORY, entry="verify.py")


def test_verify_writes_json_and_png_with_nvml_sampled_in_a_gpu_container(rig):
    run = verify(rig)
    assert run.returncode == 0, run.output
    assert "GPU telemetry: NVML sampler in a container with GPU access" in run.output
    [result] = sorted((RESULTS / "windows" / "win-alpha").glob("*.json"))
    assert result.with_suffix(".png").stat().st_size > 10_000
    document = json.loads(result.read_text())
    assert document["passed"] is True
    assert document["telemetry_sampler"] == "nvml-container"
    assert document["telemetry_simulated"] is True  # the simulated NVML ran in the container
    assert document["bench"]["completion_tokens"] > 0  # through the SSH port forward
    [gpu] = document["gpus"]
    # The settings the simulated nvidia-smi holds reached the container's NVML: the cap and the lock.
    assert gpu["index"] == 0 and gpu["enforced_limit_w"] == pytest.approx(330)
    assert gpu["max_sm_mhz"] <= 2200
    left = docker.from_env().containers.list(all=True, filters={"label": "rigkit.telemetry-sampler"})
    assert left == []  # the sampler's container was removed


def windows_status(rig, tmp_path) -> tuple[int, str, dict]:
    """`rigkit status` (the real CLI) on the simulated Windows rig through `@winssh`."""
    env = dict(os.environ, RIGKIT_SIM_PORT=str(rig.ssh_port), RIGKIT_RIG_FILE=str(WIN_RIG),
               RIGKIT_CATALOG_DIR=str(rig.catalog), RIGKIT_STATE=str(STATE_ROOT), RIGKIT_RESULTS_DIR=str(RESULTS))
    out = tmp_path / "status.json"
    proc = subprocess.run([sys.executable, "-m", "rigkit.cli", "status", INVENTORY, "--json", str(out)],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert out.is_file(), proc.stdout + proc.stderr
    [doc] = json.loads(out.read_text())["rigs"]
    return proc.returncode, proc.stdout + proc.stderr, doc


def test_status_reports_a_windows_rig_in_order_then_its_planted_drift_and_changes_nothing(rig, tmp_path):
    """`rigkit status` on the rig just deployed and verified: exit 0 with Linux's report (tasks for
    the policy, the stack running and ready through the port forward, the weights volume, the passed
    verification). Then drift planted past rigkit (a GPU off its cap, the bootstrap task's limit edited
    in the task store, the compose file edited on the rig): exit 1, each reported with its repair, and
    nothing on the rig changed by the reads (task runs, moves, the container's start)."""
    def on_rig(command):
        code, out = rig.exec(command)
        assert code == 0, out
        return out

    store = "/var/lib/rigkit-winsim"
    container = "docker ps -q --filter label=com.docker.compose.project=rigkit-win-alpha | xargs docker inspect " \
                "--format '{{.State.StartedAt}}'"
    before = [on_rig(f"cat {store}/runs.log {store}/moves.log"), on_rig(container)]
    code, text, doc = windows_status(rig, tmp_path)
    assert code == 0, text
    assert doc["ok"] and doc["drift"] == [] and doc["failures"] == [], doc
    assert [(t["task"], t["registered"], t["as_rendered"], t["applied"]) for t in doc["scheduled_tasks"]] == [
        ("GPU-PowerPolicy", True, True, True), ("LocalLLM-Bootstrap", True, True, True),
        ("LocalLLM-Watchdog", True, True, None)]
    [stack] = doc["stacks"]
    assert stack["running"] and stack["ready"] and stack["compose_as_rendered"] and stack["image"] == stack["running_image"]
    assert [(w["volume"], w["status"]) for w in doc["weights"]] == [("rigkit-weights-win-alpha", "unchanged")]
    assert [v["passed"] for v in doc["verification"]] == [True]

    on_rig("nvidia-smi -i 1 -pl 450")
    on_rig(f"cp {store}/tasks/LocalLLM-Bootstrap.xml /tmp/bootstrap.xml && sed -i "
           f"'s|<ExecutionTimeLimit>[^<]*<|<ExecutionTimeLimit>PT72H<|' {store}/tasks/LocalLLM-Bootstrap.xml")
    on_rig(f"cp {COMPOSE} /tmp/compose.yml && echo '# edited' >> {COMPOSE}")
    try:
        code, text, doc = windows_status(rig, tmp_path)
    finally:
        on_rig(f"nvidia-smi -i 1 -pl 330 && cp /tmp/bootstrap.xml {store}/tasks/LocalLLM-Bootstrap.xml "
               f"&& cp /tmp/compose.yml {COMPOSE}")
    assert code == 1, text
    drift = {d["what"]: d for d in doc["drift"]}
    assert set(drift) == {"GPU 1 power limit", "scheduled task LocalLLM-Bootstrap", "stack win-alpha files"}, doc["drift"]
    assert (drift["GPU 1 power limit"]["found"], drift["GPU 1 power limit"]["wanted"]) == ("450 W", "330 W")
    assert all(d["repair"] == f"rigkit deploy {INVENTORY} --limit @winssh/127.0.0.1" for d in doc["drift"]), doc["drift"]
    assert [on_rig(f"cat {store}/runs.log {store}/moves.log"), on_rig(container)] == before


def test_a_gpu_off_its_cap_fails_verification_and_says_so(rig):
    code, out = rig.exec("nvidia-smi -i 0 -pl 450")
    assert code == 0, out
    try:
        run = verify(rig)
        assert run.returncode != 0
        assert "verification of win-alpha failed" in run.output
        assert "gpu0_enforced_power_limit: enforced limit 450 W, policy 330 W: the requested limit is not in force" \
            in run.output, run.output[-4000:]
    finally:
        rig.exec("nvidia-smi -i 0 -pl 330")
