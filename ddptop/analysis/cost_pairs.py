"""What a job loses under ddptop against plain torchrun, from alternating whole runs
(`ddptop cost`). Pure: the schedule, each run's step time from its stamps, the paired
statistics and the stderr comparison; the runs themselves are commands/cost's.

Pairs run in ABBA order (plain, ddptop | ddptop, plain | ...), so a drift of the machine over
the session weighs on both arms alike. Where two plain runs meet (the end of an odd pair and the
start of the next even one) they form the method's own A/A pairs, taken on the same schedule as
the A/B pairs at no extra run. Ratios are plain / ddptop of ms per step (below 1: ddptop slower),
summarised by their geometric mean with a Student-t 95% interval over pairs; the cost in ms per
rank per step likewise.
"""

from __future__ import annotations

import math
import re
import statistics
from dataclasses import dataclass

from ddptop.model.figures.stats import t975

PLAIN, DDPTOP = "plain", "ddptop"
AGAIN = "plain-again"  # the second plain job of a lock-step A/A round


def schedule(pairs: int) -> list[tuple[int, str]]:
    """(pair, arm) in running order: ABBA."""
    out: list[tuple[int, str]] = []
    for i in range(pairs):
        arms = (PLAIN, DDPTOP) if i % 2 == 0 else (DDPTOP, PLAIN)
        out += [(i, arm) for arm in arms]
    return out


def aa_pairs(pairs: int) -> list[tuple[int, int]]:
    """(earlier pair, later pair) whose plain runs stand side by side in `schedule`."""
    return [(i, i + 1) for i in range(1, pairs - 1, 2)]


def step_ms(stamps: list[float], skip: int) -> float | None:
    """Mean ms per step after the first `skip` steps (the end of each optimizer step is stamped);
    None with fewer than 5 steps left."""
    kept = stamps[skip:]
    if len(kept) < 6:
        return None
    return (kept[-1] - kept[0]) * 1000.0 / (len(kept) - 1)


