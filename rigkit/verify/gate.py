"""The rollout gate's decision: promote a candidate serving config, or refuse it, from the last
proven result's figures and at least three runs of the candidate. Pure; the rig-side gate that
measures and acts (templates/serving/rigkit-stack) is not here.

Refused when any of these fails (each is a `Check`, all reported at once):
- runs: fewer than MIN_RUNS candidate runs (noise cannot be judged from fewer);
- every_check_passed: a candidate run failed one of its own checks;
- decode: the candidate's mean decode tok/s is ALLOWANCE (10%) or more below the proven one's,
  or 3x the noise of the two means when that is larger (then the reason says the allowance was
  widened, and by what): the candidate runs' coefficient of variation, combined (root of the sum of
  squares) with the proven runs' where the proven result records one (a gate's runs). Noisy runs are
  not called a regression, and neither is a proven mean that was itself noisy: on vLLM's CPU build the
  drafter's acceptance moves with the prompt, and a proven 1303 tok/s (CV 11.7%) was met by its own
  config at 1118 (CV 3.8%) after a rollback. The widening stops at MAX_ALLOWANCE (50%): a candidate at
  half the proven speed is refused however noisy the runs were;
- drift: the candidate's mean decode is ALLOWANCE (or the noise allowance above) or more below the
  anchor's, the proven result that last set the line (rigkit.verify.gate_record.anchor_result): each
  step of 100 -> 98 -> 95 -> 93 -> 85 tok/s is under 10% from the last, the last is 15% from 100;
- ttft: the median time to first token is that allowance (from the TTFT runs' own CV) or more above. The
  median, not the mean: one stall of a loaded machine in one run moves a mean of three (a restored config's
  runs of 0.19, 0.12 and 0.98 s read 3.2x the proven 0.133 s and failed its verification after a rollback);
- acceptance: with drafting, accepted tokens per draft (mean acceptance length - 1) fell below
  ACCEPTANCE_COLLAPSE (half) of the proven one's: a drafter run in the wrong dtype accepts
  nothing and says nothing;
- prefix_cache: the measured prompt sent once more (the bench's `repeat_ttft_s`) took more than
  PREFIX_CACHE_LOSS (2x) as long as the proven one's: prefix caching lost (a repeated 11k-token prompt
  went 0.86 s -> 7 s). A collapse check, not a share: a cache hit takes milliseconds, too noisy for 10%;
- gpu_caps: a GPU's mean power under load above its cap (by more than POWER_TOLERANCE).

A second look: a refusal by share checks alone (decode, drift, ttft), each failed by less than
SECOND_LOOK (2x) its allowance, is not final after one start of the candidate. The engine's level moves
from one start to the next by more than the runs of one start spread (vLLM's CPU build: one config's
starts measured 0.89-1.14x of the start before at runs' CVs of 3.5-20%, bench/gate_engine_starts.py;
an equal config was once refused 11.7% slower at a runs' CV of 1.0%). The caller restarts the
candidate, measures it as many times again and decides on the runs of both starts (`starts` 2): the
spread between the starts is then in the runs' CV, and a candidate slower on both is refused. A plain
regression (twice the allowance or more) or any other failed check is refused after one start.

With no proven result yet (`proven` None) the candidate establishes it: decode, TTFT and acceptance
are recorded, not compared, and the reason says so. A slower config accepted on purpose
(`rigkit deploy --accept-slower MODEL`) waives the speed checks only (SPEED_CHECKS): the
verdict says which were waived; a failed check of a run, too few runs or a GPU over its cap still refuse.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field

from rigkit.verify.checks import POWER_TOLERANCE, Check

MIN_RUNS = 3
ALLOWANCE = 0.10  # a candidate 10% or more slower (or TTFT 10% or more longer) is refused
NOISE_FACTOR = 3.0  # ... or 3x the candidate runs' coefficient of variation, when that is larger
# ... but never more than this: at a CV of a third nothing could be refused at all. A speculative config on
# vLLM's CPU build gave proven runs of 1237, 2002 and 1214 tok/s (the drafter's acceptance moves with the
# prompt: CV 30%), which widened the line to 95% and let a config without the drafter through at 75%
# slower (362-420 tok/s, below every proven run). No such noise makes a mean of three runs half as fast.
MAX_ALLOWANCE = 0.5
ACCEPTANCE_COLLAPSE = 0.5  # accepted tokens per draft below half the proven one's
PREFIX_CACHE_LOSS = 2.0  # the repeated prompt's TTFT more than twice the proven one's


@dataclass(frozen=True)
class RunFigures:
    """One run's figures: of the proven config (from its result) or of one candidate run."""

    decode_tok_s: float | None
    ttft_s: float | None
    acceptance_length: float | None = None  # mean acceptance length; None when not drafting or unknown
    passed: bool = True
    failed_checks: tuple[str, ...] = ()
    gpu_power_w: dict[int, float] = field(default_factory=dict)  # mean power under load per GPU index
    repeat_ttft_s: float | None = None  # the measured prompt sent once more: a prefix-cache hit
    decode_cv: float | None = None  # a proven result's runs' coefficients of variation (a gate's), if recorded
    ttft_cv: float | None = None
    repeat_ttft_cv: float | None = None


