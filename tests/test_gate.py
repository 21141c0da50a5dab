"""rigkit.verify.gate: the rollout gate's promote/refuse decision, on figures written here. Pure;
simulates nothing but seeded run-to-run noise."""

from __future__ import annotations

import random

import pytest

from rigkit.verify.gate import RunFigures, decide, from_result

PROVEN = RunFigures(decode_tok_s=100.0, ttft_s=0.500, acceptance_length=2.4, gpu_power_w={0: 300.0})
CAPS = {0: 320.0}


def runs(decode=(100.0, 100.0, 100.0), ttft=(0.5, 0.5, 0.5), acceptance=2.4, passed=True, power=300.0):
    return [RunFigures(d, t, acceptance, passed, () if passed else ("stream_finished",), {0: power})
            for d, t in zip(decode, ttft)]


def test_a_noisy_proven_mean_widens_the_allowance_as_the_candidates_noise_does():
    """Measured on vLLM 0.32's CPU build: an established 1389, 1392, 1127 tok/s (mean 1303, CV 11.7%), and its own
    config after a rollback at 1080, 1164, 1109 (mean 1118, CV 3.8%): 14.2% slower on noise alone. With the proven
    runs' CV the allowance is 3x the root of the sum of squares, 36.8%; a proven result without runs (a
    verification) keeps the candidate's alone."""
    proven = from_result({"figures": {"decode_tok_s": 1303.1, "ttft_s": 0.11}, "passed": True,
                          "runs": {"decode_tok_s": {"mean": 1303.1, "cv": 0.1167, "runs": [1389.6, 1392.1, 1127.5]}}})
    restored = runs(decode=(1080.4, 1163.9, 1108.6), ttft=(0.11, 0.11, 0.11))
    verdict = decide(proven, restored)
    assert verdict.promote, verdict.reason
    assert "3x the runs' CV of 3.8% and the proven runs' 11.7%" in verdict.reason, verdict.reason
    bare = from_result({"figures": {"decode_tok_s": 1303.1, "ttft_s": 0.11}, "passed": True})
    assert not decide(bare, restored).promote


def test_the_noise_widening_stops_at_half_so_a_config_without_its_drafter_is_refused():
    """Measured on vLLM 0.32's CPU build (tests/test_engine.py): a speculative config's proven runs 1237, 2002 and
    1214 tok/s (CV 30%: the drafter's acceptance moved with the prompt) and the config without the drafter at
    362, 420 and 350. Widened by 3x the noise of both means the line would be 95% and let it through; it stops
    at 50%, and 74.6% slower is refused."""
    proven = from_result({"figures": {"decode_tok_s": 1484.4, "ttft_s": 0.145}, "passed": True,
                          "runs": {"decode_tok_s": {"mean": 1484.4, "cv": 0.302, "runs": [1236.9, 2002.1, 1214.2]}}})
    verdict = decide(proven, runs(decode=(362.0, 420.0, 350.0), ttft=(0.1, 0.1, 0.1), acceptance=None))
    assert not verdict.promote and [c.name for c in verdict.failed] == ["decode"], verdict.reason
    assert "50.0% allowed (widened from 10%: 3x the runs' CV of 9.9% and the proven runs' 30.2%, at most 50%)" \
        in verdict.reason, verdict.reason


