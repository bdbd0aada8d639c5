"""Summaries of latency samples: percentiles by linear interpolation, mean, count."""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any


def percentile(sorted_xs: list[float], q: float) -> float:
    """The q-th percentile (0..100) of already sorted values, linearly interpolated."""
    if not sorted_xs:
        return math.nan
    k = (len(sorted_xs) - 1) * q / 100.0
    lo, hi = math.floor(k), math.ceil(k)
    if lo == hi:
        return sorted_xs[int(k)]
    return sorted_xs[lo] + (sorted_xs[hi] - sorted_xs[lo]) * (k - lo)


def summary(values: Iterable[float], digits: int = 3) -> dict[str, Any]:
    xs = sorted(float(v) for v in values)
    if not xs:
        return {"n": 0}
    def r(v: float) -> float:
        return round(v, digits)

    return {
        "n": len(xs), "p50": r(percentile(xs, 50)), "p90": r(percentile(xs, 90)),
        "p99": r(percentile(xs, 99)), "mean": r(sum(xs) / len(xs)), "min": r(xs[0]), "max": r(xs[-1]),
    }


def ratio(value: float | None, floor: float | None) -> float | None:
    """value / floor (how many times the floor), None when either is missing or the floor is 0."""
    if value is None or floor is None or not floor or math.isnan(value) or math.isnan(floor):
        return None
    return float(f"{value / floor:.3g}")
