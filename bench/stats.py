"""Summaries of latency samples: percentiles by linear interpolation, mean, count."""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Sequence
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


SUMMARY_QS = ("p50", "p90", "p99", "mean")
"""The figures of a :func:`summary` that :func:`merge_repeats` takes the median of."""
SUMMED = frozenset({"n", "not_queued"})
"""Counts of a latency phase's result that add up across its repeats (the rest are taken as figures)."""


def _is_summary(v: Any) -> bool:
    return isinstance(v, dict) and "n" in v and set(v) <= {"n", "min", "max", "spread", *SUMMARY_QS}


def _merge_summaries(parts: list[dict[str, Any]]) -> dict[str, Any]:
    got = [p for p in parts if p.get("n")]
    if not got:
        return {"n": 0}
    if len(got) == 1:
        return got[0]
    out: dict[str, Any] = {"n": sum(int(p["n"]) for p in got)}
    spread: dict[str, list[float]] = {}
    for q in SUMMARY_QS:
        xs = [float(p[q]) for p in got if isinstance(p.get(q), (int, float))]
        if xs:
            out[q] = round(statistics.median(xs), 4)
            spread[q] = [min(xs), max(xs)]
    out["min"] = min(float(p["min"]) for p in got)
    out["max"] = max(float(p["max"]) for p in got)
    out["spread"] = spread
    return out


def merge_repeats(repeats: Sequence[dict[str, Any] | None]) -> dict[str, Any]:
    """One latency phase's result from its repeats (``Counts.latency_repeats``, run interleaved
    with the other phases' so that a slow minute of the host lands in one repeat of each, not in
    all of one phase): each percentile and figure is the median of the repeats', and ``spread``
    holds the lowest and highest of them (a summary's under its own ``spread``, a figure's under
    the phase's); counts (:data:`SUMMED`, a dict of counts) add up; a flag holds if it held in
    every repeat. A repeat that failed (None) is left out; one repeat is returned as is, none gives {}."""
    parts = [r for r in repeats if isinstance(r, dict)]
    if len(parts) <= 1:
        return parts[0] if parts else {}
    out: dict[str, Any] = {}
    spread: dict[str, list[float]] = {}
    for key, first in parts[0].items():
        vals = [p.get(key) for p in parts]
        if _is_summary(first):
            out[key] = _merge_summaries([v for v in vals if isinstance(v, dict)])
        elif isinstance(first, bool):
            out[key] = all(bool(v) for v in vals)
        elif isinstance(first, (int, float)) and all(isinstance(v, (int, float)) and not isinstance(v, bool)
                                                     for v in vals):
            nums = [float(v) for v in vals if isinstance(v, (int, float))]
            if key in SUMMED:
                out[key] = int(sum(nums))
            elif min(nums) == max(nums):
                out[key] = first
            else:
                out[key] = round(statistics.median(nums), 4)
                spread[key] = [min(nums), max(nums)]
        elif isinstance(first, dict) and (counts := [v for v in vals if isinstance(v, dict)]) and len(counts) == len(
                vals) and all(isinstance(x, int) for v in counts for x in v.values()):  # by kind (a Lead's refusals)
            total: dict[str, int] = {}
            for v in counts:
                for k, x in v.items():
                    total[k] = total.get(k, 0) + x
            out[key] = total
        else:
            out[key] = first
    out["repeats"] = len(parts)
    out["spread"] = spread
    return out


def spread_of(part: dict[str, Any] | None, key: str) -> list[float] | None:
    """The lowest and highest of the repeats' ``part[key]``, kept by :func:`merge_repeats` under
    ``part["spread"]``: ``part`` a merged phase and ``key`` one of its figures, or ``part`` a
    merged summary and ``key`` a percentile. None when the phase ran once."""
    got = (part.get("spread") or {}).get(key) if isinstance(part, dict) else None
    return [float(got[0]), float(got[1])] if isinstance(got, list) and len(got) == 2 else None
