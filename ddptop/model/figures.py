"""The live figures of a run, and the one rule for each verdict views show: each rank's
recent window (p50/p95, phase split, samples per step, own work), the slowest rank, the
stall bound and the live rate (the straggler verdict, which needs paired steps and a memory
across checks, is ddptop.model.straggler's). Every view reads these through RunState
(ddptop.model.state) or a Snapshot (ddptop.model.snapshot); none recomputes them.

Pure: no I/O, no UI; depends on the protocol's phase names only (RunState imports this
module, not the other way round: a rank is anything with `steps` and `recent`).
"""

from __future__ import annotations

import collections
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from ddptop.wire.protocol import PHASES

WINDOW = 50  # a rank's last records that the slowest-rank rule looks at
MIN_RECORDS = 5  # ...at least this many, or the rank is not ranked
STALL_MIN_S = 10.0
STALL_STEPS = 20  # a stall is this many median steps with no progress (at least STALL_MIN_S)
PHASES_WITH_COMM = ("data", "forward", "backward", "comm", "optimizer")

# Per record, in this order: step, data, forward, backward, optimizer, samples, comm, exposed.
_FIELDS = ("step_ms", "data_ms", "forward_ms", "backward_ms", "optimizer_ms", "samples",
           "comm_ms", "exposed_comm_ms")
_STEP, _SAMPLES, _COMM, _EXPOSED = 0, 5, 6, 7
_RESUM_EVERY = 4096  # records; running sums are recomputed now and then against float drift


class RankRecords(Protocol):
    """What a window reads of a rank (ddptop.model.state.RankState)."""

    steps: int  # records received so far
    recent: collections.deque[dict[str, float]]  # the latest of them, oldest first


@dataclass(frozen=True)
class RankFigures:
    """One rank's recent window, read once."""

    p50: float | None
    p95: float | None
    own_ms: float | None  # median own work (step minus exposed comm) over the last WINDOW records
    ranked: bool  # enough records (MIN_RECORDS, all timed) to be compared with other ranks
    samples_per_step: float | None
    samples_per_s: float | None  # samples_per_step / p50: the same statistic as the rank's p50
    phases: dict[str, float]  # mean ms per phase; with comm timing, `comm` is split out of backward
    has_comm: bool
    comm_share: float | None  # all-reduce in flight / step time
    exposed_share: float | None  # exposed all-reduce wait / step time
    compressing: float | None  # the last record's flag, if the probe sends it
    step_ms: tuple[float, ...]  # the window's step times, oldest first


EMPTY = RankFigures(None, None, None, False, None, None, dict.fromkeys(PHASES, 0.0), False, None, None, None, ())


