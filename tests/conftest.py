"""Shared fixtures: the simulated rig and a runner for the real `pyinfra` CLI."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from rigkit.rigside.names import TUNE_DEADMAN_UNIT
from tests.simrig.rig import STATE_ROOT, SimRig

REPO = Path(__file__).resolve().parents[1]
# The session's rig: `./run test` runs the engine's tests as two processes side by side, the rig_alone
# ones (below) with a rig of their own, named in RIGKIT_TEST_RIG as NAME:PORT. The demo rig uses 2222;
# tests never touch it.
TEST_RIG_NAME, _, _port = os.environ.get("RIGKIT_TEST_RIG", "rigkit-test:2223").partition(":")
TEST_RIG_PORT = int(_port)


@pytest.fixture(scope="session")
def simrig():
    """One simulated rig for the session (tests that need it pristine call .start() again). Its sshd
    allows 4 sessions per connection, as hardened configs do (OpenSSH's default is 10): what rigkit
    runs at once over one connection (rigkit.plumbing.facts_once.read_ahead) must stay within it."""
    rig = SimRig(name=TEST_RIG_NAME, ssh_port=TEST_RIG_PORT, max_sessions=4)
    rig.start(log=lambda m: print(m, file=sys.stderr))
    rig.used = False  # set once a module has used it: the next module gets it started afresh
    yield rig
    rig.remove()


@pytest.fixture(scope="module", autouse=True)
def _rig_fresh_on_entry(request):
    """Each module that uses the session's rig gets it started afresh from its image on entry, when a
    module before it used it: whatever a module deploys (boot units, stacks' files) does not leak into
    the next. One start per module, not one before and one after."""
    items = [item for item in request.session.items if item.module is request.module]
    if not any("simrig" in item.fixturenames for item in items):
        yield
        return
    rig = request.getfixturevalue("simrig")
    if rig.used:
        rig.ready_after_boot_s = 0
        rig.start()
    rig.used = True
    yield


@pytest.fixture(scope="module")
def fresh_rig(simrig):
    """The session's rig, started afresh on entry to the module (_rig_fresh_on_entry)."""
    return simrig


SERVED_TEST_MODELS = {"test-alpha": 18101, "test-beta": 18102}  # tests/data/models, their ports
# The Windows rig's model (tests/data/rigs/windows.yml): test-alpha under a name and port of its own, so
# the Windows modules share nothing on the engine with the Linux ones (they run last: RUN_LAST_MODULES).
WINDOWS_TEST_MODELS = {"win-alpha": 18121}
# test-alpha and test-beta under names and ports of their own, for modules that run beside the test
# models' (RIG_ALONE_MODULES) and serve or read a two-model rig: alone_serving_rig.
ALONE_TEST_MODELS = {"alone-alpha": 18131, "alone-beta": 18132}


def concerns_this_process(name: str, labels: dict) -> bool:
    """Whether an engine object (a container, volume or event, by its name and labels) is this
    process's rig or one rigkit made for the test models. Engine-wide checks ("nothing changed on the
    engine") read only these: the rig_alone tests run beside, in another process, on the same engine.
    Everything a deploy makes on the engine is named or labelled after its model (Compose project
    rigkit-MODEL, volume rigkit-weights-MODEL, the weights helper's label), so a dry run or a status
    that touched the engine for these models is still seen."""
    return name == TEST_RIG_NAME or any(m in text for text in (name, *labels.values()) for m in SERVED_TEST_MODELS)


def remove_test_stacks(models=SERVED_TEST_MODELS) -> None:
    """Remove `models`' stacks (the test models' by default) from the engine by their Compose project
    label, whatever the rig's files say (a rebooted rig forgets them; the containers run on the host's
    engine)."""
    import docker

    client = docker.from_env()
    for name in models:
        for container in client.containers.list(all=True, filters={"label": f"com.docker.compose.project=rigkit-{name}"}):
            container.remove(force=True)


@pytest.fixture(scope="module")
def windows_rig(fresh_rig):
    """The session's rig, fresh, and the checkpoints of windows.yml's models on the host (the rig's
    weights sources, which the simulated Docker Desktop's weights helper binds)."""
    from tests.simrig.weights import ensure_checkpoint

    for name in WINDOWS_TEST_MODELS:
        ensure_checkpoint(name)
    return fresh_rig


@pytest.fixture(scope="module")
def serving_rig(fresh_rig, request):
    """The session's rig, fresh, with the vLLM stand-in image and the checkpoints of the models the
    module serves (its SERVED_MODELS, else the test models); none of their stacks before or after the
    module, and no results history (RESULTS): the rollout gate compares a new config with the last
    proven result, which must be this module's own."""
    import shutil

    from tests.simrig.weights import ensure_checkpoint
    from tests.vllm_standin.image import ensure_standin_image

    models = getattr(request.module, "SERVED_MODELS", SERVED_TEST_MODELS)
    shutil.rmtree(RESULTS, ignore_errors=True)
    ensure_standin_image()
    for name in models:
        ensure_checkpoint(name)
    remove_test_stacks(models)
    yield fresh_rig
    remove_test_stacks(models)


@dataclass
class DeployRun:
    returncode: int
    output: str

    def changed_operations(self) -> int:
        """Operations pyinfra reports as changed, from its results table."""
        return _changed(self.output)


def _changed(output: str) -> int:
    # Results rows: "    <name>   <hosts>   <success>   <error>   <no change>"; changed = success - no change.
    results = output.split("--> Results:", 1)[-1]
    total = 0
    for line in results.splitlines():
        cells = re.split(r"\s{2,}", line.strip())
        if len(cells) == 5 and cells[0] not in ("Operation", "Grand total") and cells[2].isdigit():
            total += int(cells[2]) - (int(cells[4]) if cells[4].isdigit() else 0)
    return total


# What pyinfra prints when it starts running operations (pyinfra_cli/cli.py). Tests that a bad input
# stops a deploy before any operation assert its absence; test_deploy asserts a good deploy prints it,
# so a rewording in pyinfra fails there instead of making those assertions pass vacuously.
OPERATIONS_STARTED = "--> Beginning operation run..."

DATA = REPO / "tests" / "data"
POLICY_RIG = DATA / "rigs" / "policy.yml"
SERVING_RIG = DATA / "rigs" / "serving.yml"
TEST_CATALOG = DATA / "models"


RESULTS = STATE_ROOT / "test-results" / TEST_RIG_NAME  # each engine process its own (serving_rig empties it)


def alone_serving_rig(path: Path, extra: str = "") -> Path:
    """SERVING_RIG serving ALONE_TEST_MODELS instead of the test models, plus `extra`, written to
    `path` (the rig's name is its stem)."""
    text = SERVING_RIG.read_text()
    assert "models: [test-alpha, test-beta]\n" in text
    path.write_text(text.replace("models: [test-alpha, test-beta]", f"models: [{', '.join(ALONE_TEST_MODELS)}]") + extra)
    return path


def copy_catalog(tmp_path: Path, **changes: list[tuple[str, str]]) -> Path:
    """A copy of the test catalog under tmp_path/models, with text replacements per model
    (test_alpha=[(old, new), ...]); each `old` must be in the file."""
    folder = tmp_path / "models"
    folder.mkdir(parents=True, exist_ok=True)
    for source in TEST_CATALOG.glob("*.yml"):
        text = source.read_text()
        for old, new in changes.get(source.stem.replace("-", "_"), []):
            assert old in text, old
            text = text.replace(old, new)
        (folder / source.name).write_text(text)
    return folder


def run_deploy(rig: SimRig, rig_file: str | Path = POLICY_RIG, *extra: str, catalog: Path = TEST_CATALOG,
               entry: str = "deploy.py", inventory: str = "inventory/sim.py", verify: bool = True) -> DeployRun:
    """The real pyinfra CLI against `rig`, started the way `rigkit deploy` starts it
    (rigkit/plumbing/pyinfra_start.py; tests/test_deploy_safety.py runs plain `pyinfra`). `verify=False` skips the verification a changing deploy ends
    with (`rigkit deploy --no-verify`), for tests about other roles: it saves a benchmark per deploy."""
    extra = extra if verify else ("--data", "rigkit_verify=never", *extra)
    env = dict(
        os.environ, RIGKIT_SIM_PORT=str(rig.ssh_port), RIGKIT_RIG_FILE=str(rig_file),
        RIGKIT_CATALOG_DIR=str(catalog), RIGKIT_STATE=str(STATE_ROOT), RIGKIT_RESULTS_DIR=str(RESULTS),
    )
    proc = subprocess.run(
        [sys.executable, "-m", "rigkit.plumbing.pyinfra_start", "-y", *extra, inventory, entry],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=600,
    )
    return DeployRun(proc.returncode, proc.stdout + proc.stderr)


def run_status(rig: SimRig, rig_file: Path, tmp_path: Path, timeout: int = 300, catalog: Path = TEST_CATALOG,
               results: Path = RESULTS) -> tuple[int, str, dict]:
    """The real `rigkit status` CLI against `rig` (one inventory host, tests/data/status-fleet.py) serving
    `rig_file` from `catalog`: (exit code, what it printed, its --json document)."""
    env = dict(os.environ, RIGKIT_SIM_PORT=str(rig.ssh_port), RIGKIT_STATE=str(STATE_ROOT),
               RIGKIT_RIG_FILE=str(rig_file), RIGKIT_CATALOG_DIR=str(catalog), RIGKIT_RESULTS_DIR=str(results))
    out = tmp_path / "status.json"
    proc = subprocess.run([sys.executable, "-m", "rigkit.cli", "status", "tests/data/status-fleet.py", "--json", str(out)],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)
    text = proc.stdout + proc.stderr
    assert out.is_file(), text
    return proc.returncode, text, json.loads(out.read_text())


# Fixtures that need the Docker engine (the simulated rig, a stack or image on the host's engine).
ENGINE_FIXTURES = {"simrig"}

# Modules whose tests touch nothing on the host's engine but their own simulated rig(s) and things
# named for themselves: no test model's stack, volume or port (test-alpha, test-beta), nothing
# under RESULTS but their own. The gateway's module has its own models, ports and second rig;
# test_hung_tools, test_monitoring and test_watchdog_rig serve ALONE_TEST_MODELS, and test_monitoring
# alone uses Prometheus's ports. `./run test` runs them in an engine process of their own, with a rig
# of their own, beside the others. A module not listed runs with the test models' modules: the safe
# default for a new module. The split balances the two processes' minutes (the durations tables
# `./run test` prints): the Windows modules, which serve win-alpha, could run beside too, and run
# with the test models' modules for that. Two engine processes, not three: on two cores a third
# made the timing-based tests flaky (tune's and the benchmarks' measurements, the gate's bands).
RIG_ALONE_MODULES = {
    "test_base", "test_deploy", "test_gateway", "test_gpu_offsets", "test_monitoring", "test_simrig", "test_watchdog_rig", "test_weights", "test_weights_relay_rigs",
    "test_winconnector",
}


# Modules `./run test` runs in a process after another one in the same slot (SECOND_IN_SLOT_MODULES), each
# process with a rig of its own, so that no process passes its 12 minutes: the Windows modules (WINDOWS_MODULES,
# all of them together: they share one simulated Windows rig's engine objects; 12:32 of 12 minutes in the test
# models' process once) after the tests without an engine, and test_gpu_keeper and test_hung_tools (bounds too)
# after the rig-alone process (11:49 of 12 minutes with them in it once), and test_weights_hub (a second rig
# of its own) and test_ondemand (on-demand models) with them. Then the modules of RUN_LAST_MODULES,
# alone, after every slot: the tier on the real vLLM (its CPU build, tests/vllm_engine), whose starts and
# benchmarks take both cores for half a minute or more and would make the timing-based tests beside them
# flaky, and whose gate measures (beside the Windows modules, it once passed the config without the drafter
# 78% slower at a CV of 26.8%), followed by test_tune_rig (11:10 of 12 minutes in the rig-alone process once
# the benchmark calibrated its prompts). test_rollout_gate runs there too: its gate judges the stand-in's pacing,
# which slows under a loaded machine (beside the gateway's rotation under load, a config slower on its first
# start read a runs' CV of 9.6%, which widened the line and skipped the second look the test is about), and the
# test models' process was at 10:29 of its 12 minutes with it.
WINDOWS_MODULES = {
    "test_windows_deploy", "test_windows_docker_standin", "test_windows_install_dir", "test_windows_key",
    "test_windows_preflight", "test_windows_scripts", "test_windows_verify", "test_windows_weights",
}
SECOND_IN_SLOT_MODULES = {*WINDOWS_MODULES, "test_gpu_keeper", "test_hung_tools", "test_weights_hub", "test_ondemand"}
RUN_LAST_MODULES = {"test_engine", "test_tune_rig", "test_surface_scan", "test_rollout_gate"}  # alone


def pytest_collection_modifyitems(config, items):
    """Every test that uses the simulated rig (directly or through fresh_rig, serving_rig, ...) is
    marked simrig, so `-m "not simrig"` leaves out exactly what needs an engine: `./run quick`
    runs those alone, `./run test` runs them beside the simrig tests, in a second process. The
    engine's tests of RIG_ALONE_MODULES are also marked rig_alone (a third process), those of
    SECOND_IN_SLOT_MODULES second_in_slot (and windows, of WINDOWS_MODULES: each after one of the other
    processes), those of RUN_LAST_MODULES run_last (alone, after all of them)."""
    for item in items:
        if ENGINE_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.simrig)
        module = item.module.__name__.rpartition(".")[2]
        if module in RIG_ALONE_MODULES:
            item.add_marker(pytest.mark.rig_alone)
        if module in RUN_LAST_MODULES:
            item.add_marker(pytest.mark.run_last)
        if module in SECOND_IN_SLOT_MODULES:
            item.add_marker(pytest.mark.second_in_slot)
        if module in WINDOWS_MODULES:
            item.add_marker(pytest.mark.windows)



def wait_for(what: str, check, timeout_s: float, every_s: float = 0.25):
    """Poll `check()` until it returns something true, within timeout_s: that value; else fail naming `what`."""
    deadline = time.monotonic() + timeout_s
    while not (value := check()):
        assert time.monotonic() < deadline, f"waited {timeout_s} s for {what}"
        time.sleep(every_s)
    return value


@contextmanager
def keeper_held_off(rig: SimRig):
    """The GPU policy keeper holding off on `rig`, as it does while `rigkit tune` holds its session (the
    tune's dead man's switch timer active): a limit set by hand then stays, so a test can show what a
    deploy or a verification makes of it. Without this the keeper repairs it within seconds, racing
    the test."""
    code, out = rig.exec(f"systemd-run --unit={TUNE_DEADMAN_UNIT} --on-active=600s /bin/true")
    assert code == 0, out
    try:
        yield
    finally:
        rig.exec(f"systemctl stop {TUNE_DEADMAN_UNIT}.timer")
