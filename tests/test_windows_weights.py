"""Weights onto a Docker volume on a Windows rig: `pyinfra tests/data/windows-rig.py deploy.py`.

Real: pyinfra's CLI, deploy.py and the Windows role; rigkit's `@winssh` connector over real SSH;
the Docker Engine API over that SSH connection (the docker SDK through `docker.exe system
dial-stdio`, run by the rig's sshd); real Docker volumes and helper containers; the copier
(templates/weights/rigkit-copy.py) with its manifest, marker and resume; the read-only check
container of the Windows fact.

Simulated: Windows (tests/simrig/powershell.exe runs no PowerShell: for the weights fact it runs
the script's two `docker.exe` command lines, each killed at the script's deadline; a slow Docker
Desktop is simulated by making docker.exe answer late) and Docker Desktop (tests/simrig/docker.exe, the host's
Linux dockerd behind it): a Windows bind source `C:\\models\\win-alpha` is resolved to the host
folder that is the rig's drive C:, as Docker Desktop resolves it to the Windows folder. The host
engine refuses a `C:\\...` source, so a copy that succeeds went through that translation. The
9P share's slowness is not simulated.
"""

from __future__ import annotations

import shutil
import threading
import time

import docker
import pytest

from rigkit.windows.facts import INSPECT_TIMEOUT_S
from rigkit.windows.names import TASK_BOOTSTRAP
from tests.conftest import DATA, WINDOWS_TEST_MODELS, copy_catalog, remove_test_stacks, run_deploy
from tests.test_weights import make_checkpoint, sha256s
from tests.vllm_standin.image import STABLE_TAG, ensure_standin_image

WIN_RIG = DATA / "rigs" / "windows.yml"
INVENTORY = "tests/data/windows-rig.py"
VOLUME = "rigkit-weights-win-alpha"
HELPER = "rigkit-weights-win-alpha-helper"
SOURCE = r"C:\models\win-alpha"
RUNS = "/var/lib/rigkit-winsim/runs.log"  # the simulated task runs, in order

pytestmark = pytest.mark.simrig


def _remove_volume(client) -> None:
    remove_test_stacks(WINDOWS_TEST_MODELS)
    for volume in client.volumes.list(filters={"name": VOLUME}):
        volume.remove(force=True)


@pytest.fixture(scope="module")
def client():
    ensure_standin_image()
    return docker.from_env()


@pytest.fixture(scope="module")
def rig(fresh_rig, client, tmp_path_factory):
    """The rig fresh, no win-alpha volume, and a catalog whose win-alpha comes from `C:\\models\\win-alpha`."""
    _remove_volume(client)
    catalog = copy_catalog(tmp_path_factory.mktemp("win-weights"),
                           win_alpha=[("source: /srv/rigkit-sim-models/win-alpha", f"source: '{SOURCE}'")])
    fresh_rig.catalog = catalog
    yield fresh_rig
    _remove_volume(client)


def source_folder(rig):
    return rig.windows_drive / "models" / "win-alpha"  # the host folder behind C:\models\win-alpha


def deploy(rig):
    return run_deploy(rig, WIN_RIG, catalog=rig.catalog, inventory=INVENTORY, verify=False)


def volume_listing(client) -> dict[str, tuple[str, float]]:
    """{path: (sha256, mtime)} of every file in the volume, state files included, read by a separate
    container (not by rigkit's helper)."""
    out = client.containers.run(
        STABLE_TAG, ["sh", "-c", "cd /v && find . -type f -printf '%T@ ' -exec sha256sum {} \\;"],
        entrypoint=[], volumes={VOLUME: {"bind": "/v", "mode": "ro"}}, remove=True,
    ).decode()
    listing = {}
    for line in out.splitlines():
        mtime, digest, path = line.split(maxsplit=2)
        listing[path[2:]] = (digest, float(mtime))
    return listing


def progress_shards(client) -> int:
    out = client.containers.run(STABLE_TAG, ["sh", "-c", "grep -c safetensors /v/.rigkit/progress.jsonl"], entrypoint=[],
                                volumes={VOLUME: {"bind": "/v", "mode": "ro"}}, remove=True)
    return int(out.decode().strip())


def test_first_deploy_fills_the_volume_from_the_windows_folder_marker_last(rig, client):
    make_checkpoint(source_folder(rig), shards=3, shard_bytes=2 << 20)
    run = deploy(rig)
    assert run.returncode == 0, run.output
    assert "win-alpha: copied" in run.output and f"into volume {VOLUME}" in run.output
    rig.exec("nvidia-smi -pl 330")  # the fake task ran no policy script: set the limits it would have

    listing = volume_listing(client)
    state = {p: v for p, v in listing.items() if p.startswith(".rigkit/")}
    files = {p: digest for p, (digest, _) in listing.items() if not p.startswith(".rigkit/")}
    assert files == sha256s(source_folder(rig))
    assert set(state) == {".rigkit/progress.jsonl", ".rigkit/manifest.json", ".rigkit/complete"}
    marker = state[".rigkit/complete"][1]
    assert all(mtime <= marker for _, mtime in listing.values())  # the marker was written last
    assert state[".rigkit/manifest.json"][1] >= max(mtime for p, (_, mtime) in listing.items() if p in files)
    # The copy marked the model to be recreated by the bootstrap's compose up.
    assert (rig.windows_drive / "ProgramData" / "rigkit" / "recreate" / "win-alpha.txt").is_file()
    # The copier the Windows fact runs from is on the rig's C: drive.
    assert (rig.windows_drive / "ProgramData" / "rigkit" / "weights" / "rigkit-copy.py").is_file()


