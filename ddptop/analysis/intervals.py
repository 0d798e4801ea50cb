"""Time spans (us) as sorted lists: intersection, the outermost spans of a call stack, and
which outermost span of a thread holds a time (merge, length and union_length are
ddptop.model.figures.stats', re-exported). Pure."""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Iterable, Sequence
from typing import Any

from ddptop.model.figures.stats import Span, merge_spans, span_length, union_length

# The union of spans is ddptop.model.figures' (one function for the trace, the timeline and the
# live figures); kept under these names here for the trace analyses.
merge = merge_spans
length = span_length

__all__ = ["Cover", "Span", "intersect", "intersection_length", "length", "merge", "outermost", "union_length"]


def intersect(a: Sequence[Span], b: Sequence[Span]) -> list[Span]:
    """Intersection of two merged span lists (merged)."""
    i = j = 0
    out: list[Span] = []
    while i < len(a) and j < len(b):
        lo, hi = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        if hi > lo:
            out.append((lo, hi))
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return out


def intersection_length(a: Iterable[Span], b: Iterable[Span]) -> float:
    return length(intersect(merge(a), merge(b)))


def outermost(spans: Iterable[Span]) -> list[Span]:
    """The spans no other one contains (one thread's call stack nests; touching ones stay apart)."""
    out: list[Span] = []
    for s, e in sorted(spans, key=lambda sp: (sp[0], -sp[1])):
        if out and s < out[-1][1]:
            if e > out[-1][1]:  # overlapping without nesting: not a call stack, take the union
                out[-1] = (out[-1][0], e)
        else:
            out.append((s, e))
    return out


class Cover:
    """Outermost spans per (pid, tid): which one holds a time (or a span)?"""

    def __init__(self, spans: dict[tuple[Any, Any], list[Span]]) -> None:
        self._spans = {k: outermost(v) for k, v in spans.items()}
        self._starts = {k: [s for s, _ in v] for k, v in self._spans.items()}

    def span_at(self, key: tuple[Any, Any], start: float, end: float | None = None) -> Span | None:
        spans = self._spans.get(key)
        if not spans:
            return None
        i = bisect_right(self._starts[key], start) - 1
        if i >= 0 and start <= spans[i][1] and (end is None or end <= spans[i][1] + 1e-3):
            return spans[i]
        return None

    def contains(self, key: tuple[Any, Any], start: float, end: float | None = None) -> bool:
        return self.span_at(key, start, end) is not None
