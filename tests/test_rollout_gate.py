"""The rollout gate end to end: pyinfra over SSH to the simulated rig, rigkit-stack holding a new config
un-promoted, the gate's benchmarks through the SSH forward against the last proven result, then the
promotion, or the rollback and its verification. (`--accept-slower`: tests/test_verify.py.)

Simulated: vLLM (tests/vllm_standin: `--enforce-eager` makes its decode 7x slower, the fault `slower_by`
a set share slower, its rates exact: no noise) and the GPUs (the simulated rig's fake NVML). The stand-in
decodes at 1000 tok/s here so that three runs of the eager config (143 tok/s) take seconds.
"""

from __future__ import annotations

import json
import re

import httpx
import pytest

from tests.conftest import SERVING_RIG, copy_catalog
from tests.conftest import run_deploy as deploy

pytestmark = pytest.mark.simrig

FAST = ('STANDIN_DECODE_TOK_S: "100"', 'STANDIN_DECODE_TOK_S: "1000"')
EAGER = ("dtype: bfloat16\n", "dtype: bfloat16\n  enforce_eager: true\n")
TWO_PERCENT_SLOWER = ("env:\n", "env:\n  STANDIN_FAULT: slower_by\n  STANDIN_SLOWER_BY: \"0.02\"\n")


@pytest.fixture(scope="module")
def rig(serving_rig):
    return serving_rig


@pytest.fixture
def alpha_only(tmp_path):
    """A rig file serving test-alpha alone (a deploy that changes the rig verifies every model it serves)."""
    path = tmp_path / "alpha.yml"
    path.write_text(SERVING_RIG.read_text().replace("models: [test-alpha, test-beta]", "models: [test-alpha]"))
    return path


def run(rig, rig_file, catalog, results, *extra):
    return deploy(rig, rig_file, "--data", f"results_dir={results}", *extra, catalog=catalog)


def served() -> dict:
    """What the running server is, read from the stand-in itself (not from rigkit's files)."""
    return httpx.get("http://127.0.0.1:18101/standin/info", timeout=5).json()


def documents(folder, kind):
    found = [json.loads(p.read_text()) for p in folder.glob("*.json")]
    return sorted((d for d in found if d.get("kind") == kind), key=lambda d: d["time"])


def test_eager_mode_is_refused_and_rolled_back_and_a_healthy_change_passes(rig, tmp_path, alpha_only):
    """A first rollout establishes the proven result; a rollout to eager mode (decode /7) is refused and
    rolled back, the old config serving and verified; a 2% slower config passes; a second deploy changes
    nothing."""
    results = tmp_path / "results"
    folder = results / "alpha" / "test-alpha"  # results/<rig file name>/<model>
    good = copy_catalog(tmp_path / "good", test_alpha=[FAST])
    rig.exec("rigkit-stack down test-alpha; rigkit-stack down test-beta")  # no proven config: the first establishes

    first = run(rig, alpha_only, good, results)
    assert first.returncode == 0, first.output
    assert "PROMOTE: no proven result yet; this rollout establishes it" in first.output, first.output
    [established] = documents(folder, "gate")
    assert established["promoted"] and established["establishes"]
    assert len(established["runs"]["decode_tok_s"]["runs"]) == 3

    eager = copy_catalog(tmp_path / "eager", test_alpha=[FAST, EAGER])
    refused = run(rig, alpha_only, eager, results)
    assert refused.returncode != 0
    assert "rollout gate REFUSED test-alpha: decode" in refused.output, refused.output
    assert re.search(r"FAIL  decode: proven (99\d|10\d\d)\.\d tok/s, candidate 14\d\.\d tok/s \(mean of 3\): 8\d\.\d% slower; "
                     r"10\.0% allowed", refused.output), refused.output
    assert "ROLLED BACK to the last proven config; its verification passed" in refused.output, refused.output
    info = served()
    assert not info["args"]["enforce_eager"] and info["decode_tok_s"] == 1000.0  # the old config serves
    assert "--enforce-eager" not in rig.exec("cat /etc/rigkit/stacks/test-alpha/compose.yml")[1]
    assert "--enforce-eager" in rig.exec("cat /etc/rigkit/stacks/test-alpha/compose.failed.yml")[1]
    assert rig.exec("test -e /etc/rigkit/stacks/test-alpha/gate.pending")[0] != 0
    gate = documents(folder, "gate")[-1]
    assert not gate["promoted"] and gate["rollback"]["verified"], gate
    assert documents(folder, "verification")[-1]["figures"]["decode_tok_s"] == pytest.approx(1000, rel=0.05)

    healthy = copy_catalog(tmp_path / "healthy", test_alpha=[FAST, TWO_PERCENT_SLOWER])
    passed = run(rig, alpha_only, healthy, results)
    assert passed.returncode == 0, passed.output
    assert "PROMOTE: the candidate is as good as the proven config" in passed.output, passed.output
    assert served()["decode_tok_s"] == pytest.approx(980.0)
    again = run(rig, alpha_only, healthy, results)
    assert again.returncode == 0 and again.changed_operations() == 0, again.output
