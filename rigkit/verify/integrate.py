"""Energy from instant power samples: one trapezoid integral for the whole of verification
(a run's energy check and each phase's energy), so the two can never disagree on method."""

from __future__ import annotations


def _at(points: list[tuple[float, float]], t: float) -> float:
    """Power at instant t: interpolated between its neighbouring samples, held flat past the ends."""
    if t <= points[0][0]:
        return points[0][1]
    for (t0, w0), (t1, w1) in zip(points, points[1:]):
        if t0 <= t <= t1:
            return w0 if t1 == t0 else w0 + (w1 - w0) * (t - t0) / (t1 - t0)
    return points[-1][1]


def energy_j(times, watts, t0: float, t1: float) -> tuple[float | None, int]:
    """(energy in J between t0 and t1, samples strictly inside); None without samples or time.
    Samples whose power is None (not reported) are skipped."""
    points = [(t, w) for t, w in zip(times, watts) if w is not None]
    if not points or t1 <= t0:
        return None, 0
    inside = [(t, w) for t, w in points if t0 < t < t1]
    edges = [(t0, _at(points, t0)), *inside, (t1, _at(points, t1))]
    return sum((w0 + w1) / 2 * (b - a) for (a, w0), (b, w1) in zip(edges, edges[1:])), len(inside)
