"""The statistics every figure is made of, each written once: the median, the nearest-rank
percentile, a percentage, a mean that skips the unknown, Student's t quantile for a 95%
interval, the union of time spans, and the log-binned Histogram whole-run percentiles are kept in. Pure: numbers in, numbers out.

(The rank side has its own union of spans, ddptop.rank.steps.union_length: nothing of the
monitor may be imported into a rank, and this module is part of the monitor.)
"""

from __future__ import annotations

import collections
import math
from collections.abc import Iterable

Span = tuple[float, float]
# Student's t, two-sided 95% (the 97.5% quantile), by degrees of freedom 1..30
_T975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160,
         2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056,
         2.052, 2.048, 2.045, 2.042)
_BINS_PER_E = 100.0  # histogram bins per factor e: ~1% wide


def t975(df: int) -> float:
    """Student's t quantile of a two-sided 95% interval with `df` degrees of freedom; past 30,
    30's (wider than the true quantile, so an interval errs wide)."""
    if df < 1:
        raise ValueError(f"t975 needs at least 1 degree of freedom, got {df}")
    return _T975[min(df, len(_T975)) - 1]


def median(ordered: list[float]) -> float | None:
    """The median of an already sorted list (None for an empty one)."""
    return median_nonempty(ordered) if ordered else None


def median_nonempty(ordered: list[float]) -> float:
    """The median of a sorted list that has values (the mean of the middle two for an even count)."""
    n = len(ordered)
    return ordered[n // 2] if n % 2 else (ordered[n // 2 - 1] + ordered[n // 2]) / 2


def pct(ordered: list[float], q: float) -> float | None:
    """Nearest-rank percentile of an already sorted list."""
    if not ordered:
        return None
    return ordered[min(len(ordered) - 1, int(round(q / 100.0 * (len(ordered) - 1))))]


def percentile(values: Iterable[float], q: float) -> float | None:
    """Nearest-rank percentile of values in any order."""
    return pct(sorted(values), q)


def percent(part: float, whole: float) -> float | None:
    """`part` as a percentage of `whole`, to one decimal (None for an empty whole)."""
    return round(100.0 * part / whole, 1) if whole > 0 else None


def mean(values: Iterable[float | None]) -> float | None:
    """The mean of the known values (None when none is known)."""
    known = [float(v) for v in values if v is not None]
    return sum(known) / len(known) if known else None


def merge_spans(spans: Iterable[Span]) -> list[Span]:
    """The union of spans: sorted, non-overlapping spans covering the same time."""
    out: list[Span] = []
    for s, e in sorted(spans):
        if out and s <= out[-1][1]:
            if e > out[-1][1]:
                out[-1] = (out[-1][0], e)
        else:
            out.append((s, e))
    return out


def span_length(merged: Iterable[Span]) -> float:
    """Total length of disjoint spans."""
    return sum(e - s for s, e in merged)


def union_length(spans: Iterable[Span]) -> float:
    """The time any of the spans covers."""
    return span_length(merge_spans(spans))


class Histogram:
    """Log-binned counts: O(1) update, bounded memory, ~1% percentile error."""

    def __init__(self) -> None:
        self.counts: collections.Counter[int] = collections.Counter()
        self.n = 0

    def add(self, value: float) -> None:
        key = math.floor(math.log(value if value > 1e-6 else 1e-6) * _BINS_PER_E)
        counts = self.counts
        counts[key] = counts.get(key, 0) + 1
        self.n += 1

    def percentile(self, q: float) -> float | None:
        if not self.n:
            return None
        target = q / 100.0 * (self.n - 1)
        seen = 0
        for key in sorted(self.counts):
            seen += self.counts[key]
            if seen > target:
                return math.exp((key + 0.5) / _BINS_PER_E)
        return None


def merged_percentiles(hists: Iterable[Histogram], *qs: float) -> tuple[float | None, ...]:
    """Percentiles of several histograms taken as one (merged once)."""
    merged = Histogram()
    for h in hists:
        merged.counts.update(h.counts)
        merged.n += h.n
    return tuple(merged.percentile(q) for q in qs)