def from_result(document: dict) -> RunFigures:
    """A verification result document's figures (docs/verification.md)."""
    figures = document.get("figures") or {}
    bench = document.get("bench") or {}
    runs = document.get("runs") or {}

    def stat(name: str, key: str) -> float | None:
        value = (runs.get(name) or {}).get(key) if isinstance(runs.get(name), dict) else None
        return float(value) if isinstance(value, (int, float)) and value >= 0 else None

    def median(name: str, single):
        """The runs' median where the result records them (TTFT: see the module's docstring), else `mean`'s."""
        values = (runs.get(name) or {}).get("runs") if isinstance(runs.get(name), dict) else None
        values = [v for v in values or [] if isinstance(v, (int, float)) and v >= 0]
        return statistics.median(values) if values else mean(name, single)

    def mean(name: str, single):
        """The runs' mean where the result records its runs (a gate's; a verification the gate saved), else
        the one run's figure: a middle run alone is a sample of the same noise."""
        value = stat(name, "mean")
        return single if value is None else value
    return RunFigures(
        decode_tok_s=mean("decode_tok_s", figures.get("decode_tok_s")), ttft_s=median("ttft_s", figures.get("ttft_s")),
        acceptance_length=bench.get("acceptance_length"), passed=bool(document.get("passed")),
        failed_checks=tuple(c.get("name", "?") for c in document.get("checks", []) if not c.get("passed")),
        gpu_power_w={g["index"]: g["mean_power_under_load_w"] for g in document.get("gpus", [])
                     if g.get("mean_power_under_load_w") is not None},
        repeat_ttft_s=mean("repeat_ttft_s", bench.get("repeat_ttft_s")), decode_cv=stat("decode_tok_s", "cv"),
        ttft_cv=stat("ttft_s", "cv"), repeat_ttft_cv=stat("repeat_ttft_s", "cv"))


SPEED_CHECKS = ("decode", "drift", "ttft", "acceptance", "prefix_cache")  # what --accept-slower waives
SHARE_CHECKS = ("decode", "drift", "ttft")  # judged by a share of the reference: the ones a start's level can fail
SECOND_LOOK = 2.0  # a share check failed by less than twice its allowance is measured again on a second start


@dataclass(frozen=True)
class Verdict:
    promote: bool
    checks: list[Check]
    establishes: bool = False  # no proven result yet: this candidate's figures become the first
    waived: tuple[str, ...] = ()  # failed speed checks accepted with --accept-slower
    second_look: bool = False  # refused by share checks only, each by less than SECOND_LOOK x its allowance

    @property
    def failed(self) -> list[Check]:
        return [c for c in self.checks if not c.passed]

    @property
    def reason(self) -> str:
        """One screen: the verdict, then each check with the old and new figures."""
        if not self.promote:
            head = "REFUSE: " + ", ".join(c.name for c in self.failed if c.name not in self.waived)
        elif self.waived:
            head = f"PROMOTE, SLOWER AND ACCEPTED (--accept-slower): {', '.join(self.waived)} failed and waived"
        elif self.establishes:
            head = "PROMOTE: no proven result yet; this rollout establishes it"
        else:
            head = "PROMOTE: the candidate is as good as the proven config"

        def mark(c: Check) -> str:
            return "ok  " if c.passed else "WAIVED" if c.name in self.waived else "FAIL"
        return "\n".join([head, *(f"{mark(c)}  {c.name}: {c.message}" for c in self.checks)])


def allowance(values: Sequence[float]) -> tuple[float, float]:
    """(allowance, coefficient of variation) for a figure measured in `values`."""
    mean = statistics.fmean(values)
    cv = statistics.stdev(values) / mean if len(values) > 1 and mean else 0.0
    return min(MAX_ALLOWANCE, max(ALLOWANCE, NOISE_FACTOR * cv)), cv