@pytest.mark.parametrize("candidates, promote, failed, says", [
    (runs(), True, [], "0.0% slower"),
    (runs(decode=(98.0, 98.2, 97.8)), True, [], "2.0% slower; 10.0% allowed"),
    (runs(decode=(104.0, 105.0, 106.0)), True, [], "5.0% faster"),
    (runs(decode=(90.0, 90.1, 89.9)), False, ["decode"], "10.0% slower; 10.0% allowed"),
    (runs(decode=(88.0, 88.0, 88.0)), False, ["decode"], "12.0% slower"),
    # noisy runs: 3x a CV of 5% allows 15%; a 10% drop inside that noise is not called a regression
    (runs(decode=(85.0, 90.0, 95.0)), True, [], "widened from 10%: 3x the runs' CV of 5.6%"),
    (runs(decode=(60.0, 65.0, 70.0)), False, ["decode"], "35.0% slower; 23.1% allowed (widened from 10%"),
    (runs(ttft=(0.58, 0.57, 0.59)), False, ["ttft"], "proven 0.500 s, candidate 0.580 s (median of 3): 16.0% longer"),
    (runs(ttft=(0.51, 0.52, 0.50)), True, [], "2.0% longer"),
    (runs(acceptance=1.0, decode=(33.0, 33.3, 33.6)), False, ["decode", "acceptance"], "1.40 -> 0.00 (0% of"),
    (runs(acceptance=2.0), True, [], "1.40 -> 1.00 (71% of the proven"),
    (runs(acceptance=None), True, [], "judged on decode alone"),
    (runs(passed=False), False, ["every_check_passed"], "run 1 failed stream_finished"),
    (runs()[:2], False, ["runs"], "2 candidate run(s); 3 or more"),
    (runs(power=340.0), False, ["gpu_caps"], "GPU 0 340 W under load, cap 320 W"),
])
def test_decisions(candidates, promote, failed, says):
    verdict = decide(PROVEN, candidates, CAPS)
    assert verdict.promote is promote, verdict.reason
    assert [c.name for c in verdict.failed] == failed, verdict.reason
    assert says in verdict.reason
    assert verdict.reason.startswith("PROMOTE" if promote else "REFUSE: " + ", ".join(failed))
    assert len(verdict.reason.splitlines()) <= 24  # one screen


def test_a_lost_prefix_cache_is_refused():
    """The stand-in's `no_prefix_cache`: the repeated prompt takes a full prefill again (x8)."""
    proven = RunFigures(100.0, 0.5, gpu_power_w={0: 300.0}, repeat_ttft_s=0.0625)

    def cached(seconds):
        return [RunFigures(100.0, 0.5, gpu_power_w={0: 300.0}, repeat_ttft_s=seconds) for _ in range(3)]

    lost = decide(proven, cached(0.5), CAPS)
    assert not lost.promote and [c.name for c in lost.failed] == ["prefix_cache"]
    assert "TTFT proven 0.062 s, candidate 0.500 s (x8.0; above x2 the prefix cache is lost" in lost.reason
    assert decide(proven, cached(0.09), CAPS).promote  # a noisy cache hit is not a loss
    assert decide(proven, cached(None), CAPS).promote  # not measured: not compared
    assert decide(proven, cached(0.5), CAPS, accept_slower=True).waived == ("prefix_cache",)


def test_a_candidate_missing_a_figure_is_refused():
    verdict = decide(PROVEN, runs(decode=(100.0, None, 100.0)), CAPS)
    assert not verdict.promote and "1 of 3 candidate run(s) measured no decode" in verdict.reason


def test_no_false_rollbacks_under_ordinary_noise_and_real_slowdowns_caught():
    """Seeded run-to-run noise (sd 2% and 5% of decode and TTFT) on an unchanged config: never refused.
    A config 20% slower under 2% noise: always refused. Under 5% noise three runs' CV is itself noisy and
    3x it can allow 20% or more: only a 30% drop is reliably refused there (measured: 5% noise refuses a
    10% drop 23% of the time, 20% 83%, 30% 98%; at 1-2% noise a 10% drop, the allowance itself, ~50%)."""
    rng = random.Random(29)

    def noisy(share, slower=0.0):
        return [RunFigures(100 * (1 - slower) * rng.gauss(1, share), 0.5 * rng.gauss(1, share), None)
                for _ in range(3)]

    def refused(share, slower, trials=300):
        return sum(not decide(PROVEN, noisy(share, slower)).promote for _ in range(trials)) / trials

    assert refused(0.02, 0.0) == 0 and refused(0.05, 0.0) == 0
    assert refused(0.02, 0.02) == 0
    assert refused(0.02, 0.20) == 1
    assert refused(0.05, 0.30) >= 0.93


