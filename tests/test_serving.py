"""Role serving end to end: pyinfra over SSH to the simulated rig, the rig's docker CLI and
Compose v2 against the real Docker Engine, the vLLM stand-in as the server.

Simulated: vLLM itself (tests/vllm_standin: an OpenAI-compatible server that takes vLLM's
flags and reproduces its traps) and the GPUs (a stand-in NVIDIA runtime hook lets dockerd
accept the compose files' GPU reservations; there is no GPU behind them).
"""

from __future__ import annotations

import json
import shutil
import time
from contextlib import contextmanager
from pathlib import Path

import docker
import httpx
import pytest

from rigkit.config.loader import load_rig
from rigkit.plumbing.facts_once import merged_reads
from roles.gpu_policy import gpu_policy_reads
from roles.gpu_report import gpu_report_reads
from roles.preflight import preflight_reads
from roles.serving import serving_reads
from roles.surface import surface_reads
from rigkit.rigside.names import P2P_VERDICT_DIR
from tests.conftest import RESULTS, SERVING_RIG, TEST_CATALOG, copy_catalog
from tests.simrig.weights import SIM_MODELS, ensure_checkpoint
from tests.conftest import run_deploy as deploy_and_verify

pytestmark = pytest.mark.simrig


def run_deploy(*args, **kwargs):
    """Deploys here are about serving: verification is tested in test_verify.py."""
    return deploy_and_verify(*args, verify=False, **kwargs)


PORTS = {"test-alpha": 18101, "test-beta": 18102}


@pytest.fixture(scope="module")
def rig(serving_rig):
    return serving_rig


def container(name):
    return docker.from_env().containers.get(f"rigkit-{name}-vllm-1")


def _running(name):
    try:
        return container(name).status == "running"
    except docker.errors.NotFound:
        return False


def started(name):
    c = container(name)
    return c.id, c.attrs["State"]["StartedAt"]


def complete(name, key=None, prompt="hello there"):
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    return httpx.post(
        f"http://127.0.0.1:{PORTS[name]}/v1/completions",
        json={"model": name, "prompt": prompt, "max_tokens": 4}, headers=headers, timeout=10,
    )


def test_deploy_brings_both_stacks_up_and_a_second_deploy_changes_nothing(rig):
    first = run_deploy(rig, SERVING_RIG)
    assert first.returncode == 0, first.output
    for name in PORTS:
        answer = complete(name)
        assert answer.status_code == 200, answer.text
        assert answer.json()["usage"]["completion_tokens"] == 4
    info = httpx.get("http://127.0.0.1:18101/standin/info", timeout=5).json()
    assert info["nvidia_visible_devices"] == "0"  # device_ids reached Docker's NVIDIA device request
    assert info["args"]["model"] == "/models/test-alpha"
    before = {name: started(name) for name in PORTS}

    second = run_deploy(rig, SERVING_RIG, "-v")  # -v: pyinfra names each fact it reads from the rig
    assert second.returncode == 0, second.output
    assert second.changed_operations() == 0, second.output
    assert {name: started(name) for name in PORTS} == before
    # Every question was read ahead, all at once, and none twice: what deploy.py asks up front
    # (the same reads, verification off) is all the roles asked; a role asking anything else
    # would cost a round trip of its own.
    loaded = [line.split("Loaded fact ", 1)[1].split()[0] for line in second.output.splitlines()
              if "Loaded fact " in line]
    serving_rig = load_rig(SERVING_RIG, TEST_CATALOG)
    wanted = [read for reads in (preflight_reads, gpu_report_reads, gpu_policy_reads, surface_reads, serving_reads)
              for read in reads(serving_rig)]
    # Questions of one kind were asked as one (one FileStates command for every role's files).
    sent = [fact for (fact, _), _ in merged_reads(wanted)]
    assert sorted(loaded) == sorted(f"{fact.__module__}.{fact.__name__}" for fact in sent), (sorted(loaded), second.output)
    assert loaded.count("rigkit.plumbing.files.FileStates") == 1, second.output