def decide(proven: RunFigures | None, candidates: Sequence[RunFigures], caps_w: dict[int, float] | None = None,
           accept_slower: bool = False, anchor: RunFigures | None = None, anchor_label: str = "",
           starts: int = 1) -> Verdict:
    """Promote or refuse; `proven` None: no proven result yet (the candidate establishes it);
    `caps_w`: each GPU's power cap in W (None or missing: no cap); `accept_slower`: waive SPEED_CHECKS;
    `anchor`: the proven result that set the line (`anchor_label` says which), when it is not `proven` itself;
    `starts`: how many starts of the candidate the runs span (a second look is asked for after the first only)."""
    establishes = proven is None
    proven = proven or RunFigures(decode_tok_s=None, ttft_s=None)
    over = f" over {starts} starts of the candidate" if starts > 1 else ""
    checks = [Check("runs", len(candidates) >= MIN_RUNS,
                        f"{len(candidates)} candidate run(s){over}; {MIN_RUNS} or more are needed to judge noise")]
    shortfalls: dict[str, float] = {}  # each share check's shortfall over its allowance
    failed_runs = [(n, r.failed_checks) for n, r in enumerate(candidates, 1) if not r.passed]
    checks.append(Check("every_check_passed", not failed_runs, "; ".join(
        f"run {n} failed {', '.join(names) or 'a check'}" for n, names in failed_runs) or
        f"all {len(candidates)} run(s) passed every check"))
    checks.append(_compare("decode", "decode", proven.decode_tok_s, [r.decode_tok_s for r in candidates],
                           "tok/s", higher_is_better=True, old_cv=proven.decode_cv, shortfalls=shortfalls))
    if anchor is not None and not establishes:
        drift = _compare("drift", "decode", anchor.decode_tok_s, [r.decode_tok_s for r in candidates], "tok/s",
                         higher_is_better=True, old_cv=anchor.decode_cv, reference="anchor", shortfalls=shortfalls)
        checks.append(Check("drift", drift.passed, f"against the anchor ({anchor_label}): {drift.message}"))
    checks.append(_compare("ttft", "TTFT", proven.ttft_s, [r.ttft_s for r in candidates], "s", higher_is_better=False,
                           old_cv=proven.ttft_cv, shortfalls=shortfalls, center=statistics.median))
    acceptance = _acceptance(proven.acceptance_length, [r.acceptance_length for r in candidates])
    if acceptance:
        checks.append(acceptance)
    cache = _prefix_cache(proven.repeat_ttft_s, [r.repeat_ttft_s for r in candidates], proven.repeat_ttft_cv)
    if cache:
        checks.append(cache)
    checks.append(_caps(candidates, caps_w or {}))
    if establishes:
        checks = [_established(c, candidates) if c.name in ("decode", "ttft") else c for c in checks]
    waived = tuple(c.name for c in checks if not c.passed and c.name in SPEED_CHECKS) if accept_slower else ()
    promote = all(c.passed or c.name in waived for c in checks)
    failed = [c.name for c in checks if not c.passed and c.name not in waived]
    second_look = (not promote and starts == 1 and all(n in SHARE_CHECKS for n in failed)
                   and all(shortfalls.get(n, SECOND_LOOK) < SECOND_LOOK for n in failed))
    return Verdict(promote, checks, establishes, waived, second_look)


def _established(check: Check, runs: Sequence[RunFigures]) -> Check:
    label, unit, digits = ("decode", "tok/s", ".1f") if check.name == "decode" else ("TTFT", "s", ".3f")
    values = [v for v in (r.decode_tok_s if check.name == "decode" else r.ttft_s for r in runs) if v is not None]
    if not values:
        return Check(check.name, False, f"no candidate run measured {label}: nothing to establish")
    _, cv = allowance(values)
    return Check(check.name, True, f"no proven result yet: this rollout establishes {label} "
                 f"{statistics.fmean(values):{digits}} {unit} (mean of {len(values)}, CV {cv:.1%})")