def _median(ordered: list[float]) -> float | None:
    n = len(ordered)
    if not n:
        return None
    return ordered[n // 2] if n % 2 else (ordered[n // 2 - 1] + ordered[n // 2]) / 2


def pct(ordered: list[float], q: float) -> float | None:
    """Nearest-rank percentile of an already sorted list."""
    if not ordered:
        return None
    return ordered[min(len(ordered) - 1, int(round(q / 100.0 * (len(ordered) - 1))))]


class RankWindow:
    """Running sums over a mirror of one rank's recent-record ring buffer, updated
    by the records that arrived since the last look (not by rescanning it)."""

    def __init__(self) -> None:
        self.seen = -1
        self.rows: collections.deque[tuple[float | None, ...]] = collections.deque()
        # Step times and own times (step minus exposed comm) of the rows that have a
        # step time, in order: sorted() on these is C speed, a generator is not.
        self.steps: collections.deque[float] = collections.deque()
        self.own: collections.deque[float] = collections.deque()
        self.sums = [0.0] * len(_FIELDS)
        self.n_samples = self.n_comm = self.n_exposed = self.added = 0
        self.comm_step = 0.0  # step time of the rows that carry comm_ms (timed every Nth step on GPU)
        self.tail: list[dict[str, float]] = []  # the last WINDOW records
        self.figures = EMPTY

    @staticmethod
    def _row(rec: dict[str, float]) -> tuple[float | None, ...]:
        return tuple(rec.get(k) for k in _FIELDS)

    def _add(self, row: tuple[float | None, ...], sign: int) -> None:
        sums = self.sums
        for i, v in enumerate(row):
            if v is not None:
                sums[i] += sign * v
        step = row[_STEP]
        if step is not None:
            if sign > 0:
                self.steps.append(step)
                self.own.append(step - (row[_EXPOSED] or 0.0))
            else:
                self.steps.popleft()
                self.own.popleft()
        if row[_SAMPLES] is not None:
            self.n_samples += sign
        if row[_EXPOSED] is not None:
            self.n_exposed += sign
        if row[_COMM] is not None:
            self.n_comm += sign
            self.comm_step += sign * (row[_STEP] or 0.0)

    def update(self, rs: RankRecords) -> RankFigures:
        """Catch up with `rs` and return its figures (recomputed only if records arrived)."""
        new = rs.steps - self.seen
        if self.seen >= 0 and new == 0:
            return self.figures
        recent = rs.recent
        maxlen = recent.maxlen or len(recent)
        if self.seen < 0 or new < 0 or new > len(recent) or self.added > _RESUM_EVERY:
            self.rows = collections.deque((self._row(r) for r in recent), maxlen)
            self.steps.clear()
            self.own.clear()
            self.sums = [0.0] * len(_FIELDS)
            self.n_samples = self.n_comm = self.n_exposed = self.added = 0
            self.comm_step = 0.0
            for row in self.rows:
                self._add(row, 1)
        else:
            for i in range(new, 0, -1):
                row = self._row(recent[-i])
                if len(self.rows) == maxlen:
                    self._add(self.rows.popleft(), -1)
                self.rows.append(row)
                self._add(row, 1)
                self.added += 1
        self.seen = rs.steps
        start = max(len(recent) - WINDOW, 0)
        self.tail = [recent[i] for i in range(start, len(recent))]
        self.figures = self._figures()
        return self.figures

    def _figures(self) -> RankFigures:
        n = len(self.rows)
        if not n:
            return EMPTY
        sums = self.sums
        steps = tuple(self.steps)
        ordered = sorted(steps)
        tail = self.tail
        ranked = len(tail) >= MIN_RECORDS and all("step_ms" in r for r in tail)
        own = sorted(list(self.own)[-WINDOW:])
        means = {p: sums[1 + i] / n for i, p in enumerate(PHASES)}
        # exposed comm alone (a GPU run without nccl_timing) still splits out of backward
        has_comm = self.n_comm > 0 or self.n_exposed > 0
        step_total = sums[_STEP]
        if has_comm:
            ex_mean = sums[_EXPOSED] / n
            means = {"data": means["data"], "forward": means["forward"],
                     "backward": max(means["backward"] - ex_mean, 0.0), "comm": ex_mean,
                     "optimizer": means["optimizer"]}
        p50 = pct(ordered, 50)
        per_step = sums[_SAMPLES] / self.n_samples if self.n_samples and sums[_SAMPLES] > 0 else None
        return RankFigures(
            p50=p50, p95=pct(ordered, 95), own_ms=_median(own), ranked=ranked,
            samples_per_step=per_step,
            samples_per_s=per_step * 1000.0 / p50 if per_step and p50 else None,
            phases=means, has_comm=has_comm,
            comm_share=sums[_COMM] / self.comm_step if self.n_comm and self.comm_step > 0 else None,
            exposed_share=sums[_EXPOSED] / step_total if has_comm and step_total > 0 else None,
            compressing=tail[-1].get("compressing") if tail else None,
            step_ms=steps,
        )


def rank_figures(rs: RankRecords) -> RankFigures:
    """One rank's figures from scratch (RunState keeps a RankWindow per rank instead)."""
    return RankWindow().update(rs)


# --- the rules --------------------------------------------------------------------------
def _own(figures: Mapping[int, RankFigures]) -> dict[int, float]:
    return {r: f.own_ms for r, f in figures.items() if f.ranked and f.own_ms is not None}


def slowest(figures: Mapping[int, RankFigures]) -> int | None:
    """The rank doing the most own work per step over its last WINDOW records (ties: the
    lowest rank); None with fewer than two ranked ranks. A view marks the straggler instead
    while one is named (Snapshot.slowest, RunState.slowest_rank)."""
    own = _own(figures)
    if len(own) < 2:
        return None
    return max(sorted(own), key=lambda r: own[r])


def job_p50_ms(figures: Mapping[int, RankFigures]) -> float | None:
    """The slowest rank's median step: what bounds a DDP job right now."""
    medians = [f.p50 for f in figures.values() if f.p50]
    return max(medians) if medians else None


def live_steps_per_s(figures: Mapping[int, RankFigures]) -> float | None:
    p50 = job_p50_ms(figures)
    return 1000.0 / p50 if p50 else None


def stall_bound_s(figures: Mapping[int, RankFigures]) -> float:
    """How long no progress means a stall: STALL_STEPS of the job's median step, at least STALL_MIN_S."""
    p50 = job_p50_ms(figures)
    return max(STALL_MIN_S, STALL_STEPS * p50 / 1000.0) if p50 else STALL_MIN_S


def comm_shares(figures: Mapping[int, RankFigures]) -> tuple[float | None, float] | None:
    """(in flight, exposed) share of step time, mean over the ranks that time comm; in flight
    is None where only exposed comm is measured (GPU, DDP's own all-reduce, no nccl_timing)."""
    shares = [(f.comm_share, f.exposed_share or 0.0) for f in figures.values() if f.comm_share is not None]
    if shares:
        return (sum(a for a, _ in shares) / len(shares), sum(b for _, b in shares) / len(shares))
    exposed = [f.exposed_share for f in figures.values() if f.exposed_share is not None]
    return (None, sum(exposed) / len(exposed)) if exposed else None


def warming_up(config: Mapping[str, Any], figures: Mapping[int, RankFigures], current_step: int) -> bool:
    """A comm hook is configured but gradients still travel uncompressed."""
    if config.get("comm_hook", "none") == "none":
        return False
    flags = [f.compressing for f in figures.values() if f.compressing is not None]
    if flags:
        return not any(flags)
    if config.get("comm_hook") == "powersgd":
        return current_step + 1 < int(config.get("powersgd_start_iter", 0))
    return False
