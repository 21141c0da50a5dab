"""Deploy safety end to end: pyinfra over SSH to the simulated rig, the rig's docker CLI and
Compose v2 against the real Docker Engine, the vLLM stand-in as the server.

- `--dry` reads only: no container starts, no file, volume or GPU setting changes;
- a rollout killed mid-readiness is seen as pending, and the next deploy ends with the last
  config proven ready serving;
- a rollback is judged on the restored config's own port, and two failures in a row still
  restore the last config proven ready;
- an API key with `$`, quotes, `#` and spaces reaches the container byte for byte and never
  appears in `--diff` or `-v` output.
Simulated: vLLM (tests/vllm_standin, with its `hang` and `fail_at_start` faults) and the GPUs.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import docker
import httpx
import pytest

from tests.conftest import (
    REPO,
    RESULTS,
    SERVING_RIG,
    STATE_ROOT,
    concerns_this_process,
    copy_catalog,
)
from tests.conftest import run_deploy as deploy_and_verify

pytestmark = pytest.mark.simrig


def run_deploy(*args, **kwargs):
    """Deploys here are about serving: verification is tested in test_verify.py."""
    return deploy_and_verify(*args, verify=False, **kwargs)


PORTS = {"test-alpha": 18101, "test-beta": 18102}
HANG = ("env:\n", "env:\n  STANDIN_FAULT: hang\n")
FAIL_AT_START = ("env:\n", "env:\n  STANDIN_FAULT: fail_at_start\n")


@pytest.fixture(scope="module")
def rig(serving_rig):
    return serving_rig


def container_env(name: str) -> list[str]:
    return docker.from_env().containers.get(f"rigkit-{name}-vllm-1").attrs["Config"]["Env"]


def answers(port: int, name: str = "test-alpha", key: str | None = None) -> bool:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    try:
        r = httpx.post(f"http://127.0.0.1:{port}/v1/completions", headers=headers, timeout=10,
                       json={"model": name, "prompt": "hi", "max_tokens": 2})
    except httpx.HTTPError:
        return False
    return r.status_code == 200


def rig_state(rig) -> str:
    """Everything a deploy could change on the rig, read past rigkit: files with digests and
    modes, unit states, the simulated GPUs."""
    listing = rig.exec(
        "find /etc/rigkit /usr/local/sbin /usr/local/lib/rigkit /etc/systemd/system /run/rigkit "
        "-xdev -printf '%p %m %s\\n' 2>/dev/null | sort; "
        "find /etc/rigkit /usr/local/sbin -type f -exec sha256sum {} + 2>/dev/null | sort; "
        "systemctl is-enabled rigkit-gpu-policy.service 2>&1; cat /run/nvidia-sim/state.json 2>&1")[1]
    return listing


def engine_state() -> tuple:
    """This process's containers and volumes on the engine (concerns_this_process)."""
    client = docker.from_env()
    containers = sorted((c.name, c.id, c.status) for c in client.containers.list(all=True)
                        if concerns_this_process(c.name, c.labels))
    volumes = sorted(v.name for v in client.volumes.list() if concerns_this_process(v.name, v.attrs.get("Labels") or {}))
    return containers, volumes


def test_a_dry_run_reads_and_changes_nothing(rig):
    before_rig, before_engine = rig_state(rig), engine_state()
    since = int(time.time()) + 1  # events are kept to the second: start the window after the rig's own start
    time.sleep(since - time.time())
    run = run_deploy(rig, SERVING_RIG, "--dry")
    until = int(time.time()) + 1
    assert run.returncode == 0, run.output
    assert "[sim-rig] Ready: deploy.py" in run.output  # the whole plan was made (facts read, checks passed)
    assert rig_state(rig) == before_rig
    assert engine_state() == before_engine
    created = [e for e in docker.from_env().events(since=since, until=until, decode=True,
                                                   filters={"type": "container", "event": "create"})
               if concerns_this_process(e["Actor"]["Attributes"].get("name", ""), e["Actor"]["Attributes"])]
    assert created == [], created  # not even a helper that came and went