def _compare(name: str, label: str, old: float | None, runs: list[float | None], unit: str,
             higher_is_better: bool, old_cv: float | None = None, reference: str = "proven",
             shortfalls: dict[str, float] | None = None, center=statistics.fmean) -> Check:
    """`reference`: what `old` is, in the message (the proven result, or the anchor); `shortfalls`: where
    the share by which the candidate is worse, over the allowance, is recorded under `name`."""
    values = [v for v in runs if v is not None]
    if old is None:
        return Check(name, True, f"the {reference} result has no {label}: not compared")
    if len(values) < len(runs) or not values:
        return Check(name, False, f"{len(runs) - len(values)} of {len(runs)} candidate run(s) measured no {label}")
    new = center(values)
    allowed, cv = allowance(values)
    if old_cv:  # both means are noisy: the noise of their difference
        allowed = min(MAX_ALLOWANCE, max(allowed, NOISE_FACTOR * (cv ** 2 + old_cv ** 2) ** 0.5))
    worse = (old - new) / old if higher_is_better else (new - old) / old
    if shortfalls is not None:
        shortfalls[name] = worse / allowed
    noise = f"the runs' CV of {cv:.1%}" + (f" and the {reference} runs' {old_cv:.1%}" if old_cv else "")
    capped = f", at most {MAX_ALLOWANCE:.0%}" if allowed >= MAX_ALLOWANCE else ""
    why = f"{allowed:.1%} allowed" + (f" (widened from {ALLOWANCE:.0%}: 3x {noise}{capped})"
                                       if allowed > ALLOWANCE else f" (runs' CV {cv:.1%})")
    word = ("slower" if higher_is_better else "longer") if worse >= 0 else ("faster" if higher_is_better else "shorter")
    digits = ".1f" if unit == "tok/s" else ".3f"
    detail = (f"{reference} {old:{digits}} {unit}, candidate {new:{digits}} {unit} ({'median' if center is statistics.median else 'mean'} of {len(values)}): "
              f"{abs(worse):.1%} {word}; {why}")
    return Check(name, worse < allowed - 1e-9, detail)


def _acceptance(old: float | None, runs: list[float | None]) -> Check | None:
    if old is None or old <= 1.0:
        return None  # the proven config was not drafting (or accepted nothing): nothing to collapse
    values = [v for v in runs if v is not None]
    if not values:
        return Check("acceptance", True, f"proven mean acceptance length {old:.2f}; the candidate does not "
                         "draft (or its counters are missing): judged on decode alone")
    new = statistics.fmean(values)
    share = (new - 1) / (old - 1)
    return Check("acceptance", share >= ACCEPTANCE_COLLAPSE,
                     f"mean acceptance length proven {old:.2f}, candidate {new:.2f}: accepted tokens per draft "
                     f"{old - 1:.2f} -> {new - 1:.2f} ({share:.0%} of the proven; below "
                     f"{ACCEPTANCE_COLLAPSE:.0%} is a collapse: check the drafter's --dtype)")


def _prefix_cache(old: float | None, runs: list[float | None], old_cv: float | None = None) -> Check | None:
    """A collapse check: x PREFIX_CACHE_LOSS, or 1 + 3x the noise of the two means when that is larger (a
    cache hit takes tens of milliseconds on vLLM's CPU build, and its runs varied by a CV of 38%: the same
    config's repeat once measured over twice the proven one's)."""
    values = [v for v in runs if v is not None]
    if not old or not values:
        return None  # not measured on one side (a prompt too short, an old result): nothing to compare
    new = statistics.fmean(values)
    _, cv = allowance(values)
    limit = max(PREFIX_CACHE_LOSS, 1 + NOISE_FACTOR * (cv ** 2 + (old_cv or 0) ** 2) ** 0.5)
    widened = "; widened by the runs' noise" if limit > PREFIX_CACHE_LOSS else ""
    return Check("prefix_cache", new <= old * limit,
                 f"the measured prompt sent again: TTFT proven {old:.3f} s, candidate {new:.3f} s "
                 f"(x{new / old:.1f}; above x{limit:.3g} the prefix cache is lost{widened}: check "
                 "--enable-prefix-caching)")


def _caps(runs: Sequence[RunFigures], caps_w: dict[int, float]) -> Check:
    over = []
    for index, cap in sorted(caps_w.items()):
        powers = [r.gpu_power_w[index] for r in runs if index in r.gpu_power_w]
        if powers and max(powers) > cap * (1 + POWER_TOLERANCE):
            over.append(f"GPU {index} {max(powers):.0f} W under load, cap {cap:.0f} W")
    return Check("gpu_caps", not over, "; ".join(over) or
                     (f"every GPU under its cap ({', '.join(f'{i}: {c:.0f} W' for i, c in sorted(caps_w.items()))})"
                      if caps_w else "no caps configured"))