def test_figures_from_a_verification_result_document():
    document = {"kind": "verification", "passed": False, "figures": {"decode_tok_s": 61.5, "ttft_s": 0.2},
                "bench": {"acceptance_length": 2.1},
                "checks": [{"name": "decode_min", "passed": False}, {"name": "x", "passed": True}],
                "gpus": [{"index": 0, "mean_power_under_load_w": 280.0}, {"index": 1, "mean_power_under_load_w": None}]}
    assert from_result(document) == RunFigures(61.5, 0.2, 2.1, False, ("decode_min",), {0: 280.0})
    document["bench"]["repeat_ttft_s"] = 0.03
    assert from_result(document).repeat_ttft_s == 0.03


def test_the_first_rollout_establishes_the_proven_result():
    verdict = decide(None, runs(decode=(90.0, 91.0, 92.0)), CAPS)
    assert verdict.promote and verdict.establishes
    assert verdict.reason.startswith("PROMOTE: no proven result yet; this rollout establishes it")
    assert "establishes decode 91.0 tok/s (mean of 3, CV 1.1%)" in verdict.reason
    assert not decide(None, runs(passed=False), CAPS).promote  # its own checks still count
    assert not decide(None, runs(power=340.0), CAPS).promote


def test_accept_slower_waives_speed_only():
    eager = runs(decode=(14.2, 14.3, 14.3), acceptance=1.0)
    verdict = decide(PROVEN, eager, CAPS, accept_slower=True)
    assert verdict.promote and verdict.waived == ("decode", "acceptance")
    assert verdict.reason.startswith("PROMOTE, SLOWER AND ACCEPTED (--accept-slower): decode, acceptance")
    assert "WAIVED  decode: proven 100.0 tok/s, candidate 14.3 tok/s" in verdict.reason
    assert not decide(PROVEN, eager, CAPS).promote
    # a failed check of a run or a GPU over its cap is not speed: still refused
    refused = decide(PROVEN, runs(decode=(50.0,) * 3, passed=False), CAPS, accept_slower=True)
    assert not refused.promote and refused.reason.startswith("REFUSE: every_check_passed")
    assert not decide(PROVEN, runs(power=340.0), CAPS, accept_slower=True).promote


def _document(kind, time, decode, **extra):
    return {"kind": kind, "time": time, "figures": {"decode_tok_s": decode, "ttft_s": 0.5},
            "workload": {"prompt_tokens": 1024, "output_tokens": 128},
            "provenance": {"concurrency": [1, 4]}, **extra}


def test_the_proven_result_is_the_newest_promoting_gate_or_passing_verification(tmp_path):
    from rigkit.verify.gate_record import proven_baseline, workload_of
    from rigkit.verify.history import write_document

    assert proven_baseline(tmp_path) is None and workload_of(None)["prompt_tokens"] == 2048
    write_document(tmp_path / "a.json", _document("verification", "2026-12-01T10:00:00+00:00", 100.0, passed=True))
    write_document(tmp_path / "gate-b.json", _document("gate", "2026-12-01T11:00:00+00:00", 90.0, promoted=True))
    # newer, but neither proves anything: a refused gate, a failed verification, a tune run, a cut-off file
    write_document(tmp_path / "gate-c.json", _document("gate", "2026-12-01T12:00:00+00:00", 14.0, promoted=False))
    write_document(tmp_path / "d.json", _document("verification", "2026-12-01T12:00:01+00:00", 14.0, passed=False))
    write_document(tmp_path / "tune-e.json", _document("tune", "2026-12-01T13:00:00+00:00", 5.0))
    (tmp_path / "z.json").write_text('{"kind": "verif')
    warnings = []
    base = proven_baseline(tmp_path, warnings.append)
    assert base["figures"]["decode_tok_s"] == 90.0
    assert [w.split(":")[0] for w in warnings] == [str(tmp_path / "z.json")]
    assert workload_of(base) == {"prompt_tokens": 1024, "output_tokens": 128, "concurrency": [4]}
    write_document(tmp_path / "f.json", _document("verification", "2026-12-01T14:00:00+00:00", 95.0, passed=True))
    assert proven_baseline(tmp_path, None)["figures"]["decode_tok_s"] == 95.0


