"""`rigkit rollout`'s canary rule, offline: the first rig's failed deploy stops the rollout before the
others, and what becomes of its place in the gateway. The deploy (pyinfra) and the rig-side gateway
helper are replaced by recorders; the outcome file is the one roles/verify.py writes when the rollout
gate refused (the simulated-rig test: tests/test_gateway.py, the canary test)."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from rigkit import cli
from rigkit.gateway import rollout as rollout_module
from rigkit.preflight import inventory_check

PUT_BACK = ("STOPPED: the rollout gate refused m-a on rig-a, rolled back to the last proven config and verified; "
            "it is back in the gateway; rigs not started: rig-b")
STAYS_OUT = "STOPPED: rig-a failed; rig-a stays out of the gateway; rigs not started: rig-b"


def rollout(monkeypatch, outcome) -> tuple[int, list, list]:
    """A two-rig rollout with a gateway whose first rig's deploy fails, having written `outcome` (JSON, or
    text as it is; None: nothing)."""
    deploys, helper = [], []
    monkeypatch.setattr(inventory_check, "reached_rigs",
                        lambda command, inventory, limit, whole_fleet, **checks: ["rig-a", "rig-b"])
    monkeypatch.setattr(rollout_module, "load_inventory", lambda inventory: [])
    monkeypatch.setattr(rollout_module, "gateway_plan",
                        lambda hosts: SimpleNamespace(host="rig-a", replicas_of=lambda name: [f"{name}.m"]))
    monkeypatch.setattr(rollout_module, "gateway_helper", lambda inventory, plan, *action: helper.append(action) or 0)

    def deploy(command):
        deploys.append(command)
        path = Path(next(a for a in command if a.startswith("rigkit_rollout_outcome=")).split("=", 1)[1])
        if outcome is not None:
            path.write_text(outcome if isinstance(outcome, str) else json.dumps(outcome))
        return SimpleNamespace(returncode=1)
    monkeypatch.setattr(rollout_module.subprocess, "run", deploy)
    return cli.main(["rollout", "inv.py"]), deploys, helper


def refused(**change) -> dict:
    return {"kind": "rollout-outcome", "rig": "rig-a", "serving_proven": True,
            "refused": [{"model": "m-a", "rolled_back": True, "verified": True}], **change}


def test_a_canary_the_gate_refused_and_rolled_back_verified_is_put_back_and_the_rollout_stops(monkeypatch, capsys):
    code, deploys, helper = rollout(monkeypatch, refused())
    assert code == 1 and len(deploys) == 1 and "rig-a" in deploys[0]  # rig-b's deploy never started
    assert helper == [("drain", "rig-a"), ("undrain", "rig-a")]
    assert PUT_BACK in capsys.readouterr().err


@pytest.mark.parametrize("outcome", [
    None,  # the deploy failed before the gate's last step, or apart from it
    refused(serving_proven=False, refused=[{"model": "m-a", "rolled_back": True, "verified": False}]),
    refused(rig="rig-b"),  # not this rig's
    refused(serving_proven="yes"),
    ["not", "an", "outcome"],
    json.dumps(refused())[:40],  # cut off
])
def test_any_other_failure_keeps_the_canary_drained(monkeypatch, capsys, outcome):
    code, deploys, helper = rollout(monkeypatch, outcome)
    assert code == 1 and len(deploys) == 1
    assert helper == [("drain", "rig-a")]
    assert STAYS_OUT in capsys.readouterr().err

