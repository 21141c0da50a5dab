"""`rigkit status` end to end: the real CLI, pyinfra over SSH to the simulated rig, the rig's docker
CLI against the real Docker Engine, the vLLM stand-in as the server.

Drift is planted past rigkit (the rig's nvidia-smi, systemctl, the docker engine, the volume's
files on the host), and every check that status changed nothing reads the rig's state past
rigkit too: files with digests and modes, unit states, the simulated GPUs' stored settings and
the log of every nvidia-smi call that set something, containers with their start times and
restart counts, volumes and their files, and the engine's container events.
Simulated: vLLM (tests/vllm_standin) and the GPUs (tests/simrig/nvidia-smi).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import docker
import pytest

from tests.conftest import (
    REPO,
    RESULTS,
    SERVING_RIG,
    STATE_ROOT,
    TEST_CATALOG,
    concerns_this_process,
    run_deploy,
)
from tests.simrig.weights import ensure_checkpoint
from tests.vllm_standin.image import ensure_standin_image

pytestmark = pytest.mark.simrig

MODELS = ("test-alpha", "test-beta")
VERIFIED: dict[str, str] = {}  # model -> the time inside the verification the rig fixture wrote
INVENTORY = "tests/data/status-fleet.py"


@pytest.fixture(scope="module")
def rig(fresh_rig):
    """The serving rig deployed without its verification (a benchmark of each model, ~25 s; the
    deploy's own verification is test_verify's subject), and a passed verification per model written
    through rigkit's writer of the results history: status only reads the latest one."""
    ensure_standin_image()
    for name in MODELS:
        ensure_checkpoint(name)
    run = run_deploy(fresh_rig, SERVING_RIG, verify=False)
    assert run.returncode == 0, run.output
    for name in MODELS:
        VERIFIED[name] = json.loads(write_verification(name).read_text())["time"]
    yield fresh_rig
    for name in MODELS:
        fresh_rig.exec(f"test -d /etc/rigkit/stacks/{name} && rigkit-stack down {name}")


def write_verification(model: str) -> Path:
    """A verification document of `model` on the serving rig, timed now, in the form
    rigkit.verify.result writes (docs/verification.md), the fields status reads filled."""
    from rigkit.verify.history import write_document
    from rigkit.verify.result import results_folder

    now = datetime.now(timezone.utc).replace(microsecond=0)
    checks = [{"name": "decode_min", "passed": True, "message": "decode 100 tok/s, expected at least 80"}]
    return write_document(results_folder(RESULTS, "serving", model) / f"{now.strftime('%Y-%m-%dT%H%M%SZ')}.json",
                          {"kind": "verification", "rig": "serving", "model": model, "time": now.isoformat(),
                           "passed": True, "checks": checks, "regressions": [], "figures": {}})


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # closed again once the socket is


