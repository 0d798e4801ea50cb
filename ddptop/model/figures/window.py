"""Each rank's recent window (its last WINDOW records): p50/p95, phase split, samples per
step, own work, comm shares, kept by running sums as records arrive (RankWindow) and read
as one RankFigures. The rules over ranks are ddptop.model.figures.rules'.

Pure: no I/O, no UI; depends on the protocol's phase names only (RunState imports this
package, not the other way round: a rank is anything with `steps` and `recent`).
"""

from __future__ import annotations

import collections
from dataclasses import dataclass
from typing import Protocol

from ddptop.model.figures.stats import median, pct
from ddptop.wire.protocol import PHASES

WINDOW = 50  # a rank's last records that the slowest-rank rule looks at
# The windows figures are taken over, as every view names them (issue 31: a figure says which).
RECENT_LABEL = f"last {WINDOW}"  # each rank's last WINDOW records
RUN_LABEL = "run"  # the whole run after warmup
MIN_RECORDS = 5  # ...at least this many, or the rank is not ranked
STALL_MIN_S = 10.0
STALL_STEPS = 20  # a stall is this many median steps with no progress (at least STALL_MIN_S)
PHASES_WITH_COMM = ("data", "forward", "backward", "comm", "optimizer")

# Per record, in this order: step, data, forward, backward, optimizer, samples, comm, exposed,
# the span since the previous record (steps, ms: one step in K timed) and the exposed part of a
# timed all-reduce (exposed_of_comm).
_FIELDS = ("step_ms", "data_ms", "forward_ms", "backward_ms", "optimizer_ms", "samples",
           "comm_ms", "exposed_comm_ms", "span_steps", "span_ms", "exposed_of_comm")
_STEP, _SAMPLES, _COMM, _EXPOSED, _SPAN_STEPS, _SPAN_MS, _EXPOSED_OF_COMM = 0, 5, 6, 7, 8, 9, 10
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
    samples_per_s_last50: float | None  # samples_per_step / p50 (/ pace_ms where one step in K is timed)
    phases: dict[str, float]  # mean ms per phase; with comm timing, `comm` is split out of backward
    has_comm: bool
    # Both shares over the same steps (issue 46): with comm timed, the rows that carry comm_ms
    # (a GPU times one step in comm_timing_every), exposed then being the part of each timed
    # all-reduce no compute hid, min(wait, in flight), so it never exceeds comm_share; without
    # comm timing, exposed is the wait over every row.
    comm_share: float | None  # all-reduce in flight / step time
    exposed_share: float | None  # exposed all-reduce / step time
    compressing: float | None  # the last record's flag, if the probe sends it
    step_ms: tuple[float, ...]  # the step times of the rank's whole ring (RECENT), oldest first
    comm_steps: int = 0  # rows of the window that timed the all-reduce (the shares' window)
    window_steps: int = 0  # rows in the window (WINDOW once the rank has sent that many)
    # one step in K timed (ddptop.rank.phase_every): the mean ms a step over the spans of the window's
    # rows, the untimed steps included (the job's pace; a timed step pays the hooks): None unless
    # every row carries a span
    pace_ms: float | None = None


EMPTY = RankFigures(None, None, None, False, None, None, dict.fromkeys(PHASES, 0.0), False, None, None, None, ())


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
        self.n_samples = self.n_comm = self.n_exposed = self.n_span = self.added = 0
        self.comm_step = 0.0  # step time of the rows that carry comm_ms (timed every Nth step on GPU)
        self.tail: list[dict[str, float]] = []  # the last WINDOW records
        self.figures = EMPTY

    @staticmethod
    def _row(rec: dict[str, float]) -> tuple[float | None, ...]:
        return tuple(rec.get(k) for k in _FIELDS[:-1]) + (exposed_of_comm(rec),)

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
        if row[_SPAN_STEPS] is not None:
            self.n_span += sign
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
            self.n_samples = self.n_comm = self.n_exposed = self.n_span = self.added = 0
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
        pace = sums[_SPAN_MS] / sums[_SPAN_STEPS] if self.n_span == n and sums[_SPAN_STEPS] > 0 else None
        per_s_over = pace or p50
        return RankFigures(
            p50=p50, p95=pct(ordered, 95), own_ms=median(own), ranked=ranked,  # type: ignore[arg-type]
            samples_per_step=per_step,
            samples_per_s_last50=per_step * 1000.0 / per_s_over if per_step and per_s_over else None,
            phases=means, has_comm=has_comm,
            comm_share=sums[_COMM] / self.comm_step if self.n_comm and self.comm_step > 0 else None,
            exposed_share=(sums[_EXPOSED_OF_COMM] / self.comm_step if self.n_comm and self.comm_step > 0
                           else sums[_EXPOSED] / step_total if has_comm and step_total > 0 else None),
            compressing=tail[-1].get("compressing") if tail else None,
            step_ms=tuple(self.steps),
            comm_steps=self.n_comm, window_steps=n, pace_ms=pace,
        )


def exposed_of_comm(rec: dict[str, float]) -> float | None:
    """The part of a step's timed all-reduce that no compute hid: the wait after backward's
    compute, at most the all-reduce's own time (the wait also holds DDP's work after it). None
    on a step whose all-reduce was not timed. The step timeline's `exposed` is the same figure."""
    comm = rec.get("comm_ms")
    if comm is None:
        return None
    return min(max(rec.get("exposed_comm_ms", 0.0), 0.0), comm)


def rank_figures(rs: RankRecords) -> RankFigures:
    """One rank's figures from scratch (RunState keeps a RankWindow per rank instead)."""
    return RankWindow().update(rs)


def eval_ms_per_step_recent(rs: RankRecords) -> float | None:
    """Forwards without grad (validation, generation) a step, the mean over every record of
    the rank's recent ring (not only the last WINDOW); None when none ran."""
    total = sum(r.get("eval_ms", 0.0) for r in rs.recent)
    return total / len(rs.recent) if total else None


HOST_GAP_SHOWN_MS = 1.0  # a gap under this is the loss's own launch: not said


def host_gap_ms_recent(rs: RankRecords) -> float | None:
    """The rank's host time between its forward's return and backward (host_gap_ms), the
    median over its recent ring: inside its forward phase, where a loader called there (as
    nanoGPT prefetches the next batch) or a sync spends its time. None when not recorded or
    under HOST_GAP_SHOWN_MS."""
    gaps = sorted(g for r in rs.recent if (g := r.get("host_gap_ms")) is not None)
    mid = median(gaps)
    return mid if mid is not None and mid >= HOST_GAP_SHOWN_MS else None
