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
# The windows figures are taken over, as every view names them (issue 31: a figure says which).
RECENT_LABEL = f"last {WINDOW}"  # each rank's last WINDOW records
RUN_LABEL = "run"  # the whole run after warmup
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

    # Every figure but step_ms is over the rank's last WINDOW records (RECENT_LABEL).
    p50: float | None
    p95: float | None
    own_ms: float | None  # median own work (step minus exposed comm)
    ranked: bool  # enough records (MIN_RECORDS, all timed) to be compared with other ranks
    samples_per_step: float | None
    samples_per_s: float | None  # samples_per_step / p50: the same statistic as the rank's p50
    phases: dict[str, float]  # mean ms per phase; with comm timing, `comm` is split out of backward
    has_comm: bool
    comm_share: float | None  # all-reduce in flight / step time
    exposed_share: float | None  # exposed all-reduce wait / step time
    compressing: float | None  # the last record's flag, if the probe sends it
    step_ms: tuple[float, ...]  # the step times of the rank's whole ring (RECENT), oldest first


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
    """A mirror of one rank's recent-record ring buffer (its step times: the sparkline's
    history) with running sums over its last WINDOW rows, the window every figure of the
    rank is taken over; updated by the records that arrived since the last look (not by
    rescanning them)."""

    def __init__(self) -> None:
        self.seen = -1
        self.rows: collections.deque[tuple[float | None, ...]] = collections.deque()
        # Step times of the ring's rows that have one, in order (the sparkline's history).
        self.steps: collections.deque[float] = collections.deque()
        self.sums = [0.0] * len(_FIELDS)  # over the last WINDOW rows
        self.n_samples = self.n_comm = self.n_exposed = self.added = 0
        self.comm_step = 0.0  # step time of the rows that carry comm_ms (timed every Nth step on GPU)
        self.tail: list[dict[str, float]] = []  # the last WINDOW records
        self.figures = EMPTY

    @staticmethod
    def _row(rec: dict[str, float]) -> tuple[float | None, ...]:
        return tuple(rec.get(k) for k in _FIELDS)

    def _sum(self, row: tuple[float | None, ...], sign: int) -> None:
        """`row` into (sign 1) or out of (-1) the window's sums."""
        sums = self.sums
        for i, v in enumerate(row):
            if v is not None:
                sums[i] += sign * v
        if row[_SAMPLES] is not None:
            self.n_samples += sign
        if row[_EXPOSED] is not None:
            self.n_exposed += sign
        if row[_COMM] is not None:
            self.n_comm += sign
            self.comm_step += sign * (row[_STEP] or 0.0)

    def _push(self, row: tuple[float | None, ...], maxlen: int) -> None:
        rows = self.rows
        if len(rows) == maxlen and rows.popleft()[_STEP] is not None:
            self.steps.popleft()
        rows.append(row)
        if row[_STEP] is not None:
            self.steps.append(row[_STEP])  # type: ignore[arg-type]
        self._sum(row, 1)
        if len(rows) > WINDOW:  # the row that just left the window
            self._sum(rows[-WINDOW - 1], -1)

    def update(self, rs: RankRecords) -> RankFigures:
        """Catch up with `rs` and return its figures (recomputed only if records arrived)."""
        new = rs.steps - self.seen
        if self.seen >= 0 and new == 0:
            return self.figures
        recent = rs.recent
        maxlen = max(recent.maxlen or len(recent), WINDOW + 1)
        if self.seen < 0 or new < 0 or new > len(recent) or self.added > _RESUM_EVERY:
            self.rows = collections.deque(maxlen=maxlen)
            self.steps.clear()
            self.sums = [0.0] * len(_FIELDS)
            self.n_samples = self.n_comm = self.n_exposed = self.added = 0
            self.comm_step = 0.0
            for rec in recent:
                self._push(self._row(rec), maxlen)
        else:
            for i in range(new, 0, -1):
                self._push(self._row(recent[-i]), maxlen)
                self.added += 1
        self.seen = rs.steps
        start = max(len(recent) - WINDOW, 0)
        self.tail = [recent[i] for i in range(start, len(recent))]
        self.figures = self._figures()
        return self.figures

    def _figures(self) -> RankFigures:
        rows = self.rows
        n = min(len(rows), WINDOW)
        if not n:
            return EMPTY
        window = [rows[i] for i in range(len(rows) - n, len(rows))]
        sums = self.sums
        timed = [r for r in window if r[_STEP] is not None]
        ordered = sorted(r[_STEP] for r in timed)  # type: ignore[type-var]
        own = sorted(r[_STEP] - (r[_EXPOSED] or 0.0) for r in timed)  # type: ignore[operator]
        tail = self.tail
        ranked = len(tail) >= MIN_RECORDS and all("step_ms" in r for r in tail)
        means = {p: sums[1 + i] / n for i, p in enumerate(PHASES)}
        # exposed comm alone (a GPU run without nccl_timing) still splits out of backward
        has_comm = self.n_comm > 0 or self.n_exposed > 0
        step_total = sums[_STEP]
        if has_comm:
            ex_mean = sums[_EXPOSED] / n
            means = {"data": means["data"], "forward": means["forward"],
                     "backward": max(means["backward"] - ex_mean, 0.0), "comm": ex_mean,
                     "optimizer": means["optimizer"]}
        p50 = pct(ordered, 50)  # type: ignore[arg-type]
        per_step = sums[_SAMPLES] / self.n_samples if self.n_samples and sums[_SAMPLES] > 0 else None
        return RankFigures(
            p50=p50, p95=pct(ordered, 95), own_ms=_median(own), ranked=ranked,  # type: ignore[arg-type]
            samples_per_step=per_step,
            samples_per_s=per_step * 1000.0 / p50 if per_step and p50 else None,
            phases=means, has_comm=has_comm,
            comm_share=sums[_COMM] / self.comm_step if self.n_comm and self.comm_step > 0 else None,
            exposed_share=sums[_EXPOSED] / step_total if has_comm and step_total > 0 else None,
            compressing=tail[-1].get("compressing") if tail else None,
            step_ms=tuple(self.steps),
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


def fastest(figures: Mapping[int, RankFigures]) -> int | None:
    """The rank doing the least own work per step over its last WINDOW records (ties: the
    lowest rank); None with fewer than two ranked ranks. Not a verdict: what a view shows
    beside the slowest (the step timelines side by side)."""
    own = _own(figures)
    if len(own) < 2:
        return None
    return min(sorted(own), key=lambda r: own[r])


def job_samples_per_step(figures: Mapping[int, RankFigures]) -> float | None:
    """Samples one step of the whole job takes in: the sum over ranks (None unless every
    rank with figures knows its own)."""
    counts = [f.samples_per_step for f in figures.values() if f.p50 is not None]
    if not counts or any(c is None for c in counts):
        return None
    return sum(c for c in counts if c is not None)


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