def test_a_refusal_fits_one_screen_with_old_and_new_figures(tmp_path):
    from rigkit.verify.gate_record import gate_document, refusal_screen

    candidates = [_document("verification", "2026-12-01T10:00:00+00:00", d, passed=True,
                            bench={"acceptance_length": 2.4}, checks=[]) for d in (14.2, 14.3, 14.4)]
    verdict = decide(PROVEN, [from_result(c) for c in candidates], CAPS)
    baseline = _document("gate", "2026-12-01T09:00:00+00:00", 100.0, promoted=True, bench={"acceptance_length": 2.4})
    document = gate_document("rig-a", "m", baseline, {"prompt_tokens": 1024, "output_tokens": 128}, candidates,
                             verdict, False, False, "f" * 64, {"said": "ROLLED BACK to the last proven config; its "
                                                                "verification passed: ..."})
    screen = refusal_screen("m", document, tmp_path / "gate.json", "/etc/rigkit/stacks/m")
    lines = screen.splitlines()
    assert lines[0] == "rollout gate REFUSED m: decode"
    assert "proven (gate of 2026-12-01T09:00:00+00:00): decode 100.0 tok/s, TTFT 0.500 s, acceptance length 2.40" in screen
    assert "candidate (3 runs): decode 14.3 tok/s (CV 0.7%), TTFT 0.500 s" in screen
    assert "FAIL  decode: proven 100.0 tok/s, candidate 14.3 tok/s (mean of 3): 85.7% slower" in screen
    assert "ROLLED BACK to the last proven config" in screen
    assert lines[-1] == "a slower config meant on purpose: rigkit deploy INVENTORY --accept-slower m"
    assert len(lines) <= 24


def test_accept_slower_must_name_a_model_the_deployed_rigs_serve(tmp_path, monkeypatch, capsys):
    """`rigkit deploy --accept-slower MODEL`, checked offline before pyinfra starts (no rig is reached)."""
    import rigkit.cli
    import rigkit.plumbing.pyinfra_command
    from tests.test_hostile_inputs import inventory, workspace

    rig, catalog = workspace(tmp_path)  # serves test-alpha only
    key = tmp_path / "id"
    key.write_text("k")
    key.chmod(0o600)
    inv = str(inventory(tmp_path, rig, catalog, key=key))
    asked = []
    monkeypatch.setattr(rigkit.plumbing.pyinfra_command, "run_here", lambda argv, command: asked.append(argv) or 0)
    assert rigkit.cli.main(["deploy", inv, "--accept-slower", "test-beta"]) == 2
    err = capsys.readouterr().err
    assert "--accept-slower 'test-beta': no rig this deploy reaches serves a model of that name; " \
           "models served: test-alpha" in err, err
    assert rigkit.cli.main(["deploy", inv, "--accept-slower", "test-alpha", "--no-verify"]) == 2
    assert "without verification there is no rollout gate" in capsys.readouterr().err
    assert asked == []
    assert rigkit.cli.main(["deploy", inv, "--accept-slower", "test-alpha"]) == 0
    assert asked == [["-y", "--data", "rigkit_accept_slower=test-alpha", inv, "deploy.py"]]


def test_a_bad_accept_slower_value_in_the_deploy_data_is_a_config_error():
    from types import SimpleNamespace

    from rigkit.config.inventory import RigConfigError, run_options

    host = SimpleNamespace(name="rig-a", data={"rigkit_accept_slower": "test-alpha, ../x"})
    with pytest.raises(RigConfigError, match=r"rigkit_accept_slower 'test-alpha, ../x': '../x' is not a model name"):
        run_options(host)
    host.data["rigkit_accept_slower"] = "test-alpha,test-beta"
    assert run_options(host).accept_slower == {"test-alpha", "test-beta"}


