"""Per-cell mean and t-based 95% interval, the drift fitted to the controls, and comparisons
that call a difference inside the noise a tie. Standard library only."""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

# Student's t, two-sided 95% (0.975 quantile), df 1..30; beyond that the next table step down.
_T975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145,
         2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048,
         2.045, 2.042)


def t975(df: int) -> float:
    if df < 1:
        return math.inf
    if df <= 30:
        return _T975[df - 1]
    return 2.042 if df <= 40 else 2.021 if df <= 60 else 2.000 if df <= 120 else 1.960


@dataclass(frozen=True)
class Summary:
    n: int
    mean: float
    sd: float | None  # None with one value: no noise estimate, so no interval and no wins

    @property
    def half_width(self) -> float:
        return math.inf if self.sd is None else t975(self.n - 1) * self.sd / math.sqrt(self.n)

    @property
    def low(self) -> float:
        return self.mean - self.half_width

    @property
    def high(self) -> float:
        return self.mean + self.half_width


def summarise(values: list[float]) -> Summary:
    return Summary(len(values), statistics.fmean(values), statistics.stdev(values) if len(values) > 1 else None)


def compare(a: Summary, b: Summary, higher_is_better: bool = True) -> str:
    """"better", "worse" or "tie" for a against b: a win needs the difference's 95% interval
    (Welch, with the smaller sample's degrees of freedom: conservative) to exclude zero."""
    if a.sd is None or b.sd is None:
        return "tie"
    half = t975(min(a.n, b.n) - 1) * math.sqrt(a.sd ** 2 / a.n + b.sd ** 2 / b.n)
    diff = (a.mean - b.mean) if higher_is_better else (b.mean - a.mean)
    if abs(diff) <= half:
        return "tie"
    return "better" if diff > 0 else "worse"


@dataclass(frozen=True)
class Drift:
    """A straight line through the control readings over schedule position."""

    metric: str
    controls: int
    per_slot: float | None  # change per measurement, in the metric's unit
    per_slot_half_width: float | None  # 95% interval of the slope
    level: float | None  # the fitted value at the schedule's centre

    @property
    def significant(self) -> bool:
        return self.per_slot is not None and abs(self.per_slot) > (self.per_slot_half_width or 0.0)

    def describe(self, slots: int) -> str:
        if self.per_slot is None:
            return f"{self.metric}: drift not estimated ({self.controls} control readings; 3 or more needed)"
        over_run = self.per_slot * max(slots - 1, 0)
        share = over_run / self.level if self.level else math.nan
        verdict = "beyond the noise" if self.significant else "inside the noise"
        return (f"{self.metric}: {self.per_slot:+.3f} per measurement (+/- {self.per_slot_half_width:.3f}), "
                f"{over_run:+.2f} ({share:+.1%}) over {slots} measurements, {verdict}")


def fit_drift(metric: str, points: list[tuple[int, float]], centre: float) -> Drift:
    """Least-squares slope of (position, value) with its t interval; the level is read at `centre`."""
    n = len(points)
    if n < 3 or len({x for x, _ in points}) < 2:
        return Drift(metric, n, None, None, None)
    mean_x = statistics.fmean(x for x, _ in points)
    mean_y = statistics.fmean(y for _, y in points)
    sxx = sum((x - mean_x) ** 2 for x, _ in points)
    slope = sum((x - mean_x) * (y - mean_y) for x, y in points) / sxx
    residual = sum((y - mean_y - slope * (x - mean_x)) ** 2 for x, y in points)
    se = math.sqrt(residual / (n - 2) / sxx)
    return Drift(metric, n, slope, t975(n - 2) * se, mean_y + slope * (centre - mean_x))


def detrend(value: float, position: int, drift: Drift, centre: float) -> float:
    """The reading as if taken at the schedule's centre, when the drift is beyond the noise.
    Relative: a card that slows 1% slows every setting about 1%, fast or slow."""
    if not drift.significant or not drift.level:
        return value
    return value / (1 + drift.per_slot * (position - centre) / drift.level)