def skip_for(n_steps: int, warmup: int | None) -> int:
    """Steps left out at the start: `warmup`, or a fifth of the run (at least 5)."""
    return warmup if warmup is not None else max(5, n_steps // 5)


def turn_ms(stamps: list[float], starts: list[float]) -> list[float]:
    """`ddptop cost --lockstep`: each step taken in turn, in ms, from the turn's return after step
    k (starts[k]) to the end of step k+1 (stamps[k+1])."""
    return [(stamps[k + 1] - starts[k]) * 1000.0 for k in range(min(len(starts), len(stamps) - 1))]


def round_ms(first: dict[int, tuple[list[float], list[float]]], second: dict[int, tuple[list[float], list[float]]],
             warmup: int | None) -> tuple[float, float] | None:
    """Both jobs' ms a step in one lock-step round, each the mean over ranks of its steps taken in
    turn, over the same step numbers in both (after the warm-up); None with fewer than 5 such
    steps or a rank missing. `first`/`second`: rank -> (stamps, starts)."""
    if not first or set(first) != set(second):
        return None
    means: tuple[list[float], list[float]] = ([], [])
    for rank in first:
        a, b = turn_ms(*first[rank]), turn_ms(*second[rank])
        skip = skip_for(len(first[rank][0]), warmup)
        n = min(len(a), len(b))
        if n - skip < 5:
            return None
        means[0].append(statistics.fmean(a[skip:n]))
        means[1].append(statistics.fmean(b[skip:n]))
    return statistics.fmean(means[0]), statistics.fmean(means[1])


def lockstep_schedule(pairs: int) -> list[tuple[int, str, str]]:
    """(round, job a's arm, job b's arm): `pairs` rounds of plain beside ddptop, who goes first
    alternating, and after every second one a round of plain beside plain (the A/A)."""
    out: list[tuple[int, str, str]] = []
    for i in range(pairs):
        out.append((i, PLAIN, DDPTOP) if i % 2 == 0 else (i, DDPTOP, PLAIN))
        if i % 2 == 1:
            out.append((i, PLAIN, AGAIN) if i % 4 == 1 else (i, AGAIN, PLAIN))
    return out


def run_step_ms(ranks: dict[int, list[float]], warmup: int | None) -> float | None:
    """A run's ms per step: the mean over its ranks (they step in lockstep under DDP)."""
    per_rank = [step_ms(s, skip_for(len(s), warmup)) for s in ranks.values()]
    if not per_rank or any(ms is None for ms in per_rank):
        return None
    return statistics.fmean(ms for ms in per_rank if ms is not None)


@dataclass(frozen=True)
class Interval:
    mean: float
    lo: float
    hi: float
    n: int

    def as_dict(self) -> dict[str, float]:
        return {"mean": self.mean, "lo": self.lo, "hi": self.hi, "n": self.n}


def t_interval(values: list[float]) -> Interval | None:
    n = len(values)
    if n < 2:
        return None
    mean = statistics.fmean(values)
    half = t975(n - 1) * statistics.stdev(values) / math.sqrt(n)
    return Interval(mean, mean - half, mean + half, n)


def ratio_interval(ratios: list[float]) -> Interval | None:
    """Geometric mean of ratios with the t interval of their logs."""
    logs = t_interval([math.log(r) for r in ratios if r > 0])
    return None if logs is None else Interval(math.exp(logs.mean), math.exp(logs.lo), math.exp(logs.hi), logs.n)


@dataclass(frozen=True)
class CostResult:
    plain_ms: float  # mean over the plain runs
    ddptop_ms: float
    ratio: Interval | None  # plain / ddptop per pair (below 1: ddptop slower)
    extra_ms: Interval | None  # ddptop - plain, ms per step per rank
    aa: Interval | None  # plain / plain, the adjacent plain runs
    pairs_used: int

    def as_dict(self) -> dict[str, object]:
        def d(x: Interval | None) -> object:
            return None if x is None else x.as_dict()

        return {"plain_ms": self.plain_ms, "ddptop_ms": self.ddptop_ms, "ratio": d(self.ratio),
                "extra_ms": d(self.extra_ms), "aa": d(self.aa), "pairs_used": self.pairs_used}


def analyse(ms: dict[tuple[int, str], float | None], pairs: int,
            aa_ms: list[tuple[float, float]] | None = None) -> CostResult | None:
    """`ms`: (pair, arm) -> that run's ms per step (None: not measured). Pairs with an arm
    missing are left out. `aa_ms`: plain beside plain (lock-step rounds), else the adjacent
    plain runs of the ABBA schedule."""
    runs = [(ms.get((i, PLAIN)), ms.get((i, DDPTOP))) for i in range(pairs)]
    full = [(p, d) for p, d in runs if p is not None and d is not None]
    if not full:
        return None
    aa = aa_ms if aa_ms is not None else [(ms.get((a, PLAIN)), ms.get((b, PLAIN))) for a, b in aa_pairs(pairs)]
    return CostResult(
        plain_ms=statistics.fmean(p for p, _ in full), ddptop_ms=statistics.fmean(d for _, d in full),
        ratio=ratio_interval([p / d for p, d in full]), extra_ms=t_interval([d - p for p, d in full]),
        aa=ratio_interval([x / y for x, y in aa if x and y]), pairs_used=len(full))


def verdict(result: CostResult, bar: float = 0.99, floor: float = 0.98, aa_bar: float = 0.01) -> str:
    """Within 1% (the ratio at least `bar`, its interval above `floor`), NOT within (the whole
    interval below `bar`), or not shown; and whether the A/A holds (within ±1%)."""
    r = result.ratio
    if r is None:
        return "not shown: fewer than 2 pairs measured"
    if r.mean >= bar and r.lo >= floor:
        head = f"within {round((1 - bar) * 100)}%"
        if r.hi > 2 - floor:  # wide on the other side too: the machine's noise, not a resolved figure
            head += f" by the bar (ratio >= {bar}, lower bound >= {floor}), but the interval is wide"
    elif r.hi < bar:
        head = f"NOT within {round((1 - bar) * 100)}%"
    else:
        head = "not shown: the interval is too wide (more pairs narrow it)"
    a = result.aa
    if a is None:
        return head + "; no A/A (it takes 5 pairs or more, 4 with --lockstep)"
    ok = abs(a.mean - 1) <= aa_bar
    return head + ("; the A/A holds" if ok else f"; A/A off by {abs(a.mean - 1) * 100:.1f}%: the machine's noise is above the bar")


_NOISE = re.compile(r"0x[0-9a-fA-F]+|\d+")


def masked(line: str) -> str:
    """A stderr line with its numbers (pids, ports, times, addresses) masked."""
    return _NOISE.sub("#", line.rstrip())


def added_lines(plain: list[str], ours: list[str]) -> list[str]:
    """Lines of the ranks' stderr under ddptop that no plain run's stderr holds (numbers
    masked), in their order, each once."""
    seen = {masked(x) for x in plain}
    out: list[str] = []
    for line in ours:
        m = masked(line)
        if m.strip() and m not in seen:
            seen.add(m)
            out.append(line.rstrip())
    return out