def test_small_slowdowns_that_add_up_are_refused_against_the_anchor(tmp_path):
    """100 -> 98 -> 95 -> 94 -> 93 -> 85 tok/s, each a promoted rollout written as the gate writes it: every
    step is under 10% from the last proven result, but 85 is 15% below the result that set the line (the
    gate that established 100): refused by `drift`, not by `decode`. An --accept-slower promotion sets the
    line anew."""
    import json

    from rigkit.verify.gate_record import anchor_result, proven_baseline, proven_history

    def promoted(n: int, decode: float, **flags) -> None:
        document = {"kind": "gate", "time": f"2026-12-03T10:{n:02d}:00+00:00", "promoted": True, "passed": True,
                    "figures": {"decode_tok_s": decode, "ttft_s": 0.5}, **flags}
        (tmp_path / f"gate-{n:02d}.json").write_text(json.dumps(document))

    def gate(decode: float):
        baseline, anchor = proven_baseline(tmp_path), anchor_result(proven_history(tmp_path))
        anchor = None if anchor["time"] == baseline["time"] else anchor
        return decide(from_result(baseline), runs(decode=(decode,) * 3, ttft=(0.5,) * 3, acceptance=None),
                      anchor=from_result(anchor) if anchor else None,
                      anchor_label=f"gate of {anchor['time']}" if anchor else "")

    promoted(0, 100.0, establishes=True)
    for n, decode in enumerate((98.0, 95.0, 94.0, 93.0), start=1):
        verdict = gate(decode)
        assert verdict.promote, verdict.reason
        promoted(n, decode)
    verdict = gate(85.0)
    assert [c.name for c in verdict.failed] == ["drift"], verdict.reason
    assert "drift: against the anchor (gate of 2026-12-03T10:00:00+00:00): anchor 100.0 tok/s, candidate 85.0 tok/s" \
           in verdict.reason, verdict.reason
    assert "15.0% slower" in verdict.reason
    promoted(5, 85.0, accepted_slower=True)  # `rigkit deploy --accept-slower`: the line is set anew
    assert gate(84.0).promote


def test_exactly_the_allowance_slower_is_refused():
    """The rule as docs/serving.md states it: a candidate 10% or more slower is refused; 9.9% passes."""
    assert not decide(PROVEN, runs(decode=(90.0,) * 3)).promote
    assert decide(PROVEN, runs(decode=(90.1,) * 3)).promote


def test_a_noisy_cache_hit_widens_the_prefix_cache_line_and_a_loss_is_still_caught():
    """Measured on vLLM 0.32's CPU build: the repeated prompt's TTFT of one config over three runs, 0.068, 0.066
    and 0.031 s (CV 38%), and the same config restored after a rollback measured over twice the proven's
    0.055 s. With the runs' noise the line is 1 + 3x the CV; a lost cache (x8) is refused all the same."""
    proven = from_result({"figures": {"decode_tok_s": 100.0, "ttft_s": 0.12}, "passed": True,
                          "bench": {"repeat_ttft_s": 0.055},
                          "runs": {"repeat_ttft_s": {"mean": 0.055, "cv": 0.38, "runs": [0.068, 0.066, 0.031]}}})
    same = [RunFigures(100.0, 0.12, repeat_ttft_s=v) for v in (0.131, 0.09, 0.12)]
    verdict = decide(proven, same)
    assert verdict.promote and "widened by the runs' noise" in verdict.reason, verdict.reason
    lost = [RunFigures(100.0, 0.12, repeat_ttft_s=v) for v in (0.44, 0.45, 0.43)]
    assert [c.name for c in decide(proven, lost).failed] == ["prefix_cache"]


def test_a_verification_the_gate_saved_is_judged_by_its_runs_mean_and_noise():
    """The gate saves the middle of its 3 runs as the deploy's verification, with the runs' summary: the next
    gate compares with their mean and counts their CV, not with the middle run alone."""
    saved = {"figures": {"decode_tok_s": 1220.8, "ttft_s": 0.114}, "passed": True, "bench": {"repeat_ttft_s": 0.05},
             "runs": {"decode_tok_s": {"mean": 1147.1, "cv": 0.083, "runs": [1055.0, 1220.8, 1165.5]},
                      "ttft_s": {"mean": 0.130, "cv": 0.1, "runs": [0.12, 0.13, 0.14]}}}
    proven = from_result(saved)
    assert (proven.decode_tok_s, proven.decode_cv, proven.ttft_s) == (1147.1, 0.083, 0.130)
    # the equal config of a fresh-clone run (958.2 tok/s, CV 6.1%): refused against the middle run alone
    candidate = [RunFigures(d, 0.118) for d in (900.0, 958.2, 1016.4)]
    assert decide(proven, candidate).promote
    assert not decide(from_result({**saved, "runs": None}), candidate).promote


