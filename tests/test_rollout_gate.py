"""The rollout gate end to end: pyinfra over SSH to the simulated rig, rigkit-stack holding a new config
un-promoted, the gate's benchmarks through the SSH forward against the last proven result, then the
promotion, or the rollback and its verification. (`--accept-slower`: tests/test_verify.py; the canary of a
two-rig `rigkit rollout`: tests/test_gateway.py; false rollbacks and misses with noise on:
bench/gate_rollouts.py.)

The tests share one deploy history, in order: the first rollout establishes the proven result; each
seed fault class is refused against it and rolled back (the old config serving and verified); a 2%
slower config passes; a second deploy changes nothing; with the stack taken down (a rebuilt rig), a
10% slower config establishes the proven result again rather than being refused with nothing to roll back to.

Simulated: vLLM (tests/vllm_standin, its rates exact: no noise) and its fault modes for the seeds'
classes: `--enforce-eager` (decode 7x slower), the fault `half_dtype_draft` (the drafter accepts nothing
and decode is 3x slower: what vLLM does with `--dtype half` and a bfloat16 drafter, which the catalog's
own lint refuses, so the gate meets it as a server that says nothing), `--no-enable-prefix-caching` (a
repeated prompt pays its whole prefill again, x8) and `slower_by` (a set share slower, prefill and
decode); and the GPUs (the simulated rig's fake NVML). The stand-in decodes at 1000 tok/s here so that
three runs of the eager config (143 tok/s) take seconds.
"""

from __future__ import annotations

import json
import re

import httpx
import pytest

from tests.conftest import SERVING_RIG, copy_catalog, run_status
from tests.conftest import run_deploy as deploy

pytestmark = pytest.mark.simrig

FAST = ('STANDIN_DECODE_TOK_S: "100"', 'STANDIN_DECODE_TOK_S: "1000"')
EAGER = ("dtype: bfloat16\n", "dtype: bfloat16\n  enforce_eager: true\n")
HALF_DTYPE_DRAFT = ("env:\n", "env:\n  STANDIN_FAULT: half_dtype_draft\n")
NO_PREFIX_CACHE = ("dtype: bfloat16\n", "dtype: bfloat16\n  enable_prefix_caching: false\n")
TWENTY_PERCENT_SLOWER = ("env:\n", "env:\n  STANDIN_FAULT: slower_by\n  STANDIN_SLOWER_BY: \"0.20\"\n")
TWELVE_PERCENT_SLOWER = ("env:\n", "env:\n  STANDIN_FAULT: slower_by\n  STANDIN_SLOWER_BY: \"0.12\"\n")
FIRST_START_SLOWER = ("env:\n", "env:\n  STANDIN_FAULT: slower_by\n  STANDIN_SLOWER_BY: \"0.12\"\n"
                                "  STANDIN_SLOWER_STARTS: \"1\"\n")
TWO_PERCENT_SLOWER = ("env:\n", "env:\n  STANDIN_FAULT: slower_by\n  STANDIN_SLOWER_BY: \"0.02\"\n")
COMPOSE, REFUSED_COMPOSE = "/etc/rigkit/stacks/test-alpha/compose.yml", "/etc/rigkit/stacks/test-alpha/compose.failed.yml"


@pytest.fixture(scope="module")
def history(serving_rig, tmp_path_factory):
    """The module's rig, a rig file serving test-alpha alone (a deploy that changes the rig verifies every
    model it serves) and its results folder, shared by the tests in order."""
    folder = tmp_path_factory.mktemp("gate")
    alpha_only = folder / "alpha.yml"
    alpha_only.write_text(SERVING_RIG.read_text().replace("models: [test-alpha, test-beta]", "models: [test-alpha]"))
    serving_rig.exec("rigkit-stack down test-alpha; rigkit-stack down test-beta")  # no proven config yet
    return serving_rig, alpha_only, folder


def run(history, catalog, *extra):
    rig, rig_file, folder = history
    return deploy(rig, rig_file, "--data", f"results_dir={folder / 'results'}", *extra, catalog=catalog)


def served() -> dict:
    """What the running server is, read from the stand-in itself (not from rigkit's files)."""
    return httpx.get("http://127.0.0.1:18101/standin/info", timeout=5).json()


def documents(history, kind):
    found = [json.loads(p.read_text()) for p in (history[2] / "results" / "alpha" / "test-alpha").glob("*.json")]
    return sorted((d for d in found if d.get("kind") == kind), key=lambda d: d["time"])


def test_the_first_rollout_establishes_the_proven_result(history, tmp_path):
    first = run(history, copy_catalog(tmp_path, test_alpha=[FAST]))
    assert first.returncode == 0, first.output
    assert "PROMOTE: no proven result yet; this rollout establishes it" in first.output, first.output
    [established] = documents(history, "gate")
    assert established["promoted"] and established["establishes"]
    assert len(established["runs"]["decode_tok_s"]["runs"]) == 3
    assert established["bench"]["acceptance_length"] == pytest.approx(2.4, abs=0.05)  # the drafter's, k=2
    assert established["bench"]["repeat_ttft_s"] < established["figures"]["ttft_s"] / 4  # a prefix-cache hit