def test_a_rollout_killed_mid_readiness_is_pending_and_the_next_deploy_serves_the_last_good_config(rig, tmp_path):
    good = copy_catalog(tmp_path / "good")
    assert run_deploy(rig, SERVING_RIG, catalog=good).returncode == 0
    # The hanging config's ready timeout (15 s) is waited out once, by the second deploy; the first is killed
    # within a second or two of the new container starting, well inside it.
    hanging = copy_catalog(tmp_path / "hang", test_alpha=[HANG, ("ready_timeout_s: 30\n", "ready_timeout_s: 15\n")])
    env = dict(os.environ, RIGKIT_SIM_PORT=str(rig.ssh_port), RIGKIT_RIG_FILE=str(SERVING_RIG),
               RIGKIT_CATALOG_DIR=str(hanging), RIGKIT_STATE=str(STATE_ROOT), RIGKIT_RESULTS_DIR=str(RESULTS))
    deploy = subprocess.Popen([sys.executable, "-m", "pyinfra", "-y", "inventory/sim.py", "deploy.py"],
                              cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not any("STANDIN_FAULT=hang" in e for e in _env_or_empty("test-alpha")):
            time.sleep(0.5)  # until the new (hanging) config is up and readiness is being waited for
        assert any("STANDIN_FAULT=hang" in e for e in _env_or_empty("test-alpha")), "the new config never started"
        # The SSH connection drops: the deploy and the rig-side rollout die where they stand.
        rig.exec("pkill -9 -f 'rigkit-stack rollout test-alpha'")
    finally:
        deploy.kill()
        deploy.wait(timeout=30)
    stack = "/etc/rigkit/stacks/test-alpha"
    assert rig.exec(f"cmp -s {stack}/compose.yml {stack}/compose.next.yml")[0] != 0  # wanted is not proven: pending

    again = run_deploy(rig, SERVING_RIG, catalog=hanging)
    assert again.returncode != 0
    assert "ROLLED BACK: rigkit-test-alpha serves the previous config again" in again.output
    assert answers(PORTS["test-alpha"])
    assert not any(e.startswith("STANDIN_FAULT") for e in container_env("test-alpha"))
    assert run_deploy(rig, SERVING_RIG, catalog=good).returncode == 0


def _env_or_empty(name: str) -> list[str]:
    try:
        return container_env(name)
    except docker.errors.NotFound:
        return []


def test_a_rollback_is_judged_on_the_restored_configs_own_port(rig, tmp_path):
    good = copy_catalog(tmp_path / "good")
    assert run_deploy(rig, SERVING_RIG, catalog=good).returncode == 0
    # The new config fails at once (a fast fault: the rollback path is the one a hang takes, without
    # its 30 s readiness wait).
    moved = copy_catalog(tmp_path / "moved", test_alpha=[("port: 18101", "port: 18111"), FAIL_AT_START])
    run = run_deploy(rig, SERVING_RIG, catalog=moved)
    assert run.returncode != 0
    assert "test-alpha crashed at start" in run.output, run.output
    assert "test-alpha ready on port 18101" in run.output
    assert "ROLLED BACK: rigkit-test-alpha serves the previous config again" in run.output
    assert answers(18101) and not answers(18111)


def test_two_failures_in_a_row_still_restore_the_last_config_proven_ready(rig, tmp_path):
    good = copy_catalog(tmp_path / "good")
    assert run_deploy(rig, SERVING_RIG, catalog=good).returncode == 0
    proven = rig.exec("cat /etc/rigkit/stacks/test-alpha/compose.yml")[1]
    # Two different failing configs, each failing at once (the hang's path is in the test above it).
    first = copy_catalog(tmp_path / "first", test_alpha=[FAIL_AT_START])
    second = copy_catalog(tmp_path / "second", test_alpha=[FAIL_AT_START, ('"100"', '"90"')])
    for bad in (first, second):
        run = run_deploy(rig, SERVING_RIG, catalog=bad)
        assert run.returncode != 0 and "ROLLED BACK" in run.output, run.output
        assert rig.exec("cat /etc/rigkit/stacks/test-alpha/compose.yml")[1] == proven
        assert not any(e.startswith("STANDIN_FAULT") for e in container_env("test-alpha"))
        assert answers(PORTS["test-alpha"])


def test_a_key_with_dollars_quotes_hashes_and_spaces_reaches_the_container_and_no_output(rig, tmp_path):
    key = "k$HOME 'single' \"double\" #not-a-comment $$ ${X} end"
    key_file = tmp_path / "api.key"
    key_file.write_text(key + "\n")
    key_file.chmod(0o600)
    rig_file = tmp_path / "keyed.yml"
    rig_file.write_text(SERVING_RIG.read_text() + f"api_key_file: {key_file}\n")

    run = run_deploy(rig, rig_file, "--diff", "-v")
    assert run.returncode == 0, run.output  # readiness authenticated with the key as the container has it
    assert f"VLLM_API_KEY={key}" in container_env("test-alpha")
    assert answers(PORTS["test-alpha"], key=key) and not answers(PORTS["test-alpha"])
    for fragment in ("not-a-comment", "'single'", key):
        assert fragment not in run.output
    assert rig.exec("stat -c '%a %U' /etc/rigkit/secrets /etc/rigkit/secrets/vllm-api-key.env")[1].split() == [
        "700", "root", "600", "root"]

    rotated = key.replace("end", "rotated")
    key_file.write_text(rotated + "\n")
    run = run_deploy(rig, rig_file, "--diff")
    assert run.returncode == 0, run.output
    assert "rotated" not in run.output
    assert f"VLLM_API_KEY={rotated}" in container_env("test-alpha")  # a new key restarts the stacks on it
    assert run_deploy(rig, rig_file).changed_operations() == 0
    assert run_deploy(rig, SERVING_RIG).returncode == 0
    assert json.loads(rig.exec("cat /etc/rigkit/stacks/test-alpha/stack.json")[1])["api_key_env_file"] is None
