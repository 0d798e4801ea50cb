"""The straggler rule. A rank is named a straggler only when the other ranks wait for it
beyond the run's own step-to-step noise, by enough to matter, and keep doing so:

- a check pairs the ranks' records step by step over the last WINDOW measured steps (warmup
  and profiled steps left out).
- who: where every rank's all-reduce time (comm_ms) is measured, the rank the others wait
  for: per step, the others' median comm_ms minus its own (a collective ends together on
  every rank, so the last to reach it spends the least time in it). Without comm_ms, the rank
  doing the most own work per step (step minus the all-reduce wait it could not hide) minus
  the others' median. The rank with the largest median of these differences is the one
  looked at (a Finding).
- beyond noise: a one-sided sign test on those per-step differences, Bonferroni-corrected
  over the ranks compared, p <= ALPHA (no distribution assumed; a few slow steps cannot win
  it, a rank that is late on most steps does).
- large enough: what it costs every step, the others' median unhidden all-reduce wait minus
  its own (with comm_ms; else its excess own work), is at least MIN_MS and at least
  MIN_SHARE of the step (the others' median step, which waits for the straggler).
- persistent: a check runs every EVERY measured steps; the verdict (a rank, or none)
  changes only when PERSIST checks in a row agree on the new one (Verdict.after).

Pure: no I/O, no UI. RunState (ddptop.model.state) keeps the Verdict and runs the checks
as records arrive; views read it through RunState or a Snapshot.
"""

from __future__ import annotations

import collections
import functools
import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Protocol

from ddptop.model.figures.stats import median_nonempty
from ddptop.wire.protocol import PHASES

WINDOW = 50  # measured steps a check pairs up (the last ones up to the step checked)
MIN_STEPS = 20  # fewer paired steps than this: the check says nothing
EVERY = 10  # a check after every EVERY measured steps (the step every rank has finished)
PERSIST = 3  # K: the verdict changes only when this many checks in a row agree
ALPHA = 0.001  # the sign test's level, one-sided, after the Bonferroni correction
MIN_MS = 2.0  # a straggler's median excess own work per step: at least this...
MIN_SHARE = 0.03  # ...and at least this share of the step
CATCH_UP = 2 * PERSIST  # checks run at most for a batch of records that crosses many boundaries


class RankRecords(Protocol):
    """What a check reads of a rank (ddptop.model.rank_state.RankState)."""

    last_step: int
    recent: collections.deque[dict[str, float]]  # its latest records, oldest first


@dataclass(frozen=True)
class Finding:
    """One check: the rank doing the most own work per step, paired with the others."""

    rank: int
    step: int  # the last step of the window checked
    n: int  # paired steps in the window
    ranks: int  # ranks compared
    own_ms: float  # its median own work per step
    others_ms: float  # median over the steps of the others' median own work
    step_ms: float  # median over the steps of the others' median step (they wait for it)
    excess_ms: float  # median over the steps of (its own work - the others' median)
    ci_low_ms: float  # 95% confidence interval of that median (order statistics, no model)
    ci_high_ms: float
    p: float  # one-sided sign test that it is slower on most steps, x the ranks compared
    phase: str  # where its excess goes: the phase with the largest median paired excess
    basis: str = "own work"  # "waits": who from comm_ms, cost from unhidden waits; else own work
    last: int = 0  # (waits) the steps on which it spent the least time in all-reduce: it came last

    @property
    def share(self) -> float:
        """Its excess as a share of the step: what every step of the job loses to it."""
        return self.excess_ms / self.step_ms if self.step_ms > 0 else 0.0

    @property
    def beyond_noise(self) -> bool:
        return self.p <= ALPHA

    @property
    def large(self) -> bool:
        return self.excess_ms >= MIN_MS and self.share >= MIN_SHARE

    @property
    def named(self) -> bool:
        """This check alone would name it (the Verdict also wants PERSIST in a row)."""
        return self.beyond_noise and self.large

    def describe(self) -> str:
        evidence = f"last to all-reduce on {self.last} of {self.n} steps" if self.basis == "waits" else f"n={self.n} steps"
        return (f"rank {self.rank} straggler: {self.phase} +{self.excess_ms:.1f} ms/step "
                f"(+{100 * self.share:.0f}%; {evidence}, 95% CI {self.ci_low_ms:.1f}-{self.ci_high_ms:.1f} ms)")

    def spread(self) -> str:
        """How far apart the ranks' own work is, as a share of the step."""
        return f"ranks within {max(1, math.ceil(100 * self.share - 1e-9))}% of the step"


