"""rigkit.status.report and table: the rig's facts set against its config, without a rig. Pure;
the facts are written here as the probe and nvidia-smi would answer. Simulates nothing else."""

from __future__ import annotations

import copy
import re
from datetime import datetime, timedelta, timezone

from rigkit.config.loader import load_rig
from rigkit.gpu.nvsmi import GpuReport, GpuStatus
from rigkit.status.collect import wanted_files
from rigkit.status.report import Commands, build_status, unreachable
from rigkit.status.table import status_table
from tests.conftest import SERVING_RIG, TEST_CATALOG

NOW = datetime(2025, 1, 2, 12, 0, tzinfo=timezone.utc)
RIG = load_rig(SERVING_RIG, TEST_CATALOG)
COMMANDS = Commands("inv.py", "rig1")


def gpus(limit_w=330.0, enforced_w=None, persistence=True) -> GpuReport:
    return GpuReport(tuple(GpuStatus(i, "NVIDIA GeForce RTX 4090", f"GPU-{i}", limit_w if i == 0 else 330.0,
                                     (enforced_w or limit_w) if i == 0 else 330.0, 450.0, 150.0, 450.0,
                                     persistence, 3105, 49140) for i in (0, 1)))


def probe(rig=RIG) -> dict:
    wanted = wanted_files(rig)
    stacks = {}
    for m in rig.models:
        files = {"compose.yml": wanted[m.name]["compose.yml"], "stack.json": wanted[m.name]["stack.json"]}
        stacks[m.name] = {"deployed": True, "files": files, "containers_error": None,
                          "containers": [{"name": f"rigkit-{m.name}-vllm-1", "status": "running", "running": True,
                                          "restart_count": 0, "started_at": "t", "image_id": "sha256:aa",
                                          "config_image": m.spec.image}],
                          "catalog_image": {"id": "sha256:aa", "repo_digests": []},
                          "ready": {"ok": True, "seconds": 0.01, "error": None, "port": m.spec.port}}
    return {"driver_version": "580.95.05", "driver_error": None,
            "gpu_unit": {"load": "loaded", "enabled": "enabled", "active": "active", "result": "success",
                         "exit_status": "0", "started": "Thu 2025-01-02", "journal": ["rigkit-gpu-policy: applied"]},
            "watchdog": {"timer": {"enabled": "enabled", "active": "active"}, "models": {}},
            "stacks": stacks, "stacks_on_rig": [m.name for m in RIG.models],
            "volumes": {f"rigkit-weights-{m.name}": {"exists": True, "manifest_files": 2, "missing_files": [],
                                                     "resized_files": []} for m in RIG.models}}


def weights(status="unchanged", rig=RIG) -> dict:
    return {m.name: {"status": status, "complete": status == "unchanged"} for m in rig.models}


def results(passed=True, rig=RIG) -> dict:
    return {m.name: {"time": (NOW - timedelta(hours=2)).isoformat(), "passed": passed, "regressions": [],
                     "checks": [{"name": "decode", "passed": passed, "message": "60 tok/s"}]} for m in rig.models}


def status(report=None, facts=None, volume_states=None, verified=None) -> dict:
    return build_status(RIG, "rig1", COMMANDS, report or gpus(), facts or probe(), volume_states or weights(),
                        wanted_files(RIG), verified or results(), NOW, "rigkit-gpu-policy.service")


def test_a_rig_as_deployed_is_ok():
    doc = status()
    assert doc["ok"] and doc["drift"] == [] and doc["failures"] == [], doc
    assert doc["verification"][0]["age_s"] == 7200
    assert ": OK" in status_table(doc)


def test_each_difference_is_drift_with_its_repair():
    facts = probe()
    facts["gpu_unit"]["enabled"] = "disabled"
    facts["stacks"]["test-beta"]["containers"][0].update(running=False, status="exited")
    facts["stacks"]["test-alpha"]["files"]["compose.yml"] = "0" * 64
    facts["volumes"]["rigkit-weights-test-alpha"]["missing_files"] = ["model.safetensors"]
    facts["stacks_on_rig"].append("old-model")
    doc = status(gpus(limit_w=300.0), facts)
    drift = {d["what"]: d["repair"] for d in doc["drift"]}
    deploy = "rigkit deploy inv.py --limit rig1"
    assert drift == {
        "GPU 0 power limit": deploy, "rigkit-gpu-policy.service at boot": deploy, "stack test-beta": deploy,
        "stack test-alpha files": deploy, "stack old-model": deploy,
        "weights volume rigkit-weights-test-alpha files": deploy + " --verify-weights",
    }
    assert not doc["ok"]
    assert "DRIFT  GPU 0 power limit: 300 W; wanted 330 W\n       repair: " + deploy in status_table(doc)