def status(rig, tmp_path, *extra: str, rigs: int = 1, down_port: int | None = None) -> tuple[int, str, dict]:
    env = dict(os.environ, RIGKIT_SIM_PORT=str(rig.ssh_port), RIGKIT_STATE=str(STATE_ROOT),
               RIGKIT_RIG_FILE=str(SERVING_RIG), RIGKIT_CATALOG_DIR=str(TEST_CATALOG), RIGKIT_RESULTS_DIR=str(RESULTS),
               RIGKIT_STATUS_RIGS=str(rigs))
    if down_port:
        env["RIGKIT_STATUS_DOWN_PORT"] = str(down_port)
    out = tmp_path / "status.json"
    proc = subprocess.run([sys.executable, "-m", "rigkit.cli", "status", INVENTORY, "--json", str(out), *extra],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    text = proc.stdout + proc.stderr
    assert out.is_file(), text
    return proc.returncode, text, json.loads(out.read_text())


def volume_dir(name: str) -> Path:
    return Path(docker.from_env().volumes.get(f"rigkit-weights-{name}").attrs["Mountpoint"])


def rig_state(rig) -> str:
    """Everything a run could change on the rig, read past rigkit."""
    return rig.exec(
        "find /etc/rigkit /usr/local/sbin /usr/local/lib/rigkit /etc/systemd/system /run/rigkit /run/lock "
        "-xdev -printf '%p %m %s\\n' 2>/dev/null | sort; "
        "find /etc/rigkit /usr/local/sbin /etc/systemd/system -type f -exec sha256sum {} + 2>/dev/null | sort; "
        "systemctl is-enabled rigkit-gpu-policy.service rigkit-watchdog.timer 2>&1; "
        "systemctl is-active rigkit-gpu-policy.service rigkit-watchdog.timer 2>&1; "
        "cat /run/nvidia-sim/state.json /run/nvidia-sim/calls.log 2>&1")[1]


def engine_state() -> tuple:
    client = docker.from_env()
    # Listed first without inspecting each: the other test processes' containers come and go meanwhile
    # (inspecting one removed since is a 404); only this process's own are inspected.
    ours = [row["Id"] for row in client.api.containers(all=True)
            if concerns_this_process((row.get("Names") or ["/"])[0].lstrip("/"), row.get("Labels") or {})]
    containers = sorted((c.name, c.id, c.status, c.attrs["State"]["StartedAt"], c.attrs["RestartCount"])
                        for c in map(client.containers.get, ours))
    volumes = {v.name: sorted(p.name for p in volume_dir(v.name.removeprefix("rigkit-weights-")).iterdir())
               for v in client.volumes.list() if v.name in (f"rigkit-weights-{m}" for m in MODELS)}
    return containers, volumes


PLANTED_PORT = 18777


def wait_for_listener(rig, port: int, timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while rig.exec(f"python3 -c 'import socket; socket.create_connection((\"127.0.0.1\", {port}), 1)'")[0] != 0:
        assert time.monotonic() < deadline, f"waited {timeout_s} s for the planted listener on port {port}"
        time.sleep(0.2)


def test_a_deployed_rig_is_in_order_and_every_section_is_filled(rig, tmp_path):
    """Also: the results history after `rigkit tune` (its document, written by tune's own writer, newer than
    the verification) and a result file cut off by a crash, newer still: status reads the verification,
    stays green, and names the cut-off file."""
    from rigkit.tune.inputs import write_json

    planted = []
    for model in MODELS:
        folder = RESULTS / "serving" / model
        assert any(folder.glob("*.json")), f"the fixture wrote {model}'s verification into {folder}"
        planted.append(folder / "tune-29990101T000000Z.json")
        write_json(planted[-1], {"rig": "serving", "model": model, "table": []})
    planted.append(RESULTS / "serving" / "test-alpha" / "2999-01-01T000001Z.json")
    planted[-1].write_text('{"kind": "verification", "time": "2999-01-01T00:00:01+00:00", "pas')
    try:
        code, text, report = status(rig, tmp_path)
    finally:
        for path in planted:
            path.unlink()
    assert f"{planted[-1]}: skipped, not readable as JSON" in text, text
    assert code == 0, text
    (doc,) = report["rigs"]
    assert doc["reachable"] and doc["ok"] and doc["drift"] == [] and doc["failures"] == [], text
    assert [(g["requested_w"], g["power_limit_w"], g["enforced_power_limit_w"], g["persistence"], g["driver_version"])
            for g in doc["gpus"]] == [(330.0, 330.0, 330.0, True, "580.95.05")] * 2
    unit = doc["gpu_policy_unit"]
    assert unit["enabled"] == "enabled" and unit["ran_this_boot"] and unit["result"] == "success"
    assert any("applied" in line for line in unit["journal"]), unit
    for stack in doc["stacks"]:
        assert stack["running"] and stack["ready"] and stack["compose_as_rendered"], stack
        assert stack["restarts_since_deploy"] == 0 and stack["image_id"] == stack["catalog_image_id"]
    assert [(w["status"], w["marker"], w["missing_files"]) for w in doc["weights"]] == [("unchanged", True, [])] * 2
    assert {v["model"]: (v["time"], v["passed"]) for v in doc["verification"]} == {
        m: (VERIFIED[m], True) for m in MODELS}  # the fixture's, not the tune or cut-off files newer than it
    assert doc["watchdog"]["timer_enabled"] == "enabled" and doc["watchdog"]["timer_active"] == "active"
    assert "== rig-1" in text and ": OK" in text


def test_every_planted_drift_is_caught_an_unreachable_rig_is_reported_and_nothing_changes(rig, tmp_path):
    weights_file = volume_dir("test-alpha") / "model.safetensors"
    aside = weights_file.with_name("model.safetensors.aside")
    # The GPU policy keeper stopped (it would re-apply the cap within seconds), then a cap changed
    # behind rigkit's back.
    rig.exec("systemctl stop rigkit-gpu-keeper.service && nvidia-smi -i 0 -pl 300")
    docker.from_env().containers.get("rigkit-test-beta-vllm-1").stop(timeout=10)  # a stopped stack
    rig.exec("echo '# edited on the rig' >> /etc/rigkit/stacks/test-alpha/compose.yml")  # a changed compose file
    rig.exec("systemctl disable rigkit-gpu-policy.service")  # the boot-time policy disabled
    # A port rigkit did not open, answering every host: a process of the rig's listening on 0.0.0.0.
    code, said = rig.exec(f"systemd-run --unit=rigkit-test-planted python3 -m http.server {PLANTED_PORT} "
                          "--bind 0.0.0.0 --directory /usr/share")
    assert code == 0, said
    wait_for_listener(rig, PLANTED_PORT)
    weights_file.rename(aside)  # a weights volume with a file removed
    try:
        before_rig, before_engine = rig_state(rig), engine_state()
        since = int(time.time()) + 1  # events are kept to the second: the window opens after the planted stop
        time.sleep(since - time.time())
        down = closed_port()
        code, text, report = status(rig, tmp_path, rigs=2, down_port=down)
        until = int(time.time()) + 1
        after_rig, after_engine = rig_state(rig), engine_state()
    finally:
        aside.rename(weights_file)
        rig.exec("systemctl stop rigkit-test-planted.service")

    assert after_rig == before_rig
    assert after_engine == before_engine
    events = [e for e in docker.from_env().events(since=since, until=until, decode=True, filters={"type": "container"})
              if concerns_this_process(e["Actor"]["Attributes"].get("name", ""), e["Actor"]["Attributes"])]
    # the test's own reads: commands (exec) and their output read back as a file (archive-path: SimRig.exec)
    assert [e for e in events if e.get("Action") not in ("exec_create", "exec_start", "exec_die", "archive-path")
            and not e.get("Action", "").startswith(("exec_", "health_status"))] == [], events

    assert code == 1, text
    by_name = {r["rig"]: r for r in report["rigs"]}
    assert set(by_name) == {"rig-1", "rig-2", "rig-down"}
    assert not by_name["rig-down"]["reachable"] and by_name["rig-down"]["error"], by_name["rig-down"]
    assert "rig-down" in text and "UNREACHABLE" in text
    for name in ("rig-1", "rig-2"):  # the unreachable rig did not stop the others
        doc = by_name[name]
        assert doc["reachable"] and not doc["ok"]
        drift = {d["what"]: d for d in doc["drift"]}
        assert drift["GPU 0 power limit"]["found"] == "300 W" and drift["GPU 0 power limit"]["wanted"] == "330 W"
        assert "not running" in drift["stack test-beta"]["found"]
        assert "compose.yml" in drift["stack test-alpha files"]["found"]
        assert drift["rigkit-gpu-policy.service at boot"]["found"] == "disabled"
        assert drift["rigkit-gpu-keeper.service"]["found"] == "enabled, inactive"
        assert "model.safetensors" in drift["weights volume rigkit-weights-test-alpha files"]["found"]
        assert drift["weights volume rigkit-weights-test-alpha files"]["repair"] == (
            f"rigkit deploy {INVENTORY} --limit {name} --verify-weights")
        assert drift["GPU 0 power limit"]["repair"] == f"rigkit deploy {INVENTORY} --limit {name}"
        assert "GPU 1 power limit" not in drift
        surface = [f for f in doc["failures"] if f["what"] == "surface"]
        assert [f["detail"] for f in surface] == [
            f"port {PLANTED_PORT} (python3) answers beyond loopback (0.0.0.0); it answers HTTP without a key "
            "(200); rigkit did not open it"], doc["failures"]
        assert surface[0]["repair"] == (f"on {name} as root: stop it, bind it to 127.0.0.1, or close port "
                                        f"{PLANTED_PORT} in the rig's firewall")
    assert "DRIFT  GPU 0 power limit: 300 W; wanted 330 W" in text

    # The repair it names brings the rig back in order.
    repaired = run_deploy(rig, SERVING_RIG)
    assert repaired.returncode == 0, repaired.output
    code, text, report = status(rig, tmp_path)
    assert code == 0, text