# Each seed class: the catalog change, the checks that must refuse it, the other speed checks that may
# (a 10% slower config is at decode's line and 11% over TTFT's: either or both refuse it, as measured by
# bench/gate_rollouts.py), and a line of the refusal screen.
SEED_FAULTS = {
    # The stand-in decodes at 1000 tok/s, 7x slower eager; measured by the client on a loaded machine, the
    # proven figure has come out at 989 (900-1099 accepted; the seven-fold drop is what is asserted).
    # The allowance is 10% widened by the runs' own noise (3x their CV): a fresh-clone run read the eager
    # runs at CV 3.7% and allowed 11.0%; 85% slower is refused whatever the noise.
    "eager": ([EAGER], {"decode"}, set(), r"FAIL  decode: proven (9\d\d|10\d\d)\.\d tok/s, candidate 1[34]\d\.\d tok/s "
                                   r"\(mean of 3\): 8[4-7]\.\d% slower; \d+\.\d% allowed"),
    "half_dtype_draft": ([HALF_DTYPE_DRAFT], {"decode", "acceptance"}, set(),
                         r"FAIL  acceptance: mean acceptance length proven 2\.[34]\d, candidate 1\.00: accepted tokens "
                         r"per draft 1\.[34]\d -> 0\.00 \(0% of the proven"),
    "no_prefix_cache": ([NO_PREFIX_CACHE], {"prefix_cache"}, set(),
                        r"FAIL  prefix_cache: the measured prompt sent again: TTFT proven 0\.0\d\d s, candidate "
                        r"0\.5\d\d s \(x[6-9]\.\d; above x2 the prefix cache is lost"),
    # Twice the allowance, off the line: the exact figures are decode 20% slower, TTFT 25% longer; accepted
    # as measured on a loaded machine, decode 15-25% slower, TTFT 17-35% longer (one start, or two when
    # the noise put a check under twice its allowance).
    "twenty_percent_slower": ([TWENTY_PERCENT_SLOWER], set(), {"decode", "ttft"},
                              r"FAIL  (decode: proven \d+\.\d tok/s, candidate (7[5-9]\d|8[0-4]\d)\.\d tok/s "
                              r"\(mean of [36]\): (1[5-9]|2[0-5])\.\d% slower|ttft: proven 0\.5\d\d s, candidate "
                              r"0\.[5-7]\d\d s \(mean of [36]\): (1[7-9]|2\d|3[0-5])\.\d% longer)"),
}


@pytest.mark.parametrize("fault", list(SEED_FAULTS))
def test_each_seed_fault_is_refused_with_its_reason_and_the_old_config_serves_verified(history, tmp_path, fault):
    """A rollout to the seed class is refused by the gate, naming the check that caught it with old and new
    figures; the rig rolls back, the old config serves (read from the stand-in itself and the rig's files)
    and its verification (3 more runs against the proven result) passed."""
    changes, reasons, also, line = SEED_FAULTS[fault]
    verifications = len(documents(history, "verification"))
    refused = run(history, copy_catalog(tmp_path, test_alpha=[FAST, *changes]))
    assert refused.returncode != 0, refused.output
    named = re.search(r"rollout gate REFUSED test-alpha: ([a-z_, ]+)", refused.output)
    assert named, refused.output
    failed = set(named.group(1).split(", "))
    speed = {"decode", "ttft", "acceptance", "prefix_cache"}
    assert reasons <= failed and failed & speed & (reasons | also) and not failed & speed - reasons - also, \
        refused.output
    assert re.search(line, refused.output), refused.output
    assert "ROLLED BACK to the last proven config; its verification passed" in refused.output, refused.output
    assert "Traceback" not in refused.output
    info = served()  # the old config serves: no fault, the drafter accepting, the cache on, full speed
    assert info["decode_tok_s"] == 1000.0 and not info["args"]["enforce_eager"], info
    assert info["args"]["enable_prefix_caching"] and info["args"]["speculative_config"], info
    rig = history[0]
    assert "STANDIN_FAULT" not in rig.exec(f"cat {COMPOSE}")[1] and "--no-enable-prefix" not in rig.exec(f"cat {COMPOSE}")[1]
    assert rig.exec(f"cat {REFUSED_COMPOSE}")[1] != rig.exec(f"cat {COMPOSE}")[1]
    assert rig.exec("test -e /etc/rigkit/stacks/test-alpha/gate.pending")[0] != 0
    gate = documents(history, "gate")[-1]
    assert not gate["promoted"] and gate["rollback"]["rolled_back"] and gate["rollback"]["verified"], gate
    assert {c["name"] for c in gate["checks"] if not c["passed"]} == failed
    assert len(documents(history, "verification")) == verifications + 1  # the rollback's, saved as it passed
    verified = documents(history, "verification")[-1]
    # Which config serves is the stand-in's own word (served(), above: 1000 tok/s, no fault); the rollback's
    # measured figure need only be plausible for it: measured by the client on a loaded machine, 901 seen.
    assert verified["passed"] and verified["figures"]["decode_tok_s"] == pytest.approx(1000, rel=0.15)