def test_what_is_wrong_but_not_drift_is_a_failure():
    facts = probe()
    facts["stacks"]["test-alpha"]["ready"] = {"ok": False, "seconds": 15, "error": "no completion within 15 s",
                                              "port": 18101}
    facts["stacks"]["test-beta"]["catalog_image"]["id"] = "sha256:bb"  # the tag names another image now
    doc = status(gpus(limit_w=330.0, enforced_w=106.0), facts, verified=results(passed=False))
    failures = {f["what"] for f in doc["failures"]}
    assert failures == {"GPU 0 enforced power limit", "stack test-alpha readiness", "verification of test-alpha",
                        "verification of test-beta"}
    assert {d["what"] for d in doc["drift"]} == {"stack test-beta image digest"}
    assert "rigkit-stack rollout test-alpha recreate" in next(
        f["repair"] for f in doc["failures"] if f["what"] == "stack test-alpha readiness")


def test_weights_and_policy_unit_states():
    facts = copy.deepcopy(probe())
    facts["gpu_unit"].update(started=None, journal=[])
    doc = status(facts=facts, volume_states=weights("needed"))
    assert {d["what"] for d in doc["drift"]} == {"weights volume rigkit-weights-test-alpha",
                                                 "weights volume rigkit-weights-test-beta"}
    assert [f["what"] for f in doc["failures"]] == ["rigkit-gpu-policy.service"]  # did not run this boot


def test_an_unreachable_rig_is_reported_not_raised():
    doc = unreachable("rig9", "Could not connect (Connection refused)", NOW)
    assert not doc["ok"] and not doc["reachable"]
    assert "UNREACHABLE" in status_table(doc) and "Connection refused" in status_table(doc)


def test_a_windows_rigs_scheduled_tasks_stand_for_the_units():
    """rigkit.windows.status hands the report its tasks (registered, as rendered, last successful run
    on the installed files): each wrong state is drift or a failure with the deploy as repair; no
    persistence-mode drift on Windows (WDDM has none); the readiness repair is the caller's."""
    win = load_rig(SERVING_RIG.parent / "windows.yml", TEST_CATALOG)
    facts = {"stacks": {"win-alpha": {**probe(win)["stacks"]["win-alpha"],
                                      "ready": {"ok": False, "error": "HTTP 503", "port": 18121}}}, "volumes": {}}
    tasks = {"GPU-PowerPolicy": {"registered": True, "as_rendered": True, "applied": False},
             "LocalLLM-Bootstrap": {"registered": True, "as_rendered": False, "applied": True},
             "LocalLLM-Watchdog": {"registered": False, "as_rendered": False, "applied": None}}
    windows = Commands("inv.py", "@winssh/rig1", admin="an elevated administrator (PowerShell)")
    doc = build_status(win, "rig1", windows, gpus(persistence=False), facts, weights(rig=win), wanted_files(win),
                       results(rig=win), NOW, "GPU-PowerPolicy", scheduled_tasks=tasks,
                       recreate=lambda name: windows.on_rig(f"recreate {name}"))
    assert [(d["what"], d["found"]) for d in doc["drift"]] == [
        ("scheduled task LocalLLM-Bootstrap", "differs from the rendered task (edited in Task Scheduler?)"),
        ("scheduled task LocalLLM-Watchdog", "not registered")]
    failures = {f["what"]: f for f in doc["failures"]}
    assert failures["scheduled task GPU-PowerPolicy"]["repair"] == "rigkit deploy inv.py --limit @winssh/rig1"
    assert failures["stack win-alpha readiness"]["repair"] == \
        "on @winssh/rig1 as an elevated administrator (PowerShell): recreate win-alpha"
    assert doc["scheduled_tasks"][2] == {"task": "LocalLLM-Watchdog", **tasks["LocalLLM-Watchdog"]}
    assert not doc["ok"]
    removed = win.spec.model_copy(update={"gpu_policy": "remove"})
    gone = build_status(type(win)(win.name, removed, win.models, win.file), "rig1", windows, gpus(), facts, weights(rig=win),
                        wanted_files(win), results(rig=win), NOW, "GPU-PowerPolicy", scheduled_tasks=tasks)
    assert [d["found"] for d in gone["drift"] if d["what"].startswith("scheduled task")] == ["registered", "registered"]


def test_a_keeper_state_file_that_cannot_be_read_is_a_note_not_zero_repairs():
    """Simulated: the probe's answer for a keeper state file cut off, garbage or empty (the probe says
    `state_unreadable`), and for one holding a JSON list: a note that the repairs are unknown; never a traceback."""
    facts = probe()
    facts["gpu_keeper"] = {"unit": {"load": "loaded", "enabled": "enabled", "active": "active"}, "state": None,
                           "state_unreadable": True}
    doc = status(facts=facts)
    assert any("its repairs are unknown, not zero" in n for n in doc["notes"]), doc["notes"]
    facts["gpu_keeper"] = {"unit": {"load": "loaded", "enabled": "enabled", "active": "active"}, "state": [1, 2]}
    assert status(facts=facts)["gpu_keeper"]["counts"]


