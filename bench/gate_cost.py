"""What does the rollout gate cost, and how often is it wrong?

1. Seconds per model (measured): rigkit's benchmark client against a local vLLM stand-in (no Docker)
   decoding at test-alpha's rate, at verification's workload (2048 prompt, 256 output tokens). Before
   the gate a changing deploy benchmarked each model once; the gate benchmarks a new config
   GATE_RUNS times (and that replaces the verification), so a promotion adds GATE_RUNS - 1 runs; a
   refusal adds the rollback's own GATE_RUNS runs on top (plus the rollback's restart, not counted).
2. False rollbacks and misses (simulated, no server): rigkit.verify.gate.decide on figures drawn with
   the stand-in's run-to-run noise (STANDIN_NOISE_SHARE: relative sd 0.6% of decode, 0.9% of prefill
   and so of TTFT), the proven figures themselves the mean of GATE_RUNS noisy runs (a promoting gate's
   document), for configs 0-20% slower and eager mode (7x), with the gate's second look (a second start's
   runs, judged with the first's, for a refusal near the line); also with a level drawn per start, as
   vLLM's CPU build shows (bench/gate_engine_starts.py). Seeded; TRIALS per row.
   The same through real rollouts on a simulated rig (fewer of them, minutes each batch):
   bench/gate_rollouts.py.

    .venv/bin/python bench/gate_cost.py [--trials N] [--skip-timing]
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rigkit.verify.gate import ALLOWANCE, RunFigures, decide  # noqa: E402
from rigkit.verify.gate_record import GATE_RUNS  # noqa: E402

DECODE_TOK_S, PREFILL_TOK_S = 100.0, 4000.0  # test-alpha's stand-in
PROMPT_TOKENS, OUTPUT_TOKENS = 2048, 256  # verification's workload (roles/verify.py)
NOISE = 0.006  # the stand-in's default STANDIN_NOISE_SHARE (decode; prefill 1.5x)
SLOWER = (0.0, 0.02, 0.05, 0.08, 0.09, 0.10, 0.11, 0.12, 0.15, 0.20, 6 / 7)


def timing() -> tuple[float, float]:
    """Seconds of one benchmark run, mean and sd over GATE_RUNS, against a local stand-in."""
    from rigkit.verify.client import run_bench
    from tests.standin import standin

    with tempfile.TemporaryDirectory() as folder, standin(
            Path(folder), standin_decode_tok_s=str(DECODE_TOK_S), standin_prefill_tok_s=str(PREFILL_TOK_S),
            standin_noise_share=str(NOISE), standin_seed="29") as url:
        seconds = []
        for _ in range(GATE_RUNS):
            started = time.monotonic()
            result = run_bench(url, "m", PROMPT_TOKENS, OUTPUT_TOKENS, timeout_s=120)
            seconds.append(time.monotonic() - started)
            assert result.passed, result.checks
    return statistics.fmean(seconds), statistics.stdev(seconds)


def draw(rng: random.Random, slower: float, noise: float, level: float = 1.0) -> RunFigures:
    """One run: `noise` the run-to-run relative sd, `level` its start's factor (the same for a start's runs)."""
    decode = DECODE_TOK_S * (1 - slower) * level * rng.gauss(1, noise)
    prefill = PREFILL_TOK_S * (1 - slower) * level * rng.gauss(1, noise * 1.5)
    return RunFigures(decode_tok_s=decode, ttft_s=PROMPT_TOKENS / prefill)


def start(rng: random.Random, slower: float, noise: float, start_noise: float) -> list[RunFigures]:
    """GATE_RUNS runs of one start: its level drawn once (`start_noise`, the relative sd between starts)."""
    level = rng.gauss(1, start_noise) if start_noise else 1.0
    return [draw(rng, slower, noise, level) for _ in range(GATE_RUNS)]


def proven(rng: random.Random, noise: float, start_noise: float) -> RunFigures:
    """A promoting gate's document: its runs' means and their CVs (which the gate counts as the proven noise)."""
    runs = start(rng, 0.0, noise, start_noise)
    decode, ttft = [r.decode_tok_s for r in runs], [r.ttft_s for r in runs]
    return RunFigures(statistics.fmean(decode), statistics.fmean(ttft),
                      decode_cv=statistics.stdev(decode) / statistics.fmean(decode),
                      ttft_cv=statistics.stdev(ttft) / statistics.fmean(ttft))


def refused_share(slower: float, noise: float, start_noise: float, trials: int,
                  rng: random.Random, second_look: bool = True) -> tuple[float, float]:
    """(refused share, share that took a second look: a second start's runs, judged with the first's)."""
    refused = looked = 0
    for _ in range(trials):
        reference, runs = proven(rng, noise, start_noise), start(rng, slower, noise, start_noise)
        verdict = decide(reference, runs)
        if verdict.second_look and second_look:
            looked += 1
            verdict = decide(reference, [*runs, *start(rng, slower, noise, start_noise)], starts=2)
        refused += not verdict.promote
    return refused / trials, looked / trials


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=10000)
    parser.add_argument("--skip-timing", action="store_true", help="only the simulation")
    parser.add_argument("--no-second-look", action="store_true", help="the gate before its second look, to compare")
    args = parser.parse_args()

    if not args.skip_timing:
        run_s, sd_s = timing()
        print(f"one benchmark run at {PROMPT_TOKENS}/{OUTPUT_TOKENS} tokens, {DECODE_TOK_S:.0f} tok/s decode, "
              f"{PREFILL_TOK_S:.0f} tok/s prefill: {run_s:.2f} s (sd {sd_s:.2f} s, {GATE_RUNS} runs, local stand-in)")
        print(f"the gate adds per model: {(GATE_RUNS - 1) * run_s:.1f} s to a promoted rollout "
              f"({GATE_RUNS} runs instead of verification's 1), "
              f"{(2 * GATE_RUNS - 1) * run_s:.1f} s to a refused one (+ the rollback's {GATE_RUNS} runs and restart)")
        print(f"  (a run is about warm-up + {PROMPT_TOKENS}/prefill + {OUTPUT_TOKENS}/decode + a repeat prompt: "
              f"on a real model at 30 tok/s decode, ~{OUTPUT_TOKENS / 30:.0f} s per run)")
    print()
    print(f"refused share (and the share that took a second look), {args.trials} trials per row, seeded; "
          f"proven = mean of {GATE_RUNS} runs; allowance {ALLOWANCE:.0%} or 3x the runs' CV")
    # (run-to-run sd, start-to-start sd): the stand-in's; plain run noise; vLLM's CPU build as measured by
    # bench/gate_engine_starts.py (runs' CV 9.3% on average, between starts 6.8%).
    noises = ((NOISE, 0.0), (0.02, 0.0), (0.05, 0.0), (0.02, 0.068), (0.093, 0.068))
    print(f"{'config':>22} " + " ".join(f"{f'runs {n:.1%} starts {s:.1%}':>24}" for n, s in noises))
    for slower in SLOWER:
        rng = random.Random(f"gate-{slower}")
        label = "eager (decode /7)" if slower > 0.5 else ("unchanged" if slower == 0 else f"{slower:.0%} slower")
        shares = [refused_share(slower, n, s, args.trials, rng, not args.no_second_look) for n, s in noises]
        kind = "false rollbacks" if slower < ALLOWANCE else "caught" if slower > ALLOWANCE else "caught (at the line)"
        print(f"{label:>22} " + " ".join(f"{f'{r:.2%} ({k:.0%})':>24}" for r, k in shares) + f"   {kind}")
    print("(a config s slower in both rates has a TTFT 1/(1-s) longer: 9% slower is 9.9% longer TTFT, at the line)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