RUNTIME_USERS = {  # each rig-side script, run so that it stops right after its imports
    "rigkit-stack": "/usr/local/sbin/rigkit-stack",  # usage: exit 2
    "rigkit-watchdog": "/usr/local/sbin/rigkit-watchdog /nonexistent.json",  # cannot read it: exit 2
    "rigkit-gateway": None,  # installed on a gateway's rig only: its template, as python3 -c
    "status probe": None,  # sent as python3 -c by `rigkit status`
}
SOURCES = {"rigkit-gateway": "gateway/rigkit-gateway", "status probe": "status/rigkit-status-probe.py"}


@pytest.mark.parametrize("script", sorted(RUNTIME_USERS))
def test_each_rig_script_imports_the_runtime_from_the_shipped_copy(rig, script):
    """The deploy shipped rigkit/rigside to /usr/local/lib/rigkit/rigside (roles/rigside.py); each
    script imports every runtime module from there (python3 -v names each file it loads), and
    without that copy it does not start: nothing else on the rig stands in for it."""
    import re
    import shlex

    from rigkit.plumbing.render import template_text
    from rigkit.rigside.names import RUNTIME_DIR

    command = RUNTIME_USERS[script] or f"python3 -c {shlex.quote(template_text(SOURCES[script]))} '{{}}'"
    code, out = rig.exec(f"python3 -v {command.removeprefix('python3 ')} 2>&1"
                         if command.startswith("python3") else f"python3 -v {command} 2>&1")
    loaded = set(re.findall(r"(/\S*/rigside/\w+\.py)", out))
    assert loaded, out[-2000:]
    assert {path.rsplit("/", 1)[0] for path in loaded} == {RUNTIME_DIR}, loaded
    assert {"keyfile.py", "names.py"} & {path.rsplit("/", 1)[1] for path in loaded}, loaded
    code, out = rig.exec(f"mv {RUNTIME_DIR} {RUNTIME_DIR}.away && {{ {command} 2>&1; echo exit=$?; }}; "
                         f"mv {RUNTIME_DIR}.away {RUNTIME_DIR}")
    assert "No module named 'rigside'" in out, out[-2000:]
    assert rig.exec(f"test -f {RUNTIME_DIR}/probe.py")[0] == 0


def test_changing_one_model_restarts_only_that_stack(rig, tmp_path):
    before = {name: started(name) for name in PORTS}
    changed = copy_catalog(tmp_path, test_beta=[("STANDIN_DECODE_TOK_S: \"60\"", "STANDIN_DECODE_TOK_S: \"70\"")])
    run = run_deploy(rig, SERVING_RIG, catalog=changed)
    assert run.returncode == 0, run.output
    assert started("test-alpha") == before["test-alpha"]
    assert started("test-beta") != before["test-beta"]
    assert httpx.get("http://127.0.0.1:18102/standin/info", timeout=5).json()["decode_tok_s"] == 70.0
    assert run_deploy(rig, SERVING_RIG, catalog=changed).changed_operations() == 0


def test_a_hang_with_health_200_is_caught_and_rolled_back(rig, tmp_path):
    good = copy_catalog(tmp_path / "good")
    assert run_deploy(rig, SERVING_RIG, catalog=good).returncode == 0
    # The hanging config's own ready timeout is the one waited out: 10 s, the schema's least.
    hanging = copy_catalog(tmp_path / "hang", test_alpha=[("env:\n", "env:\n  STANDIN_FAULT: hang\n"),
                                                         ("ready_timeout_s: 30\n", "ready_timeout_s: 10\n")])

    run = run_deploy(rig, SERVING_RIG, catalog=hanging)

    assert run.returncode != 0
    assert "test-alpha not ready within 10 s" in run.output
    assert "ROLLED BACK: rigkit-test-alpha serves the previous config again" in run.output
    assert "last 40 log lines of rigkit-test-alpha" in run.output
    assert httpx.get("http://127.0.0.1:18101/health", timeout=5).status_code == 200
    assert complete("test-alpha").status_code == 200  # the previous config serves again
    env = container("test-alpha").attrs["Config"]["Env"]
    assert not any(e.startswith("STANDIN_FAULT") for e in env)
    # The failed config is not marked as done: the next deploy tries it again.
    again = run_deploy(rig, SERVING_RIG, catalog=good)
    assert again.returncode == 0 and again.changed_operations() >= 1


