"""The GPU policy keeper's decisions, without a rig: what differs from the policy, which cause a
change is logged with, and its state file (counts, last events, written whole). The keeper is
templates/gpu_policy/rigkit-gpu-keeper.py, loaded here with a stand-in `pynvml` module; the
simulated rig (tests/test_gpu_keeper.py) proves the wiring."""

from __future__ import annotations

import importlib.util
import json
import sys
import types
from datetime import datetime, timedelta, timezone

import pytest

from rigkit.gpu.keeper import keeper_summary
from rigkit.plumbing.render import template_path
from tests.conftest import REPO


@pytest.fixture
def keeper(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", types.SimpleNamespace(NVMLError=Exception))
    # The runtime it imports (rigkit/rigside) in a folder of its own, as /usr/local/lib/rigkit on a rig.
    (tmp_path / "lib").mkdir()
    (tmp_path / "lib" / "rigside").symlink_to(REPO / "rigkit" / "rigside", target_is_directory=True)
    monkeypatch.setenv("RIGKIT_LIB_DIR", str(tmp_path / "lib"))
    monkeypatch.setattr(sys, "path", list(sys.path))
    spec = importlib.util.spec_from_file_location("rigkit_gpu_keeper", template_path("gpu_policy/rigkit-gpu-keeper.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    monkeypatch.setattr(module, "STATE_PATH", str(tmp_path / "state" / "gpu-keeper.json"))
    monkeypatch.setattr(module, "POLICY_PATH", str(tmp_path / "gpu-policy.conf"))
    return module


def test_the_policy_file_is_read_as_the_script_reads_it(keeper, tmp_path):
    (tmp_path / "gpu-policy.conf").write_text("# rig\n0 330 0,2200 0,0\n1 default default\n\n")
    assert keeper.policy() == {0: "330", 1: "default"}


def test_only_gpus_whose_enforced_limit_is_not_the_policys_differ(keeper):
    wanted = {0: "330", 1: "default"}
    assert keeper.differing(wanted, {0: (330.0, 450.0), 1: (450.0, 450.0)}) == {}
    assert keeper.differing(wanted, {0: (330.4, 450.0), 1: (449.6, 450.0)}) == {}  # within 0.5 W
    assert keeper.differing(wanted, {0: (300.0, 450.0), 1: (330.0, 450.0)}) == {0: (300.0, 330.0), 1: (330.0, 450.0)}


def test_a_limit_back_at_the_default_is_a_reset_any_other_is_by_hand(keeper):
    assert keeper.classify({0: (450.0, 330.0)}, {0: (450.0, 450.0), 1: (330.0, 450.0)}) == "reset"
    assert keeper.classify({0: (300.0, 330.0)}, {0: (300.0, 450.0)}) == "changed-by-hand"
    assert keeper.classify({0: (450.0, 330.0), 1: (300.0, 330.0)},
                           {0: (450.0, 450.0), 1: (300.0, 450.0)}) == "changed-by-hand"


def test_repairs_are_counted_by_cause_and_the_last_events_kept_in_a_whole_document(keeper, tmp_path):
    for n in range(25):
        keeper.record("resume" if n % 2 else "changed-by-hand", {0: (300.0, 330.0)}, {0: (330.0, 450.0)}, True,
                      "applied", 0.3)
    state = json.loads((tmp_path / "state" / "gpu-keeper.json").read_text())
    assert state["counts"] == {"resume": 12, "driver": 0, "reset": 0, "changed-by-hand": 13}
    assert len(state["events"]) == keeper.EVENTS_KEPT
    assert state["events"][-1]["gpus"] == [{"index": 0, "found_w": 300.0, "wanted_w": 330.0, "after_w": 330.0}]
    assert not list((tmp_path / "state").glob("*.tmp"))  # replaced atomically, nothing half-written left
    keeper.record("resume", {}, None, False, "rigkit tune holds its session", 0, held="rigkit tune holds its session")
    state = json.loads((tmp_path / "state" / "gpu-keeper.json").read_text())
    assert state["holding"] == "rigkit tune holds its session" and state["counts"]["resume"] == 12  # a hold is no repair
    keeper.clear_hold()
    assert json.loads((tmp_path / "state" / "gpu-keeper.json").read_text())["holding"] is None


def test_status_summarises_counts_and_the_last_events_with_their_age():
    now = datetime(2026, 12, 1, 12, 0, tzinfo=timezone.utc)
    events = [{"time": (now - timedelta(seconds=60 * n)).isoformat(), "cause": "reset", "ok": True, "seconds": 0.4,
               "detail": "applied"} for n in range(8, 0, -1)]
    summary = keeper_summary({"enabled": "enabled", "active": "active"}, {"counts": {"reset": 8}, "events": events}, now)
    assert summary["counts"] == {"resume": 0, "driver": 0, "reset": 8, "changed-by-hand": 0}
    assert [e["age_s"] for e in summary["events"]] == [300, 240, 180, 120, 60]
    assert keeper_summary(None, None, now)["events"] == [] and keeper_summary(None, None, now)["active"] is None
