"""Repeated runs of one configuration as one figure: its steps/s' 95% interval
across the runs (Student's t over the runs' steps/s, never narrower than their per-step
intervals combined), the ratio of two such intervals (a speedup's), and the interleaved order
the runs go in. Pure: numbers in, numbers out.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from ddptop.model.figures.stats import t975

ACROSS = "a t interval over the runs' steps/s, never narrower than their per-step intervals combined"
CI_TEXT = ("95% CI of the mean over the runs (Student's t, runs - 1 degrees of freedom), never narrower than "
           "the runs' per-step intervals combined")
ORDER_TEXT = "interleaved in rounds, every other round reversed (A B, B A, A B, ...)"


def across_interval(rates: Sequence[float],
                    step_cis: Sequence[tuple[float, float] | None] = ()) -> tuple[float, float] | None:
    """The 95% interval of a configuration's steps/s from `rates`, one per run (at least two):
    mean +- t * sd / sqrt(n). Each run's own steps/s already carries its per-step noise, so the
    spread across runs covers both; but two or three runs can agree by chance, so the half-width
    is at least what the per-step intervals (`step_cis`, where each run has one) give the mean of
    n runs: sqrt(sum of their squared half-widths) / n. None with fewer than two runs."""
    n = len(rates)
    if n < 2:
        return None
    mean = sum(rates) / n
    sd = math.sqrt(sum((r - mean) ** 2 for r in rates) / (n - 1))
    half = t975(n - 1) * sd / math.sqrt(n)
    halves = [(ci[1] - ci[0]) / 2 for ci in step_cis if ci]
    if len(halves) == n:
        half = max(half, math.sqrt(sum(h * h for h in halves)) / n)
    return max(mean - half, 0.0), mean + half


def ratio_interval(a: Sequence[float] | None, b: Sequence[float] | None) -> tuple[float, float] | None:
    """The interval of a / b from the two intervals' ends: above 1 exactly when `a`'s
    interval lies above `b`'s, as the recommendation counts a gain (ddptop.analysis
    .sweep_advice.beats), so the speedup column and the advice cannot disagree."""
    if not a or not b or b[0] <= 0:
        return None
    return a[0] / b[1], a[1] / b[0]


def rounds(count: int, repeat: int) -> list[tuple[int, int]]:
    """The order of `repeat` runs of each of `count` configurations: (round, index), round 1
    in the given order, round 2 reversed, and so on (ORDER_TEXT), so that a drift of the
    machine over the sweep (heat, another job) falls on every configuration alike rather than
    on whichever ran last."""
    out = []
    for r in range(1, repeat + 1):
        order = range(count) if r % 2 else range(count - 1, -1, -1)
        out += [(r, i) for i in order]
    return out