def test_weights_completed_after_the_container_started_are_drift():
    """Simulated: the volume's completion marker written 30 s after the running container started (a copy that
    went on after its deploy was killed); one written before it is no drift."""
    started_at = "2025-01-02T11:00:00.5Z"
    facts = probe()
    for stack in facts["stacks"].values():
        stack["containers"][0]["started_at"] = started_at
    at = datetime(2025, 1, 2, 11, 0, tzinfo=timezone.utc).timestamp()
    late = {m: {**w, "completed_at": at + 30} for m, w in weights().items()}
    doc = status(facts=facts, volume_states=late)
    found = [d for d in doc["drift"] if d["what"].endswith(" weights")]
    assert len(found) == len(RIG.models) and "volume completed 30 s after the container started" in found[0]["found"]
    early = {m: {**w, "completed_at": at - 30} for m, w in weights().items()}
    assert not [d for d in status(facts=facts, volume_states=early)["drift"] if d["what"].endswith(" weights")]


def test_a_candidate_held_for_the_gate_or_refused_by_it_is_named_with_what_a_deploy_would_do():
    """Simulated: the stack files as rigkit-stack leaves them. A candidate held for the gate (gate.pending, the
    new config serving un-promoted): named, and the verification shown said to be the proven config's. The
    catalog's config refused (compose.failed.yml is it, the old one proven and serving): named with the way
    out, not a plain deploy that would be refused again."""
    wanted = wanted_files(RIG)["test-alpha"]
    held = probe()
    held["stacks"]["test-alpha"]["files"]["compose.yml"] = "0" * 64  # the old proven config's
    held["stacks"]["test-alpha"]["held"] = "a" * 64
    doc = status(facts=held)
    [drift] = [d for d in doc["drift"] if d["what"].startswith("stack test-alpha")]
    assert drift["what"] == "stack test-alpha rollout" and "held for the rollout gate" in drift["found"], drift
    assert "the verification shown is the last proven config's" in drift["found"]
    assert "HELD for the gate" in status_table(doc)
    refused = probe()
    refused["stacks"]["test-alpha"]["files"].update({"compose.yml": "0" * 64, "compose.failed.yml": wanted["compose.yml"]})
    doc = status(facts=refused)
    [drift] = [d for d in doc["drift"] if d["what"].startswith("stack test-alpha")]
    assert "refused" in drift["found"] and "a deploy of it as it is is refused again" in drift["repair"], drift
    assert "rigkit deploy inv.py --limit rig1 --accept-slower test-alpha" in drift["repair"]
    assert "REFUSED, old serves" in status_table(doc)
    older = probe()  # an older refusal, another config wanted now: a plain difference
    older["stacks"]["test-alpha"]["files"].update({"compose.yml": "0" * 64, "compose.failed.yml": "1" * 64})
    [drift] = [d for d in status(facts=older)["drift"] if d["what"].startswith("stack test-alpha")]
    assert drift["what"] == "stack test-alpha files" and "DIFFERS" in status_table(status(facts=older))


def test_what_docker_could_not_say_is_not_said():
    """Simulated: docker hung while the probe asked for the containers (its containers_error) and the volumes.
    Running is unknown ("?"), not "NO" beside a model that answers; a manifest not read is "not read"."""
    facts = probe()
    for stack in facts["stacks"].values():
        stack.update(containers=[], containers_error="docker did not answer within 6 s")
    facts["volumes"] = {}
    doc = status(facts=facts, volume_states={m.name: {"status": "error", "error": "docker did not answer",
                                                      "timed_out": "docker"} for m in RIG.models})
    assert {s["running"] for s in doc["stacks"]} == {None}
    table = status_table(doc)
    assert re.search(r"^test-alpha\s+\?\s", table, re.M) and not re.search(r"^test-\w+\s+NO\s", table, re.M), table
    assert "None in manifest" not in table and "not read" in table, table


def test_the_gateways_certificate_is_judged_by_what_it_serves_and_when_it_expires():
    """Pure: the probe's reading of the gateway's HTTPS (tests/test_gateway.py reads a real one)."""
    def judged(found):
        facts = probe()
        facts["gateway_tls"] = found
        return status(facts=facts)

    fine = judged({"not_after": (NOW + timedelta(days=200)).timestamp(), "issued_by_rigkit": True})
    assert fine["ok"] and fine["gateway_tls"]["days_left"] == 200, fine
    near = judged({"not_after": (NOW + timedelta(days=10)).timestamp(), "issued_by_rigkit": True})
    [drift] = near["drift"]
    assert drift["what"] == "gateway: certificate" and "(10 days)" in drift["found"] and "rigkit deploy" in drift["repair"]
    theirs = judged({"not_after": (NOW - timedelta(days=1)).timestamp(), "issued_by_rigkit": False})
    assert theirs["drift"][0]["found"].startswith("expired ")
    assert "put a current certificate in gateway.tls.cert_file" in theirs["drift"][0]["repair"]
    other = judged({"error": "it serves a certificate other than the one deployed (unable to get local issuer)"})
    assert [f["what"] for f in other["failures"]] == ["gateway"] and "other than the one deployed" in other["failures"][0]["detail"]