def test_a_refusal_near_the_line_asks_for_a_second_start_and_both_starts_are_judged_together():
    """Measured on vLLM 0.32's CPU build (CI, an equal config): proven 1160 tok/s, the candidate's first start
    1025 at a runs' CV of 1.0%, 11.7% slower, the next start of the proven config 1160 again. Near the line
    on one start: a second look. Its second start at the proven level: the six runs spread by the starts'
    difference, which widens the allowance, and it is promoted. Slower on both starts: still refused."""
    proven = RunFigures(decode_tok_s=1160.2, ttft_s=0.099)
    first = runs(decode=(1020.0, 1035.0, 1019.0), ttft=(0.107, 0.106, 0.108), acceptance=None)
    verdict = decide(proven, first)
    assert not verdict.promote and verdict.second_look, verdict.reason
    second = runs(decode=(1150.0, 1171.0, 1158.0), ttft=(0.100, 0.098, 0.101), acceptance=None)
    both = decide(proven, [*first, *second], starts=2)
    assert both.promote and not both.second_look, both.reason
    assert "6 candidate run(s) over 2 starts of the candidate" in both.reason, both.reason
    again = decide(proven, [*first, *runs(decode=(1022.0, 1030.0, 1026.0), ttft=(0.107,) * 3, acceptance=None)],
                   starts=2)
    assert not again.promote and not again.second_look and "decode" in [c.name for c in again.failed], again.reason


@pytest.mark.parametrize("candidates, why", [
    (runs(decode=(79.0, 80.0, 81.0)), "20% slower: twice the allowance, a plain regression"),
    (runs(decode=(95.0, 95.0, 95.0), passed=False), "a run failed its own checks"),
    (runs(acceptance=1.0), "the drafter's acceptance collapsed"),
    (runs(power=400.0), "a GPU over its cap"),
])
def test_no_second_look_for_a_plain_regression_or_a_failure_a_start_cannot_explain(candidates, why):
    verdict = decide(PROVEN, candidates, CAPS)
    assert not verdict.promote and not verdict.second_look, (why, verdict.reason)


def test_a_second_look_is_asked_for_once():
    verdict = decide(PROVEN, runs(decode=(88.0, 88.5, 88.2)) * 2, starts=2)
    assert not verdict.promote and not verdict.second_look


def test_one_stalled_run_does_not_decide_ttft_a_second_start_does():
    """Measured on vLLM 0.32's CPU build in a fresh clone: a config restored after a rollback read TTFT runs of
    0.19, 0.12 and 0.98 s against a proven 0.197, 0.108 and 0.095 s (the first run after a start is the
    slowest every time). Their means (0.432 against 0.133 s) failed it outright; their medians ask for a
    second start, whose runs decide."""
    saved = {"figures": {"decode_tok_s": 1325.0, "ttft_s": 0.108}, "passed": True, "bench": {},
             "runs": {"decode_tok_s": {"mean": 1325.0, "cv": 0.026, "runs": [1293.7, 1319.2, 1362.3]},
                      "ttft_s": {"mean": 0.133, "cv": 0.416, "runs": [0.197, 0.108, 0.095]}}}
    proven = from_result(saved)
    assert proven.ttft_s == 0.108  # the median of its runs
    first = runs(decode=(1129.9, 1131.0, 1128.8), ttft=(0.192, 0.121, 0.984), acceptance=None)
    verdict = decide(proven, first)
    [ttft] = [c for c in verdict.checks if c.name == "ttft"]
    assert not ttft.passed and "candidate 0.192 s (median of 3)" in ttft.message, ttft.message
    assert verdict.second_look, verdict.reason
    second = runs(decode=(1300.0, 1310.0, 1290.0), ttft=(0.188, 0.123, 0.106), acceptance=None)
    assert decide(proven, [*first, *second], starts=2).promote