@dataclass(frozen=True)
class Verdict:
    """The straggler verdict across checks (RunState.straggler_verdict): it changes only
    when PERSIST checks in a row agree on another one."""

    checked: int = -1  # the last step a check ended on
    rank: int | None = None  # the straggler named; None: there is none
    basis: Finding | None = None  # the latest check that named it (what the verdict rests on)
    latest: Finding | None = None  # the latest check's finding, named or not
    pending: int | None = None  # the verdict the last `streak` checks agree on (None: no straggler)
    streak: int = 0  # 0: nothing pending

    @property
    def straggler(self) -> Finding | None:
        return self.basis if self.rank is not None else None

    def after(self, finding: Finding) -> Verdict:
        said = finding.rank if finding.named else None
        if said == self.rank:
            basis = finding if said is not None else None
            return replace(self, checked=finding.step, basis=basis, latest=finding, pending=None, streak=0)
        streak = self.streak + 1 if self.streak and self.pending == said else 1
        if streak >= PERSIST:
            return Verdict(finding.step, said, finding if said is not None else None, finding)
        return replace(self, checked=finding.step, latest=finding, pending=said, streak=streak)

    def describe(self) -> str:
        """The verdict in one line, the actionable part first; empty before the first check."""
        latest = self.latest
        if self.basis is not None and self.rank is not None:
            return self.basis.describe()
        if latest is None:
            return ""
        if self.streak and self.pending is not None:
            checks = f"{self.streak} check" + ("s" if self.streak > 1 else "")
            return (f"no straggler: rank {latest.rank} {latest.phase} +{latest.excess_ms:.1f} ms/step "
                    f"(+{100 * latest.share:.0f}%) in the last {checks}; {PERSIST} in a row name one")
        return f"no straggler: {latest.spread()} (n={latest.n} steps)"


def next_check(checked: int, warmup: int) -> int:
    """The step the next check ends on, after `checked`: every EVERY measured steps once
    MIN_STEPS are in."""
    first = max(warmup, 0) + MIN_STEPS - 1
    start = max(checked + 1, first)
    return start + (-(start - first)) % EVERY


def check_steps(checked: int, common: int, warmup: int) -> list[int]:
    """The steps a check ends on, after `checked` up to `common` (the step every rank has
    finished); the last CATCH_UP of them."""
    return list(range(next_check(checked, warmup), common + 1, EVERY))[-CATCH_UP:]


def advance(verdict: Verdict, ranks: Mapping[int, RankRecords], warmup: int) -> Verdict:
    """Run the checks that are due now that these ranks have reported more steps."""
    if len(ranks) < 2:
        return verdict
    common = min(rs.last_step for rs in ranks.values())
    for end in check_steps(verdict.checked, common, warmup):
        finding = check(ranks, end, warmup)
        verdict = verdict.after(finding) if finding is not None else replace(verdict, checked=end)
    return verdict


def _window(rs: RankRecords, end: int, warmup: int) -> dict[int, dict[str, float]]:
    """step -> record, for the rank's measured records of the WINDOW steps up to `end`."""
    low = max(end - WINDOW, warmup - 1)
    out = {}
    for rec in reversed(rs.recent):  # newest first: stop at the window's start
        step = int(rec["step"])
        if step <= low:
            break
        if step <= end and "step_ms" in rec and not rec.get("profiled"):
            out[step] = rec
    return out


def _own(rec: dict[str, float]) -> float:
    return rec["step_ms"] - rec.get("exposed_comm_ms", 0.0)


def _late(rec: dict[str, float]) -> float | None:
    """Larger for a rank that reaches the all-reduce later (it spends less time in it)."""
    comm = rec.get("comm_ms")
    return None if comm is None else -comm


def _unhidden(rec: dict[str, float]) -> float | None:
    """Less for a rank that waits less at backward's end for the all-reduce."""
    return -rec.get("exposed_comm_ms", 0.0)


