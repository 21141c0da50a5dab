"""Bounded reads without a rig: a hung nvidia-smi or docker is reported as not answering, never as
a missing volume or a drift to repair, and the shell facts' own commands kill what they start.

One test runs a fact's real command in a local shell with a hanging `nvidia-smi` first on PATH
(the simulated rig's version is tests/test_hung_tools.py)."""

from __future__ import annotations

import os
import subprocess
import time

from rigkit.gpu.facts import NvidiaDriverAndGpus
from rigkit.gpu.nvsmi import parse_query
from rigkit.preflight.checks import driver_problems
from rigkit.preflight.facts import DockerDiskFree, NvidiaDriver
from rigkit.plumbing.rig_reads import NVIDIA_SMI_S
from rigkit.serving.facts import RigkitStacks
from rigkit.weights.facts import WeightsVolumeStates
from tests.test_status_report import RIG, gpus, probe, status, weights


def test_every_shell_read_of_nvidia_smi_and_docker_is_bounded():
    commands = [NvidiaDriverAndGpus().command(), NvidiaDriver().command(), DockerDiskFree().command(),
                RigkitStacks().command("/etc/rigkit/stacks"), WeightsVolumeStates().command((("v", "/srv/m"),))]
    for command in commands:
        for tool in ("nvidia-smi ", "docker "):
            calls = command.count(f"$({tool}") + command.count(f"; {tool}")
            assert calls == 0, (tool, command)  # each call starts with `timeout -k 2 N`
    assert "timeout -k 2 8 nvidia-smi" in commands[0] and "timeout -k 2 10 docker" in commands[4]


def test_a_timed_out_nvidia_smi_is_no_answer_and_stops_the_preflight_with_one_line():
    report = parse_query(["rigkit-nvidia-smi-exit=124"])
    assert report.error == "nvidia-smi did not answer within 8 s (a wedged GPU or driver)" and report.gpus == ()
    driver = NvidiaDriver().process(["module-sys=580.95.05", "rigkit-exit=124"])
    (problem,) = driver_problems(RIG, driver)
    assert problem.startswith("nvidia-smi did not answer within 8 s (a wedged GPU or driver): check the driver")


def test_status_reports_a_hung_tool_as_not_read_never_as_drift():
    hung = {m.name: {"status": "error", "error": "docker did not answer within 6 s", "timed_out": "docker"}
            for m in RIG.models}
    doc = status(report=parse_query(["rigkit-nvidia-smi-exit=124"]), volume_states=hung)
    assert doc["drift"] == [], doc["drift"]
    details = [f"{f['what']}: {f['detail']}" for f in doc["failures"]]
    assert "GPUs: not read: nvidia-smi did not answer within 8 s (a wedged GPU or driver); on the rig: `dmesg`, " \
           "then a GPU reset or a reboot" in details
    assert [d for d in details if d.startswith("weights volume")] == [
        f"weights volume rigkit-weights-{m.name}: not read: docker did not answer within 6 s" for m in RIG.models]
    assert status(report=gpus(), volume_states=weights())["ok"]


def test_the_drivers_fact_kills_a_hung_nvidia_smi_and_asks_it_once(tmp_path):
    fake = tmp_path / "nvidia-smi"
    fake.write_text(f"#!/bin/sh\necho started >> {tmp_path}/starts\nexec sleep 613.25\n")
    fake.chmod(0o755)
    env = dict(os.environ, PATH=f"{tmp_path}:{os.environ['PATH']}")
    started = time.monotonic()
    done = subprocess.run(["bash", "-c", NvidiaDriverAndGpus().command()], capture_output=True, text=True, env=env,
                          timeout=60)
    wall = time.monotonic() - started
    assert NVIDIA_SMI_S <= wall < NVIDIA_SMI_S + 3, wall
    answer = NvidiaDriverAndGpus().process(done.stdout.splitlines())
    assert answer.driver.error == answer.gpus.error == "nvidia-smi did not answer within 8 s (a wedged GPU or driver)"
    assert (tmp_path / "starts").read_text().count("started") == 1  # not asked again after the limit
    time.sleep(0.5)
    left = subprocess.run(["pgrep", "-f", "sleep 613.25"], capture_output=True, text=True).stdout
    assert left == "", left
    assert probe()  # (the status report's fixtures, reused above)
