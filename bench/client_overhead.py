"""How fast can rigkit's benchmark client count before it becomes the instrument's error?

Runs the vLLM stand-in locally (a server with a known decode rate) and the client against it
at rising load: per-stream rate x concurrency. For each level it prints the rate the client
measured as a ratio of the known truth, side by side in one run, and ends with the highest
aggregate tok/s measured within 1% of the truth on this machine.

    .venv/bin/python bench/client_overhead.py
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rigkit.verify.client import run_bench  # noqa: E402
from tests.standin import standin  # noqa: E402

LEVELS = [(200, 1), (1000, 1), (2000, 1), (1000, 4), (2000, 4), (1000, 16), (2000, 16), (4000, 16), (2000, 32)]
OUTPUT_TOKENS = 1000
TOLERANCE = 0.01


def main() -> None:
    best = 0.0
    print(f"{'per-stream':>10} {'streams':>7} {'truth tok/s':>11} {'measured':>10} {'ratio':>7}")
    with tempfile.TemporaryDirectory() as tmp:
        for rate, streams in LEVELS:
            with standin(Path(tmp), standin_decode_tok_s=str(rate), standin_prefill_tok_s="1000000") as url:
                result = run_bench(url, "m", prompt_tokens=32, output_tokens=OUTPUT_TOKENS,
                                   concurrency=(streams,) if streams > 1 else (), seed=streams)
            if streams == 1:
                measured = result.decode_tok_s or 0.0
            else:
                level = result.concurrency[0]
                measured = (level.per_stream_decode_tok_s or 0.0) * (streams - len(level.errors))
            truth = rate * streams
            ratio = measured / truth
            if abs(ratio - 1) <= TOLERANCE:
                best = max(best, measured)
            print(f"{rate:>10} {streams:>7} {truth:>11.0f} {measured:>10.0f} {ratio:>7.3f}", flush=True)
    print(f"highest aggregate decode rate measured within {TOLERANCE:.0%} of the truth: {best:.0f} tok/s")


if __name__ == "__main__":
    main()
