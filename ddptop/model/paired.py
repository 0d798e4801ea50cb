"""Ranks compared step by step: per rank and step, its value minus the other ranks' median on
that step, and the distribution-free statistics the straggler rule draws from such paired
differences (a one-sided sign test, the median's interval, the smallest shift the test sees).

Pure: no I/O, no UI. Used by ddptop.model.straggler.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Mapping
from statistics import NormalDist

from ddptop.model.figures.stats import median_nonempty

MIN_STEPS = 20  # fewer paired steps than this: a rank is not compared
MAX_N = 64  # the interval's ranks are cached up to this many values


@functools.lru_cache(maxsize=4 * (MAX_N + 1))
def _without(n: int, i: int) -> tuple[int, int]:
    """The positions in a sorted list of n whose mean is its median with the i-th left out."""
    m = n - 1
    middle = (m // 2, m // 2) if m % 2 else (m // 2 - 1, m // 2)
    a, b = (k if k < i else k + 1 for k in middle)
    return a, b


class Paired:
    """Per rank, per step of the window: its value minus the other ranks' median on that
    step (the steps where at least two ranks have the value), and minus the largest of the
    others' (`over_next`: above 0 on the steps it was the last; with two ranks, the same)."""

    def __init__(self, windows: Mapping[int, Mapping[int, dict[str, float]]],
                 value: Callable[[dict[str, float]], float | None]) -> None:
        self.diffs: dict[int, dict[int, float]] = {r: {} for r in windows}
        self.others: dict[int, dict[int, float]] = {r: {} for r in windows}
        self.over_next: dict[int, dict[int, float]] = {r: {} for r in windows}
        items = list(windows.items())
        for step in sorted(set().union(*windows.values())):  # a straggler check's hot loop (~50 steps x 5)
            vals = []
            for r, w in items:
                rec = w.get(step)
                if rec is not None and (v := value(rec)) is not None:
                    vals.append((v, r))
            n = len(vals)
            if n < 2:
                continue
            vals.sort()
            ordered = [v for v, _ in vals]
            top, second = ordered[-1], ordered[-2]
            for i, (v, r) in enumerate(vals):
                a, b = _without(n, i)
                theirs = (ordered[a] + ordered[b]) / 2
                self.diffs[r][step] = v - theirs
                self.others[r][step] = theirs
                self.over_next[r][step] = v - (second if i == n - 1 else top)

    def medians(self) -> dict[int, float]:
        """Each rank's median difference, for the ranks with MIN_STEPS paired steps."""
        return {r: median_nonempty(sorted(d.values())) for r, d in self.diffs.items() if len(d) >= MIN_STEPS}


def sign_p(positive: int, n: int) -> float:
    """P(at least `positive` of n fair coin flips come up heads): the one-sided sign test."""
    if n == 0:
        return 1.0
    return sum(math.comb(n, k) for k in range(positive, n + 1)) / 2.0**n


@functools.lru_cache(maxsize=MAX_N + 1)
def _ci_rank(n: int) -> int:
    """The largest k with P(Binomial(n, 1/2) < k) <= 2.5%: the median's 95% interval is
    from the k-th smallest to the k-th largest (k = 0: not enough values for one)."""
    below, k = 0, 0
    while k < n:
        below += math.comb(n, k)
        if below / 2.0**n > 0.025:
            break
        k += 1
    return k


def median_ci(ordered: list[float]) -> tuple[float, float]:
    """The median's 95% interval from order statistics (no model) of a sorted list."""
    k = max(_ci_rank(len(ordered)), 1)
    return ordered[k - 1], ordered[len(ordered) - k]


@functools.lru_cache(maxsize=4 * (MAX_N + 1))
def _needed(n: int, tests: int, alpha: float) -> int:
    """The fewest of n steps a rank must be slower on for the sign test to pass (n + 1: never)."""
    return next((m for m in range(n + 1) if sign_p(m, n) * tests <= alpha), n + 1)


def smallest_seen(ordered: list[float], tests: int, alpha: float) -> float:
    """The smallest shift the sign test passes at this noise: with a rank's differences
    spread as these are (their median absolute deviation, as a normal sd) around a shift d, it
    is slower on a share Phi(d / sd) of the steps; the test wants `_needed` of n. inf: never."""
    n = len(ordered)
    need = _needed(n, tests, alpha)
    if n == 0 or need > n:
        return math.inf
    mid = median_nonempty(ordered)
    sd = 1.4826 * median_nonempty(sorted(abs(x - mid) for x in ordered))
    return sd * NormalDist().inv_cdf(min(need / n, 0.999))


def smallest_last(margins: list[float], typical: float, tests: int, alpha: float) -> float:
    """The smallest excess the sign test on being the last would see at this noise: with its
    typical excess taken off a rank's margins over the next-latest rank (its steps' own noise
    kept), the shift that makes it the last on the `_needed` share of the steps. inf: never."""
    n = len(margins)
    need = _needed(n, tests, alpha)
    if n == 0 or need > n:
        return math.inf
    return max(typical - sorted(margins, reverse=True)[need - 1], 0.0)