def test_a_stack_that_fails_at_start_shows_its_logs(rig, tmp_path):
    failing = copy_catalog(tmp_path, test_beta=[("env:\n", "env:\n  STANDIN_FAULT: fail_at_start\n")])
    rig.exec("rigkit-stack down test-beta")  # nothing to roll back to
    run = run_deploy(rig, SERVING_RIG, catalog=failing)
    assert run.returncode != 0
    assert "CUDA error: out of memory (stand-in fault: fail_at_start)" in run.output
    assert "no previous config to roll back to" in run.output
    assert run_deploy(rig, SERVING_RIG).returncode == 0


def test_api_key_is_root_only_on_the_rig_and_never_in_compose_or_logs(rig, tmp_path):
    key_file = tmp_path / "api.key"
    key_file.write_text("sk-rigkit-test-5ecret\n")
    key_file.chmod(0o600)
    rig_file = tmp_path / "keyed.yml"
    rig_file.write_text(SERVING_RIG.read_text() + f"api_key_file: {key_file}\n")

    run = run_deploy(rig, rig_file)

    assert run.returncode == 0, run.output
    assert "sk-rigkit-test-5ecret" not in run.output
    assert rig.exec("stat -c '%a %U' /etc/rigkit/secrets/vllm-api-key.env")[1].strip() == "600 root"
    assert rig.exec("grep -r sk-rigkit /etc/rigkit/stacks")[0] != 0
    assert complete("test-alpha").status_code == 401
    assert complete("test-alpha", key="sk-rigkit-test-5ecret").status_code == 200

    key_file.chmod(0o644)
    refused = run_deploy(rig, rig_file)
    assert refused.returncode != 0
    assert f"api_key_file {key_file} is readable by others; run chmod 600" in refused.output
    assert run_deploy(rig, SERVING_RIG).returncode == 0


def test_a_model_removed_from_the_rig_file_is_taken_down(rig, tmp_path):
    only_alpha = tmp_path / "alpha-only.yml"
    only_alpha.write_text(SERVING_RIG.read_text().replace("models: [test-alpha, test-beta]", "models: [test-alpha]"))
    run = run_deploy(rig, only_alpha)
    assert run.returncode == 0, run.output
    with pytest.raises(docker.errors.NotFound):
        container("test-beta")
    assert rig.exec("test -d /etc/rigkit/stacks/test-beta")[0] != 0
    assert run_deploy(rig, only_alpha).changed_operations() == 0
    assert run_deploy(rig, SERVING_RIG).returncode == 0
    assert json.loads(rig.exec("cat /etc/rigkit/stacks/test-beta/stack.json")[1])["port"] == 18102


