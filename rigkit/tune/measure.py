"""One measurement of the setting in force, and `--hold`'s loop of them. Only reads the GPUs.

A measurement is one single-stream benchmark (rigkit.verify.client: tokens from the API's usage)
with the NVML sampler (rigkit.verify.telemetry) running around it; the GPUs' draw, peak SM clock
and power-cap share are taken over the decode phase only (first to last token), so the energy
figures come from measured phase power, never from the configured cap. The sampler is anything
with start()/stop(): in-process here (a machine with the GPUs and the server, no SSH), or on the
rig over SSH (rigkit.tune.remote).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Callable, Protocol

from rigkit.tune.cells import Figures, GpuTelemetry
from rigkit.tune.stats import Summary, summarise

SW_POWER_CAP = 0x4  # NVML clocks event reason: the power limit holds the clock down
HOLD_SAMPLE_HZ = 20.0


class MeasurementError(Exception):
    """A measurement that produced no usable figures; str() says why."""


class Sampling(Protocol):
    def start(self) -> None: ...
    def stop(self) -> dict: ...  # rigkit.verify.telemetry's document


class LocalSampling:
    """The NVML sampler in this process: for a machine that has the GPUs itself."""

    def __init__(self, gpu_indices: list[int], hz: float = HOLD_SAMPLE_HZ):
        self.gpu_indices, self.hz = gpu_indices, hz

    def start(self) -> None:
        from rigkit.verify.telemetry import Sampler

        self.sampler = Sampler(self.gpu_indices, self.hz).start()

    def stop(self) -> dict:
        return self.sampler.stop()


@dataclass(frozen=True)
class BenchSettings:
    prompt_tokens: int = 512
    output_tokens: int = 128
    timeout_s: float = 120.0
    api_key: str | None = None


def measure_once(url: str, model: str, sampling: Sampling | None, settings: BenchSettings) -> Figures:
    from rigkit.verify.client import run_bench

    if sampling:
        sampling.start()
    try:
        bench = run_bench(url, model, settings.prompt_tokens, settings.output_tokens,
                          timeout_s=settings.timeout_s, api_key=settings.api_key)
    finally:
        telemetry = sampling.stop() if sampling else None
    failed = [c.message for c in bench.checks if not c.passed]
    if bench.decode_tok_s is None or bench.prefill_tok_s is None:
        raise MeasurementError("the benchmark gave no decode or prefill rate: " + ("; ".join(failed) or
                               "; ".join(bench.warnings) or "no reason given"))
    gpus = decode_phase(telemetry, bench.wall_first_token_s, bench.wall_last_token_s) if telemetry else ()
    return Figures(bench.decode_tok_s, bench.prefill_tok_s, gpus)


def decode_phase(telemetry: dict, t0: float | None, t1: float | None) -> tuple[GpuTelemetry, ...]:
    """Per GPU: mean draw, peak SM clock and the share of samples power-capped between t0 and t1."""
    out = []
    for gpu in telemetry["gpus"]:
        s = gpu["samples"]
        power = s["power_instant_w"] if any(v is not None for v in s["power_instant_w"]) else s["power_average_w"]
        inside = [i for i, t in enumerate(s["t"]) if t0 is not None and t1 is not None and t0 <= t <= t1]
        watts = [power[i] for i in inside if power[i] is not None]
        clocks = [s["sm_mhz"][i] for i in inside if s["sm_mhz"][i] is not None]
        reasons = [s["event_reasons"][i] for i in inside if s["event_reasons"][i] is not None]
        out.append(GpuTelemetry(gpu["index"], statistics.fmean(watts) if watts else None,
                                max(clocks) if clocks else None,
                                sum(1 for r in reasons if r & SW_POWER_CAP) / len(reasons) if reasons else None))
    return tuple(out)


@dataclass(frozen=True)
class HoldResult:
    """`--hold`: the same setting measured `n` times in a row."""

    readings: tuple[Figures, ...]
    decode_tok_s: Summary
    prefill_tok_s: Summary
    power_w: Summary | None

    @property
    def decode_cv(self) -> float | None:
        """Run-to-run coefficient of variation of decode tok/s: the noise a sweep must beat."""
        return self.decode_tok_s.sd / self.decode_tok_s.mean if self.decode_tok_s.sd is not None else None

    def repeats_to_resolve(self, difference_share: float) -> int | None:
        """Measurements per cell for a difference of `difference_share` (e.g. 0.01) to fall outside the
        noise of a two-cell comparison at ~95% (2 x 1.96^2 x CV^2 / d^2, at least 2)."""
        if self.decode_cv is None:
            return None
        return max(2, int(2 * 1.96 ** 2 * self.decode_cv ** 2 / difference_share ** 2 + 0.999))

    def to_json(self) -> dict:
        def summary(s: Summary | None):
            return None if s is None else {"n": s.n, "mean": s.mean, "sd": s.sd, "low": s.low if s.sd else None,
                                           "high": s.high if s.sd else None}
        return {"n": len(self.readings), "decode_tok_s": summary(self.decode_tok_s),
                "prefill_tok_s": summary(self.prefill_tok_s), "power_w": summary(self.power_w),
                "decode_cv": self.decode_cv, "repeats_for_1pct": self.repeats_to_resolve(0.01),
                "readings": [{"decode_tok_s": f.decode_tok_s, "prefill_tok_s": f.prefill_tok_s,
                              "power_w": f.mean_power_w} for f in self.readings]}


def hold(measure: Callable[[], Figures], repeats: int, progress: Callable[[int, Figures], None] = lambda n, f: None) -> HoldResult:
    """Measure the setting in force `repeats` times; change nothing."""
    readings = []
    for n in range(1, repeats + 1):
        readings.append(measure())
        progress(n, readings[-1])
    watts = [f.mean_power_w for f in readings]
    return HoldResult(tuple(readings), summarise([f.decode_tok_s for f in readings]),
                      summarise([f.prefill_tok_s for f in readings]),
                      summarise(watts) if None not in watts and watts else None)


def hold_text(result: HoldResult) -> str:
    d, p = result.decode_tok_s, result.prefill_tok_s
    lines = [f"hold: {len(result.readings)} measurements of the setting in force (nothing changed)",
             f"decode tok/s  mean {d.mean:.2f}  sd {d.sd or 0:.3f}  95% CI {d.low:.2f}-{d.high:.2f}  "
             f"CV {result.decode_cv or 0:.2%}" if d.sd is not None else f"decode tok/s  {d.mean:.2f} (one reading)",
             f"prefill tok/s mean {p.mean:.1f}  sd {p.sd or 0:.2f}"]
    if result.power_w:
        lines.append(f"decode power  mean {result.power_w.mean:.1f} W (measured)")
    if (n := result.repeats_to_resolve(0.01)) is not None:
        lines.append(f"to tell two settings 1% apart: about {n} measurements per cell; 2%: "
                     f"{result.repeats_to_resolve(0.02)}")
    return "\n".join(lines)


def main(argv=None) -> int:
    """`--hold` without SSH, on the machine with the GPUs and the server:
    python -m rigkit.tune.measure --url http://127.0.0.1:8000 --model NAME --gpus 0 --repeats 8"""
    import argparse
    import json
    import sys

    parser = argparse.ArgumentParser(prog="python -m rigkit.tune.measure", description=main.__doc__.splitlines()[0])
    parser.add_argument("--url", required=True)
    parser.add_argument("--model", required=True)
    parser.add_argument("--gpus", default="0", help="GPU indices to sample; empty: no sampler")
    parser.add_argument("--repeats", type=int, default=8)
    parser.add_argument("--prompt-tokens", type=int, default=512)
    parser.add_argument("--output-tokens", type=int, default=128)
    parser.add_argument("--json", help="write the result here")
    args = parser.parse_args(argv)
    if not 2 <= args.repeats <= 200:
        print("--repeats: give 2-200 measurements", file=sys.stderr)
        return 2
    gpus = [int(i) for i in args.gpus.split(",")] if args.gpus else []
    settings = BenchSettings(args.prompt_tokens, args.output_tokens)
    try:
        result = hold(lambda: measure_once(args.url, args.model, LocalSampling(gpus) if gpus else None, settings),
                      args.repeats, lambda n, f: print(f"  [{n}/{args.repeats}] decode {f.decode_tok_s:.2f} tok/s", flush=True))
    except MeasurementError as exc:
        print(f"hold: {exc}", file=sys.stderr)
        return 1
    print(hold_text(result))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result.to_json(), f, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