def test_a_start_slower_near_the_line_gets_a_second_look_and_both_starts_are_judged(history, tmp_path):
    """Simulated: the start-to-start level of vLLM's CPU build (bench/gate_engine_starts.py), as the stand-in's
    STANDIN_SLOWER_STARTS. A config 12% slower on every start: near the line, so the gate restarts it
    (`rigkit-stack restart`) and measures 3 more runs; slower on both starts, refused, rolled back. A config
    12% slower on its first start only: the second start runs at the proven level, the 6 runs are judged
    together (their spread widens the allowance) and it is promoted, serving at full speed."""
    slower = run(history, copy_catalog(tmp_path / "every", test_alpha=[FAST, TWELVE_PERCENT_SLOWER]))
    assert slower.returncode != 0, slower.output
    assert "restarting the candidate for a second look (3 more runs)" in slower.output, slower.output
    assert "READY AGAIN" in slower.output and "over 2 starts of the candidate" in slower.output, slower.output
    # Refused by a share check: decode or TTFT against the proven result, or drift against the anchor (a CI run's
    # proven result, a rollback's noisy verification at a runs' CV of 28%, widened decode's line past 12%).
    named = re.search(r"rollout gate REFUSED test-alpha: ([a-z_, ]+)", slower.output)
    assert named and set(named.group(1).split(", ")) <= {"decode", "drift", "ttft"}, slower.output
    refused = documents(history, "gate")[-1]
    assert not refused["promoted"] and len(refused["runs"]["decode_tok_s"]["runs"]) == 6, refused
    assert refused["rollback"]["rolled_back"] and refused["rollback"]["verified"], refused
    assert served()["decode_tok_s"] == 1000.0  # the proven config is back
    # Status, read from the rig, says the catalog's config was refused and a deploy as it is would be again.
    _, said, report = run_status(history[0], history[1], tmp_path, catalog=tmp_path / "every" / "models",
                                 results=history[2] / "results")
    [stack] = [s for s in report["rigs"][0]["stacks"] if s["model"] == "test-alpha"]
    assert stack["gate"] == "refused" and "REFUSED, old serves" in said, said
    assert "--accept-slower test-alpha" in said, said
    once = run(history, copy_catalog(tmp_path / "once", test_alpha=[FAST, FIRST_START_SLOWER]))
    assert once.returncode == 0, once.output
    assert "restarting the candidate for a second look" in once.output, once.output
    assert "PROMOTE: the candidate is as good as the proven config" in once.output, once.output
    promoted = documents(history, "gate")[-1]
    assert promoted["promoted"] and len(promoted["runs"]["decode_tok_s"]["runs"]) == 6, promoted
    assert served()["decode_tok_s"] == 1000.0  # its second start: past the slow one
    assert "STANDIN_SLOWER_STARTS" in history[0].exec(f"cat {COMPOSE}")[1]  # the proven config now


def test_a_two_percent_slower_config_passes_and_a_second_deploy_changes_nothing(history, tmp_path):
    healthy = copy_catalog(tmp_path, test_alpha=[FAST, TWO_PERCENT_SLOWER])
    passed = run(history, healthy)
    assert passed.returncode == 0, passed.output
    assert "PROMOTE: the candidate is as good as the proven config" in passed.output, passed.output
    assert served()["decode_tok_s"] == pytest.approx(980.0)
    again = run(history, healthy)
    assert again.returncode == 0 and again.changed_operations() == 0, again.output


def test_a_rebuilt_rig_establishes_again_rather_than_refusing_with_nothing_to_roll_back_to(history, tmp_path):
    """A proven result is on record, but the rig holds no proven config (taken down here; a rebuilt rig is the
    same): a 12% slower config, which the gate refuses against that result above, is judged as a first rollout
    and serves, since a refusal would have nothing to roll back to and would stop the model."""
    rig = history[0]
    rig.exec("rigkit-stack down test-alpha")
    slower = run(history, copy_catalog(tmp_path, test_alpha=[FAST, TWELVE_PERCENT_SLOWER]))
    assert slower.returncode == 0, slower.output
    assert "the rig holds no proven config of it" in slower.output, slower.output
    assert "PROMOTE: no proven result yet; this rollout establishes it" in slower.output, slower.output
    assert served()["decode_tok_s"] == pytest.approx(880.0)
    assert documents(history, "gate")[-1]["establishes"]