def test_rolling_rollout_stops_at_the_first_failing_rig(rig, tmp_path):
    import os
    import subprocess
    import sys

    from tests.conftest import REPO, STATE_ROOT

    assert run_deploy(rig, SERVING_RIG).returncode == 0  # a working config to roll back to
    # A config that fails at once: any failure stops the rollout, a hang would only wait 30 s longer.
    failing = copy_catalog(tmp_path, test_alpha=[("env:\n", "env:\n  STANDIN_FAULT: fail_at_start\n")])
    env = dict(
        os.environ, RIGKIT_SIM_PORT=str(rig.ssh_port), RIGKIT_STATE=str(STATE_ROOT), RIGKIT_CATALOG_DIR=str(failing),
        RIGKIT_RIG_FILE_A=str(SERVING_RIG), RIGKIT_RIG_FILE_B=str(SERVING_RIG),
    )
    result = subprocess.run(
        [sys.executable, "-m", "rigkit.cli", "rollout", "tests/data/two-rigs.py"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=600,
    )
    out = result.stdout + result.stderr
    assert result.returncode == 1, out
    assert "rig 1/2: rig-a" in out
    assert "STOPPED: rig-a failed; rigs not started: rig-b" in out
    assert "rig 2/2" not in out
    assert complete("test-alpha").status_code == 200  # rig-a rolled back to its working config


def test_new_weights_are_copied_and_the_model_restarted_on_them(rig):
    from tests.simrig.weights import ensure_checkpoint

    assert run_deploy(rig, SERVING_RIG).returncode == 0
    before = {name: started(name) for name in PORTS}
    extra = ensure_checkpoint("test-beta") / "generation_config.json"
    extra.write_text('{"temperature": 0.6}')
    try:
        run = run_deploy(rig, SERVING_RIG)
        assert run.returncode == 0, run.output
        assert "test-beta: copied 20 B of" in run.output  # only the new file
        assert started("test-beta") != before["test-beta"] and started("test-alpha") == before["test-alpha"]
        listing = container("test-beta").exec_run(["ls", "/models/test-beta"]).output.decode().split()
        assert "generation_config.json" in listing
        assert run_deploy(rig, SERVING_RIG).changed_operations() == 0
    finally:
        extra.unlink()


def test_weights_completed_after_the_model_started_get_it_restarted_and_status_says_so(rig, tmp_path):
    """Simulated: a copy that went on after its deploy was killed (its helper container finishes on its own)
    writes the volume's completion marker after the model's container started; here the marker is written
    again by hand, as that helper writes it. Status reports the drift; the next deploy restarts that model,
    and only it; the deploy after changes nothing and status is clean."""
    import os

    from tests.conftest import run_status

    assert run_deploy(rig, SERVING_RIG).returncode == 0
    before = {name: started(name) for name in PORTS}
    from rigkit.status.report import _epoch

    created = _epoch(docker.from_env().containers.get("rigkit-test-beta-vllm-1").attrs["Created"])
    mountpoint = docker.from_env().volumes.get("rigkit-weights-test-beta").attrs["Mountpoint"]
    marker = Path(mountpoint) / ".rigkit" / "complete"
    assert marker.is_file(), marker
    while time.time() < created + 3:  # bounded: the container was created at most seconds ago
        time.sleep(0.2)
    now = time.time()  # the straggling helper's write: after the container started, before the next deploy
    os.utime(marker, (now, now))
    code, text, report = run_status(rig, SERVING_RIG, tmp_path)
    drift = [d for r in report["rigs"] for d in r["drift"] if d["what"] == "test-beta weights"]
    assert drift and "volume completed" in drift[0]["found"], (text, created)
    repair_started = time.monotonic()
    run = run_deploy(rig, SERVING_RIG)
    assert run.returncode == 0, run.output
    print(f"the next deploy restarted test-beta on its completed weights in {time.monotonic() - repair_started:.1f} s")
    assert "Restart test-beta: its weights were completed after it started" in run.output, run.output
    assert started("test-beta") != before["test-beta"] and started("test-alpha") == before["test-alpha"]
    assert run_deploy(rig, SERVING_RIG).changed_operations() == 0
    code, text, report = run_status(rig, SERVING_RIG, tmp_path)
    assert not [d for r in report["rigs"] for d in r["drift"] if d["what"].endswith(" weights")], text


def test_a_weights_helper_a_killed_copy_left_behind_is_removed_by_the_next_deploy(rig):
    """Simulated: the helper container a killed copy leaves (it finished on its own after its controller was
    gone; only the controller removes one), made here with the copier's name and label and left exited, as
    the engine keeps it. It holds the volume in use (`docker volume rm` refuses). The next deploy removes it
    (one operation that names it), copies nothing, and the deploy after changes nothing."""
    from rigkit.rigside.names import WEIGHTS_HELPER_LABEL

    client = docker.from_env()
    image = client.containers.get("rigkit-test-beta-vllm-1").image
    name = "rigkit-weights-test-beta-helper"
    left = client.containers.create(image, ["true"], entrypoint=[], name=name, labels={WEIGHTS_HELPER_LABEL: "test-beta"},
                                    volumes={"rigkit-weights-test-beta": {"bind": "/dst", "mode": "rw"}}, network_mode="none")
    left.start()
    left.wait(timeout=60)
    try:
        run = run_deploy(rig, SERVING_RIG)
        assert run.returncode == 0, run.output
        assert f"Remove weights helpers a killed copy left behind: {name}" in run.output, run.output
        assert not client.containers.list(all=True, filters={"name": f"^{name}$"})
        assert "Weights of test-beta onto volume" not in [line.strip() for line in run.output.splitlines()
                                                          if "Success" in line]  # nothing copied
        assert run_deploy(rig, SERVING_RIG).changed_operations() == 0
    finally:
        try:
            client.containers.get(name).remove(force=True)
        except docker.errors.NotFound:
            pass


P2P_SIM = "test-p2p"  # a bind-mounted model folder holding the rig's gpus.json for the torch stand-in


def tp2_catalog(tmp_path, env: str = ""):
    """test-alpha split over GPUs 0 and 1 (tensor 2), its weights bind-mounted from a folder whose gpu/ holds
    the simulated rig's gpus.json (SimRig.gpu_config_copies), where the stand-in image's torch reads
    `topology.p2p_faults`. `env`: more catalog env lines (an NCCL_ variable gives the P2P check a key of
    its own, so a pass kept by another test is not reused)."""
    ensure_checkpoint(P2P_SIM)
    return copy_catalog(tmp_path, test_alpha=[
        ("gpus: [0]\n", "gpus: [0, 1]\nparallel: {tensor: 2}\n"),
        ("  source: /srv/rigkit-sim-models/test-alpha\n", f"  storage: bind\n  source: {SIM_MODELS / P2P_SIM}\n"),
        ("env:\n", f"env:\n  STANDIN_TORCH_GPU_DIR: /models/test-alpha/gpu\n{env}")])


@contextmanager
def p2p_faults(rig, faults: dict):
    """The simulated rig's GPU pairs misbehave (gpus.json's topology.p2p_faults), until the block ends."""
    rig.gpu_config_copies = (SIM_MODELS / P2P_SIM / "gpu",)
    rig.topology = {"p2p_faults": faults} if faults else None
    rig.write_gpu_config()
    try:
        yield
    finally:
        rig.topology = None
        rig.write_gpu_config()


def only_alpha_rig(tmp_path, extra: str = ""):
    path = tmp_path / "alpha-only.yml"
    path.write_text(SERVING_RIG.read_text().replace("models: [test-alpha, test-beta]", "models: [test-alpha]") + extra)
    return path


def rig_verdicts(rig):
    code, out = rig.exec(f"ls -1 {P2P_VERDICT_DIR} 2>/dev/null; true")
    return sorted(out.split())


def test_a_p2p_check_that_hangs_fails_the_deploy_fast_naming_the_pair_before_vllm_starts(rig, tmp_path):
    """Simulated: GPUs 0 and 1 whose copy never returns (the torch stand-in's `hang` fault, a hung DMA as
    when ACS redirects peer traffic). The P2P check (a container of the model's image) is bounded by the
    rig file's p2p_check_timeout_s (10 s here, each step 5 s): the deploy fails naming GPU0->GPU1, vLLM is
    not started on the new config, nothing is promoted and no pass is kept."""
    import time

    before = started("test-alpha") if _running("test-alpha") else None
    with p2p_faults(rig, {"0-1": "hang"}):
        began = time.monotonic()
        run = run_deploy(rig, only_alpha_rig(tmp_path, "p2p_check_timeout_s: 10\n"),
                         catalog=tp2_catalog(tmp_path, '  NCCL_DEBUG: "WARN"\n'))
        seconds = time.monotonic() - began
    assert run.returncode != 0, run.output
    assert "the P2P check failed at copy GPU0->GPU1: copy GPU0->GPU1 did not finish within 5 s (hung)" in run.output
    assert "vLLM was not started" in run.output
    assert seconds < 120, seconds  # the whole deploy, planning included, inside the 2 minutes
    assert rig_verdicts(rig) == []
    assert (started("test-alpha") if _running("test-alpha") else None) == before  # not (re)started
    code, proven = rig.exec("cat /etc/rigkit/stacks/test-alpha/compose.yml 2>/dev/null; true")
    assert '"--tensor-parallel-size", "2"' not in proven  # the TP2 config was not promoted
    assert not docker.from_env().containers.list(all=True, filters={"name": "p2p-check"})  # the check removed


def test_a_p2p_check_that_reads_back_wrong_bytes_is_refused(rig, tmp_path):
    """Simulated: GPUs 0 and 1 whose copies arrive with one byte changed (the torch stand-in's
    `wrong_bytes` fault): refused at once, naming the pair, with no pass kept."""
    with p2p_faults(rig, {"0-1": "wrong_bytes"}):
        run = run_deploy(rig, only_alpha_rig(tmp_path), catalog=tp2_catalog(tmp_path, '  NCCL_DEBUG: "INFO"\n'))
    assert run.returncode != 0, run.output
    assert "copy GPU0->GPU1: the bytes read back differ from the bytes sent" in run.output
    assert rig_verdicts(rig) == []


def test_a_tensor_parallel_model_on_gpus_without_p2p_gets_vllms_flags_and_is_verified(rig, tmp_path):
    """Simulated: two GeForce cards on one host bridge whose P2P `nvidia-smi topo -p2p r` reports
    "GNS" both ways (the rig's nvidia-smi stand-in prints that matrix; the same as captured from a
    2x RTX 5090 host, tests/data/topology/2x5090-*). The topology preflight reads it before anything
    changes; the P2P check (the torch stand-in: copies and an all-reduce that work) passes before vLLM
    starts and is kept on the rig; the model's compose file gets vLLM's `--disable-custom-all-reduce` and
    NCCL_P2P_DISABLE=1, checked in the engine's own record of the container; the deploy verifies the model
    and records those in the result's provenance. A second deploy neither checks again nor changes anything."""
    only_alpha = only_alpha_rig(tmp_path)
    split = tp2_catalog(tmp_path)
    with p2p_faults(rig, {}):
        run = deploy_and_verify(rig, only_alpha, catalog=split)
        assert run.returncode == 0, run.output
        assert "P2P check of test-alpha (GPUs 0, 1)" in run.output  # the operation ran
        (kept,) = rig_verdicts(rig)  # and its pass is kept on the rig: read it there
        _, text = rig.exec(f"cat {P2P_VERDICT_DIR}/{kept}")
        passed = json.loads(text)
        assert passed["ok"] and [s["step"] for s in passed["pairs"]] == [
            "copy GPU0->GPU1", "copy GPU1->GPU0", "all-reduce GPU0+GPU1"]
        assert "GPU0-GPU1  PHB   GNS" in run.output  # the preflight's table: the link the all-reduce crosses
        assert "P2P not usable (GPU0-GPU1 GNS over PHB)" in run.output
        config = container("test-alpha").attrs["Config"]
        assert "--disable-custom-all-reduce" in config["Cmd"]
        assert config["Cmd"][config["Cmd"].index("--tensor-parallel-size") + 1] == "2"
        assert "NCCL_P2P_DISABLE=1" in config["Env"]
        assert "verification of test-alpha" in run.output  # ran, and passed (a failure fails the deploy)
        verified = json.loads(sorted(p for p in (RESULTS / only_alpha.stem / "test-alpha").glob("*.json")
                                     if not p.name.startswith("gate-"))[-1].read_text())
        assert verified["provenance"]["vllm_args"] == config["Cmd"]  # what the container really runs
        assert verified["provenance"]["vllm_env"] == {"NCCL_P2P_DISABLE": "1"}
        assert complete("test-alpha").status_code == 200
        again = run_deploy(rig, only_alpha, catalog=split)
        assert again.changed_operations() == 0 and "P2P check of test-alpha" not in again.output, again.output
    # `rigkit status` reads the topology again to judge that compose file: no drift.
    import os
    import subprocess
    import sys

    from tests.conftest import REPO, STATE_ROOT

    env = dict(os.environ, RIGKIT_SIM_PORT=str(rig.ssh_port), RIGKIT_STATE=str(STATE_ROOT), RIGKIT_RIG_FILE=str(only_alpha),
               RIGKIT_CATALOG_DIR=str(split), RIGKIT_RESULTS_DIR=str(RESULTS), RIGKIT_STATUS_RIGS="1")
    out = tmp_path / "status.json"
    done = subprocess.run([sys.executable, "-m", "rigkit.cli", "status", "tests/data/status-fleet.py", "--json", str(out)],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    (doc,) = json.loads(out.read_text())["rigs"]
    assert doc["reachable"] and doc["drift"] == [], done.stdout + done.stderr


def test_a_topology_known_to_hang_is_refused_at_deploy_with_the_fix_and_nothing_changed(rig, tmp_path):
    """Simulated: the two GPUs report P2P "OK" (`nvidia-smi topo -p2p r`) while the PCIe switch between them
    redirects peer requests (the rig's lspci stand-in prints the PLX switch capture,
    tests/data/topology/plx-acs-lspci-vvv.txt, ACSCtl ReqRedir+ CmpltRedir+): NCCL start-up hangs on
    such a rig (NVIDIA/nccl#2079). The real pyinfra deploy stops at the preflight, naming the fix, before
    any operation runs: the rig's stack files are as they were."""
    from tests.conftest import DATA, OPERATIONS_STARTED

    p2p_ok = " \tGPU0\tGPU1\t\n GPU0\tX\tOK\t\n GPU1\tOK\tX\t\n"
    lspci = (DATA / "topology" / "plx-acs-lspci-vvv.txt").read_text()
    _, files_before = rig.exec("sha256sum /etc/rigkit/stacks/*/* 2>/dev/null; true")
    rig.topology = {"p2p_r": p2p_ok, "lspci": "\n".join(l for l in lspci.splitlines() if not l.startswith("#"))}
    rig.write_gpu_config()
    try:
        run = run_deploy(rig, only_alpha_rig(tmp_path), catalog=copy_catalog(
            tmp_path, test_alpha=[("gpus: [0]\n", "gpus: [0, 1]\nparallel: {tensor: 2}\n")]))
    finally:
        rig.topology = None
        rig.write_gpu_config()
    assert run.returncode != 0, run.output
    assert "nothing was changed" in run.output
    assert "P2P is reported OK over PCIe (GPU0-GPU1 (PHB)) but PCIe ACS redirects peer requests on 0000:02:01.0" \
        in run.output
    assert "Fix: turn ACS off in the BIOS" in run.output and "topology_override: allow-risky-p2p" in run.output
    assert OPERATIONS_STARTED not in run.output
    assert rig.exec("sha256sum /etc/rigkit/stacks/*/* 2>/dev/null; true")[1] == files_before


def test_each_start_says_where_its_time_went_and_compiled_graphs_outlive_the_container(rig, tmp_path):
    """Each start rigkit-stack proves is cut into phases from the container's own log, and the compile cache
    (a Docker volume, vLLM's cache root) serves the next container: a redeploy and a rollback load what was
    compiled, a graph-changing flag misses and is named. Simulated: vLLM's GPU build compiling (the stand-in's
    STANDIN_COMPILE_S model of it: keys under VLLM_CACHE_ROOT, vLLM 0.32's log lines)."""
    length = 3000
    # The volume outlives every run on this machine: its keys go, so that the first start compiles. (A length
    # taken from the clock once met a key an earlier run had left, and the graph-changing flag loaded it.)
    try:
        cache = Path(docker.from_env().volumes.get("rigkit-compile-cache-test-alpha").attrs["Mountpoint"])
        shutil.rmtree(cache / "torch_compile_cache", ignore_errors=True)
    except docker.errors.NotFound:
        pass

    def catalog(name, length, *more):
        return copy_catalog(tmp_path / name, test_alpha=[
            ("env:\n", 'env:\n  STANDIN_COMPILE_S: "3"\n'), ("  dtype: bfloat16\n", f"  dtype: bfloat16\n  max_model_len: {length}\n"),
            *more])

    def last_start():
        code, out = rig.exec("cat /etc/rigkit/stacks/test-alpha/startup.json")
        assert code == 0, out
        return json.loads(out)

    first = run_deploy(rig, SERVING_RIG, catalog=catalog("first", length))
    assert first.returncode == 0, first.output[-4000:]
    start = last_start()
    phases = {p["phase"]: p["s"] for p in start["phases"]}
    # The stand-in sleeps its 3 s; Docker stamps a line when it reads it from the container (a fresh clone's run
    # once read 2.999 s between them): a miss is near 3 s, a hit near 0.3 s.
    assert start["compile_cache"]["cache"] == "miss" and 2.9 <= phases["compile"] < 10, start
    assert start["to"] == "first token (rigkit's readiness completion)" and "weights load" in phases, start
    assert "start of test-alpha: " in first.output and "compile cache: miss" in first.output, first.output[-4000:]
    # A redeploy that changes nothing the graph depends on: a new container, the graphs loaded from the volume.
    before = started("test-alpha")
    marker = ('  STANDIN_DECODE_TOK_S: "100"\n', '  STANDIN_DECODE_TOK_S: "101"\n')
    again = run_deploy(rig, SERVING_RIG, catalog=catalog("again", length, marker))
    assert again.returncode == 0 and started("test-alpha") != before, again.output[-4000:]
    start = last_start()
    assert start["compile_cache"]["cache"] == "hit" and {p["phase"]: p["s"] for p in start["phases"]}["compile"] < 2, start
    # A graph-changing flag misses, and the start says which flag changed.
    longer = run_deploy(rig, SERVING_RIG, catalog=catalog("longer", length + 1, marker))
    assert longer.returncode == 0, longer.output[-4000:]
    start = last_start()
    assert start["compile_cache"]["cache"] == "miss", start
    assert start["compile_cache"]["changed"] == [f"--max-model-len {length} -> {length + 1}"], start
    assert f"changed since the last start: --max-model-len {length} -> {length + 1}" in longer.output
    # A config that fails at start is rolled back: the last proven one starts again, warm.
    failing = run_deploy(rig, SERVING_RIG, catalog=catalog("failing", length + 1, marker,
                                                            ("env:\n", "env:\n  STANDIN_FAULT: fail_at_start\n")))
    assert failing.returncode != 0 and "ROLLED BACK" in failing.output, failing.output[-4000:]
    start = last_start()
    assert start["compile_cache"]["cache"] == "hit", start
    assert run_deploy(rig, SERVING_RIG).returncode == 0