def _median_without(ordered: list[float], i: int) -> float:
    """The median of a sorted list with its i-th element left out."""
    m = len(ordered) - 1

    def at(k: int) -> float:
        return ordered[k] if k < i else ordered[k + 1]

    return at(m // 2) if m % 2 else (at(m // 2 - 1) + at(m // 2)) / 2


class Paired:
    """Per rank, per step of the window: its value minus the other ranks' median on that
    step (the steps where at least two ranks have the value)."""

    def __init__(self, windows: Mapping[int, Mapping[int, dict[str, float]]],
                 value: Callable[[dict[str, float]], float | None]) -> None:
        self.diffs: dict[int, dict[int, float]] = {r: {} for r in windows}
        self.others: dict[int, dict[int, float]] = {r: {} for r in windows}
        for step in sorted(set().union(*windows.values())):
            vals = sorted((v, r) for r, w in windows.items() if step in w and (v := value(w[step])) is not None)
            if len(vals) < 2:
                continue
            ordered = [v for v, _ in vals]
            for i, (v, r) in enumerate(vals):
                theirs = _median_without(ordered, i)
                self.diffs[r][step] = v - theirs
                self.others[r][step] = theirs

    def medians(self) -> dict[int, float]:
        """Each rank's median difference, for the ranks with MIN_STEPS paired steps."""
        return {r: median_nonempty(sorted(d.values())) for r, d in self.diffs.items() if len(d) >= MIN_STEPS}


def check(ranks: Mapping[int, RankRecords], end: int, warmup: int) -> Finding | None:
    """One check over the WINDOW steps up to `end`; None with fewer than MIN_STEPS paired."""
    windows = {r: _window(rs, end, warmup) for r, rs in ranks.items()}
    waits = Paired(windows, _late)
    medians = waits.medians()
    who = waits if len(medians) == len(windows) else Paired(windows, _own)
    if who is not waits:
        medians = who.medians()
    if not medians:
        return None
    worst = max(sorted(medians), key=lambda r: medians[r])
    steps = sorted(who.diffs[worst])
    # what it costs each step: the others' unhidden wait beyond its own (waits), or its own work
    cost = Paired(windows, _unhidden).diffs[worst] if who is waits else who.diffs[worst]
    d = sorted(cost[s] for s in steps if s in cost)
    signs = list(who.diffs[worst].values())
    own = who if who is not waits else Paired(windows, _own)
    step_ms = [median_nonempty(sorted(w[s]["step_ms"] for r, w in windows.items() if r != worst and s in w)) for s in steps]
    low, high = _median_ci(d)
    return Finding(
        rank=worst, step=end, n=len(steps), ranks=len(medians),
        own_ms=median_nonempty(sorted(_own(windows[worst][s]) for s in steps)),
        others_ms=median_nonempty(sorted(own.others[worst].values())), step_ms=median_nonempty(sorted(step_ms)),
        excess_ms=median_nonempty(d), ci_low_ms=low, ci_high_ms=high,
        p=min(1.0, _sign_p(sum(x > 0 for x in signs), sum(x != 0 for x in signs)) * len(medians)),
        phase=_phase(worst, windows, steps), basis="waits" if who is waits else "own work",
        last=sum(x > 0 for x in signs),
    )


def _phase_ms(rec: dict[str, float], phase: str) -> float:
    value = rec.get(phase + "_ms", 0.0)
    return value - rec.get("exposed_comm_ms", 0.0) if phase == "backward" else value


def _phase(rank: int, windows: Mapping[int, Mapping[int, dict[str, float]]], steps: Iterable[int]) -> str:
    """The phase of `rank`'s own work with the largest median excess over the others' median."""
    excess: dict[str, list[float]] = {p: [] for p in PHASES}
    mine = windows[rank]
    for s in steps:
        theirs = [w[s] for r, w in windows.items() if r != rank and s in w]
        for p in PHASES:
            excess[p].append(_phase_ms(mine[s], p) - median_nonempty(sorted(_phase_ms(t, p) for t in theirs)))
    return max(PHASES, key=lambda p: median_nonempty(sorted(excess[p])))


def _sign_p(positive: int, n: int) -> float:
    """P(at least `positive` of n fair coin flips come up heads): the one-sided sign test."""
    if n == 0:
        return 1.0
    return sum(math.comb(n, k) for k in range(positive, n + 1)) / 2.0**n


@functools.lru_cache(maxsize=WINDOW + 1)
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


def _median_ci(ordered: list[float]) -> tuple[float, float]:
    k = max(_ci_rank(len(ordered)), 1)
    return ordered[k - 1], ordered[len(ordered) - k]