def test_second_deploy_changes_nothing_and_the_fact_read_only(rig, client):
    before = volume_listing(client)
    run = deploy(rig)
    assert run.returncode == 0, run.output
    assert run.changed_operations() == 0, run.output
    assert volume_listing(client) == before
    assert client.containers.list(all=True, filters={"label": "rigkit.weights-check"}) == []  # removed
    code, scripts = rig.exec("grep -l '^# rigkit: weights-check' /var/log/rigkit-winsim/*.ps1")
    assert code == 0 and scripts.split(), "the fact's PowerShell was sent"


def test_a_docker_that_does_not_answer_is_waited_for_at_most_its_deadline_and_named(rig, client):
    """docker.exe answering 45 s late: the fact's `volume inspect` is stopped at INSPECT_TIMEOUT_S, the
    deploy says what it waited for, and the copy operation checks through its own helper instead."""
    before = volume_listing(client)
    rig.exec(f"mkdir -p /var/lib/rigkit-winsim && echo {INSPECT_TIMEOUT_S + 15} > /var/lib/rigkit-winsim/docker-exe-delay-s")
    started = time.monotonic()
    try:
        run = deploy(rig)
    finally:
        rig.exec("rm -f /var/lib/rigkit-winsim/docker-exe-delay-s")
    assert run.returncode == 0, run.output
    assert (f"weights check of win-alpha: docker.exe volume inspect {VOLUME} did not answer within "
            f"{INSPECT_TIMEOUT_S} s (is Docker Desktop running?); the copy checks again itself") in run.output
    assert time.monotonic() - started >= INSPECT_TIMEOUT_S  # it did wait for the deadline, not less
    assert "win-alpha: copied" not in run.output  # the helper found the volume complete
    assert volume_listing(client) == before
    assert deploy(rig).changed_operations() == 0


def test_an_interrupted_copy_leaves_no_marker_and_the_next_deploy_resumes(rig, client):
    shutil.rmtree(source_folder(rig))  # every file new: a resume is then the only way to copy less than all
    make_checkpoint(source_folder(rig), shards=6, shard_bytes=64 << 20, seed=1)
    expected = sha256s(source_folder(rig))
    done_before = progress_shards(client)  # shards the first copy finished
    env_run = {}
    worker = threading.Thread(target=lambda: env_run.setdefault("run", deploy(rig)))
    worker.start()
    killed = False
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and worker.is_alive() and not killed:
        time.sleep(0.05)
        try:
            helper = client.containers.get(HELPER)
            if helper.attrs["Args"][2] != "copy":  # the helper's first run only checks
                continue
            out = helper.exec_run(["sh", "-c", "grep -c safetensors /dst/.rigkit/progress.jsonl"])
            if out.exit_code == 0 and int(out.output.strip() or 0) > done_before:  # a new shard finished
                helper.kill()
                killed = True
        except (docker.errors.NotFound, docker.errors.APIError, ValueError):
            continue
    worker.join(timeout=300)
    assert killed, "the copy finished before it could be interrupted"
    failed = env_run["run"]
    assert failed.returncode != 0, failed.output
    assert ".rigkit/complete" not in volume_listing(client)
    marker = rig.windows_drive / "ProgramData" / "rigkit" / "recreate" / "win-alpha.txt"
    marker.unlink(missing_ok=True)  # left by the first deploy's copy (the simulated task does not remove it)
    runs_before = rig.exec(f"cat {RUNS}")[1].split()

    resumed = deploy(rig)
    assert resumed.returncode == 0, resumed.output
    # The weights changed under the model: the bootstrap ran again (same files, no drift) to recreate it.
    assert rig.exec(f"cat {RUNS}")[1].split() == [*runs_before, TASK_BOOTSTRAP]
    assert marker.is_file()
    line = next(line for line in resumed.output.splitlines() if "win-alpha: copied" in line)
    copied, total = line.split("copied ", 1)[1].split(", ")[0].split(" of ")
    assert copied != total, line  # finished files were kept, not copied again
    listing = volume_listing(client)
    assert ".rigkit/complete" in listing
    assert {p: d for p, (d, _) in listing.items() if not p.startswith(".rigkit/")} == expected
    assert deploy(rig).changed_operations() == 0
