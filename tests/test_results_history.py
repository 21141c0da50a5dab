"""The results history (rigkit.verify.history) as `rigkit status` and regression comparison read it:
result files on disk in a temporary folder, written as the verification, tune and earlier
versions of rigkit wrote them. Pure file I/O; simulates nothing."""

from __future__ import annotations

import json
import os
from datetime import datetime, timedelta, timezone

import pytest

from rigkit.status.collect import latest_results
from rigkit.status.report import build_status
from rigkit.status.table import status_table
from rigkit.tune.inputs import write_json
from rigkit.verify import history
from rigkit.verify.history import read_history, write_document
from rigkit.verify.result import earlier_results, latest_result
from tests.test_status_report import COMMANDS, NOW, RIG, gpus, probe, wanted_files, weights

T0 = datetime(2025, 1, 2, 9, 0, tzinfo=timezone.utc)


def verification(hours: float, passed: bool = True, kind: str | None = "verification", **extra) -> dict:
    doc = {"time": (T0 + timedelta(hours=hours)).isoformat(timespec="seconds"), "passed": passed,
           "regressions": [], "figures": {"decode_tok_s": 60.0 + hours},
           "checks": [{"name": "decode", "passed": passed, "message": "60 tok/s"}], **extra}
    if kind:
        doc["kind"] = kind
    return doc


def put(folder, name: str, content) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / name).write_text(content if isinstance(content, str) else json.dumps(content))


def stamp(hours: float) -> str:
    return (T0 + timedelta(hours=hours)).strftime("%Y-%m-%dT%H%M%SZ")


def test_a_tune_document_is_not_the_latest_verification(tmp_path):
    """`tune-*` sorts after every time-stamped name: the old reader took it as a failed verification."""
    put(tmp_path, f"{stamp(0)}.json", verification(0))
    put(tmp_path, "tune-20250102T120000Z.json", {"kind": "tune", "time": (T0 + timedelta(hours=3)).isoformat(),
                                                 "table": []})
    put(tmp_path, "tune-hold-20250102T130000Z.json", {"rig": "rig1", "hold": {}})  # before `kind`: named tune-*
    assert latest_result(tmp_path, None)["time"] == verification(0)["time"]
    assert [d["time"] for d in earlier_results(tmp_path, warn=None)] == [verification(0)["time"]]
    assert len(read_history(tmp_path, "tune").documents) == 1  # the older hold has no time: skipped, with a warning


def test_the_time_inside_orders_the_history_not_the_file_name(tmp_path):
    put(tmp_path, "zz-renamed.json", verification(1, passed=False))
    put(tmp_path, "aa-renamed.json", verification(5))
    put(tmp_path, "mm.json", verification(3, kind=None))  # written before `kind`: a verification, it has `passed`
    assert [d["figures"]["decode_tok_s"] for d in earlier_results(tmp_path, warn=None)] == [65.0, 63.0, 61.0]
    assert latest_result(tmp_path, None)["passed"] is True


def test_gate_documents_are_their_own_kind(tmp_path):
    put(tmp_path, "a.json", verification(0))
    put(tmp_path, "b.json", verification(2, kind="gate", verdict="refuse"))
    assert latest_result(tmp_path, None)["time"] == verification(0)["time"]
    assert [d["verdict"] for d in read_history(tmp_path, "gate").documents] == ["refuse"]


@pytest.mark.parametrize("content, why", [
    ('{"time": "2025-01-02T12:00:00+00:00", "passed": tr', "not readable as JSON"),
    ("[]", "holds a JSON list"),
    ('"done"', "holds a JSON str"),
    ('{"time": "yesterday", "passed": true}', "no readable 'time'"),
    ('{"kind": "benchmark", "time": "2025-01-02T12:00:00+00:00"}', "its kind is unknown"),
])
def test_an_unreadable_newest_file_is_skipped_and_named(tmp_path, capsys, content, why):
    put(tmp_path, f"{stamp(0)}.json", verification(0))
    put(tmp_path, f"{stamp(3)}.json", content)
    warnings = []
    found = latest_result(tmp_path, warnings.append)
    assert found is not None and found["passed"] and found["time"] == verification(0)["time"]
    [warning] = warnings
    assert warning.startswith(f"{tmp_path / (stamp(3) + '.json')}: skipped, {why}")
    latest_result(tmp_path)  # the default: named on stderr
    assert f"rigkit: warning: {tmp_path / (stamp(3) + '.json')}: skipped" in capsys.readouterr().err


def test_write_document_is_atomic(tmp_path, monkeypatch):
    path = tmp_path / "r" / "x.json"
    write_document(path, {"a": 1})
    assert json.loads(path.read_text()) == {"a": 1} and oct(path.stat().st_mode & 0o777) == "0o644"
    synced = []
    real_fsync = os.fsync
    monkeypatch.setattr(history.os, "fsync", lambda fd: (synced.append(fd), real_fsync(fd)))

    def crash(src, dst):
        raise OSError("disk gone")

    monkeypatch.setattr(history.os, "replace", crash)
    with pytest.raises(OSError, match="disk gone"):
        write_document(path, {"a": 2})
    assert json.loads(path.read_text()) == {"a": 1}  # the old file, whole
    assert [p.name for p in path.parent.iterdir()] == ["x.json"]  # no temporary file left behind
    assert synced  # the data was fsynced before the rename was tried


def test_tune_documents_say_their_kind_and_time(tmp_path):
    out = tmp_path / "rig1" / "m" / "tune-20250102T120000Z.json"
    write_json(out, {"rig": "rig1", "table": []})
    doc = json.loads(out.read_text())
    assert doc["kind"] == "tune" and history.document_time(doc) is not None
    assert read_history(out.parent, "tune").documents == [doc]
    assert latest_result(out.parent, None) is None


def test_status_after_tune_reports_the_last_verification(tmp_path):
    """The results folder after `rigkit verify` then `rigkit tune`, plus a result file cut off by a crash and
    one holding `[]`: status reports the passing verification and names both bad files, and keeps every
    other section of the rig."""
    for model in RIG.models:
        folder = tmp_path / RIG.name / model.name
        put(folder, f"{stamp(0)}.json", verification(0, passed=False))
        put(folder, f"{stamp(1)}.json", verification(1))
        write_json(folder / "tune-20250102T110000Z.json", {"rig": RIG.name, "model": model.name, "table": []})
    alpha = tmp_path / RIG.name / "test-alpha"
    put(alpha, f"{stamp(2)}.json", '{"time": "2025-01-02T11:00:00+00:00", "pas')
    put(alpha, f"{stamp(2.5)}.json", "[]")
    results, skipped = latest_results(RIG, tmp_path)
    assert {m: r["time"] for m, r in results.items()} == {m.name: verification(1)["time"] for m in RIG.models}
    doc = build_status(
        RIG, "rig1", COMMANDS, gpus(), probe(), weights(), wanted_files(RIG), results, NOW,
        "rigkit-gpu-policy.service", history_notes=skipped)
    assert doc["failures"] == [] and doc["ok"], doc["failures"]
    assert [v["passed"] for v in doc["verification"]] == [True, True]
    assert doc["gpus"] and doc["stacks"] and doc["weights"]  # nothing lost to one bad file
    notes = [n for n in doc["notes"] if n.startswith("results history: ")]
    assert len(notes) == 2 and str(alpha / f"{stamp(2)}.json") in notes[0] + notes[1]
    assert "results history: " in status_table(doc)
