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
import tqdm

from rigkit.rigside.names import TUNE_DEADMAN_UNIT
from tests.simrig.rig import STATE_ROOT, SimRig

REPO = Path(__file__).resolve().parents[1]
# No tqdm monitor thread (huggingface_hub's progress bars start one, in the tests that run its client in this
# process): a test process's first import of pyinfra's CLI patches threading with gevent, and made while
# that thread lived it failed with "RuntimeError: cannot release un-acquired lock" (test_hub_standin, then
# test_weights_relay's first load_inventory, in one `./run quick` group).
tqdm.tqdm.monitor_interval = 0
# The session's rig: `./run test` runs the engine's tests as several processes (PROCESS_MODULES, below),
# each with a rig of its own, named in RIGKIT_TEST_RIG as NAME:PORT. The demo rig uses 2222;
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
# the Windows modules share nothing on the engine with the Linux ones (they run in a process of their own: PROCESS_MODULES).
WINDOWS_TEST_MODELS = {"win-alpha": 18121}
# test-alpha and test-beta under names and ports of their own, for modules that run beside the test
# models' (PROCESS_MODULES) and serve or read a two-model rig: alone_serving_rig.
ALONE_TEST_MODELS = {"alone-alpha": 18131, "alone-beta": 18132}


def concerns_this_process(name: str, labels: dict) -> bool:
    """Whether an engine object (a container, volume or event, by its name and labels) is this
    process's rig or one rigkit made for the test models. Engine-wide checks ("nothing changed on the
    engine") read only these: other processes' tests run beside (PROCESS_MODULES), on the same engine.
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

# Which pytest process of `./run test` runs each module that uses the engine (tests marked simrig), and
# with it which rig: `./run test` gives each process a rig of its own (RIGKIT_TEST_RIG) and runs it with
# `--rigkit-process NAME`. A module not named here runs in "test-models", with the test models' stacks,
# volumes and ports (test-alpha, test-beta): the safe default for a new module. Every other process's
# modules touch nothing on the host's engine but their own rig(s) and things named for themselves
# (ALONE_TEST_MODELS, WINDOWS_TEST_MODELS, the gateway's gw-chat-a and gw-chat-b), nothing under RESULTS
# but their own. A test that uses no engine runs in "no-engine". The layout, the slots the processes run
# in and the minutes that chose it: docs/testing.md. Why these groups:
# - the Windows modules stay together: they share one simulated Windows rig's engine objects;
# - test_gateway has a process of its own (its rotations and kills under load took the rig-alone process
#   to 12:02 of its 12 minutes on CI);
# - "engine" and "engine-gate" run alone, after every slot: the real vLLM's starts and benchmarks take
#   both cores for half a minute or more and would make the timing-based tests beside them flaky, and
#   the gates measure (beside the Windows modules, the real gate once passed the config without the
#   drafter 78% slower at a CV of 26.8%; beside the gateway's rotation, the stand-in's pacing read a CV of
#   9.6%). Together they took 11:26 of their 12 minutes in a fresh clone.
WINDOWS_MODULES = {
    "test_windows_deploy", "test_windows_docker_standin", "test_windows_install_dir", "test_windows_key",
    "test_windows_preflight", "test_windows_scripts", "test_windows_verify", "test_windows_weights",
}
PROCESS_MODULES = {
    "rig-alone": {"test_base", "test_deploy", "test_gpu_offsets", "test_monitoring", "test_simrig",
                  "test_watchdog_rig", "test_weights", "test_weights_relay_rigs", "test_winconnector"},
    "gateway": {"test_gateway"},
    "bounded-waits": {"test_gpu_keeper", "test_hung_tools", "test_weights_hub", "test_ondemand"},
    "windows": WINDOWS_MODULES,
    "engine": {"test_engine", "test_surface_scan"},
    "engine-gate": {"test_tune_rig", "test_rollout_gate"},
}
PROCESSES = ("test-models", *PROCESS_MODULES, "no-engine")


def pytest_addoption(parser):
    parser.addoption("--rigkit-process", choices=PROCESSES, default=None,
                     help="run only this process's tests (tests/conftest.py PROCESS_MODULES; docs/testing.md)")


def process_of(item) -> str:
    """The process of `./run test` that runs this test (PROCESS_MODULES)."""
    if "simrig" not in item.keywords:
        return "no-engine"
    module = item.module.__name__.rpartition(".")[2]
    return next((name for name, modules in PROCESS_MODULES.items() if module in modules), "test-models")


def pytest_collection_modifyitems(config, items):
    """Every test that uses the simulated rig (directly or through fresh_rig, serving_rig, ...) is
    marked simrig, so `-m "not simrig"` leaves out exactly what needs an engine: `./run quick` runs
    those alone. With --rigkit-process, only that process's tests are kept (process_of); the others are
    deselected."""
    for item in items:
        if ENGINE_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.simrig)
    wanted = config.getoption("--rigkit-process")
    if wanted is None:
        return
    kept = [item for item in items if process_of(item) == wanted]
    config.hook.pytest_deselected(items=[item for item in items if process_of(item) != wanted])
    items[:] = kept



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
