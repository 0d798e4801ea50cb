"""Live figures derived from RunState that the views share: per-rank recent-window
figures (p50/p95, phase split with communication, samples/s), stall detection,
the slowest rank, run rates. Pure; candidates to move into ddptop.state.

One `Snapshot` is built per refresh and handed to every view, so each rank's
recent window is read once, and not at all if the rank sent nothing new.
"""

from __future__ import annotations

import collections
from dataclasses import dataclass, field

from ddptop.protocol import PHASES
from ddptop.state import RankState, RunState, Stall, Straggler

# The verdict reads 50 records per rank (~15-30 ms at 64 ranks): not on every refresh,
# and not at all while no record arrives. A window of 50 steps changes slowly anyway.
STRAGGLER_EVERY_S = 3.0
STALL_S = 10.0  # a running rank silent this long (and 10 of its steps) looks stalled
PHASES_WITH_COMM = ("data", "forward", "backward", "comm", "optimizer")


@dataclass(frozen=True)
class RankFigures:
    """One rank's recent window, read once."""

    p50: float | None
    p95: float | None
    own_ms: float | None  # median step minus exposed comm: what ranks a straggler
    samples_per_s: float | None
    phases: dict[str, float]  # mean ms per phase; with comm timing, `comm` is split out of backward
    has_comm: bool
    comm_share: float | None  # all-reduce in flight / step time
    exposed_share: float | None  # exposed all-reduce wait / step time
    compressing: float | None  # the last record's flag, if the probe sends it
    step_ms: tuple[float, ...]  # the window's step times, oldest first


def _median(ordered: list[float]) -> float | None:
    n = len(ordered)
    if not n:
        return None
    return ordered[n // 2] if n % 2 else (ordered[n // 2 - 1] + ordered[n // 2]) / 2


def _pct(ordered: list[float], q: float) -> float | None:
    if not ordered:
        return None
    return ordered[min(len(ordered) - 1, int(round(q / 100.0 * (len(ordered) - 1))))]


# Per record, in this order: step, data, forward, backward, optimizer, samples, comm, exposed.
_FIELDS = ("step_ms", "data_ms", "forward_ms", "backward_ms", "optimizer_ms", "samples",
           "comm_ms", "exposed_comm_ms")
_STEP, _SAMPLES, _COMM, _EXPOSED = 0, 5, 6, 7
_RESUM_EVERY = 4096  # records; running sums are recomputed now and then against float drift


class RankWindow:
    """Running sums over a mirror of one rank's recent-record ring buffer, updated
    by the records that arrived since the last look (not by rescanning 256)."""

    def __init__(self) -> None:
        self.seen = -1
        self.rows: collections.deque[tuple[float | None, ...]] = collections.deque()
        # Step times and own times (step minus exposed comm) of the rows that have a
        # step time, in order: sorted() on these is C speed, a generator is not.
        self.steps: collections.deque[float] = collections.deque()
        self.own: collections.deque[float] = collections.deque()
        self.sums = [0.0] * len(_FIELDS)
        self.n_step = self.n_comm = self.added = 0
        self.comm_step = 0.0  # step time of the rows that carry comm_ms (timed every Nth step on GPU)
        self.last: dict[str, float] = {}

    @staticmethod
    def _row(rec: dict[str, float]) -> tuple[float | None, ...]:
        return tuple(rec.get(k) for k in _FIELDS)

    def _add(self, row: tuple[float | None, ...], sign: int) -> None:
        sums = self.sums
        for i, v in enumerate(row):
            if v is not None:
                sums[i] += sign * v
        if row[_STEP] is not None:
            self.n_step += sign
            if sign > 0:
                self.steps.append(row[_STEP])
                self.own.append(row[_STEP] - (row[_EXPOSED] or 0.0))
            else:
                self.steps.popleft()
                self.own.popleft()
        if row[_COMM] is not None:
            self.n_comm += sign
            self.comm_step += sign * (row[_STEP] or 0.0)

    def update(self, rs: RankState) -> bool:
        """Catch up with `rs`; False if nothing arrived since the last call."""
        new = rs.steps - self.seen
        if self.seen >= 0 and new == 0:
            return False
        recent = rs.recent
        maxlen = recent.maxlen or len(recent)
        if self.seen < 0 or new < 0 or new > len(recent) or self.added > _RESUM_EVERY:
            self.rows = collections.deque((self._row(r) for r in recent), maxlen)
            self.steps.clear()
            self.own.clear()
            self.sums = [0.0] * len(_FIELDS)
            self.n_step = self.n_comm = self.added = 0
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
        self.last = recent[-1] if recent else {}
        return True

    def figures(self) -> RankFigures:
        n = len(self.rows)
        if not n:
            return RankFigures(None, None, None, None, dict.fromkeys(PHASES, 0.0), False,
                               None, None, None, ())
        sums = self.sums
        steps = tuple(self.steps)
        ordered = sorted(steps)
        own = sorted(self.own)
        means = {p: sums[1 + i] / n for i, p in enumerate(PHASES)}
        has_comm = self.n_comm > 0
        step_total = sums[_STEP]
        if has_comm:
            ex_mean = sums[_EXPOSED] / n
            means = {"data": means["data"], "forward": means["forward"],
                     "backward": max(means["backward"] - ex_mean, 0.0), "comm": ex_mean,
                     "optimizer": means["optimizer"]}
        samples = sums[_SAMPLES]
        return RankFigures(
            p50=_pct(ordered, 50), p95=_pct(ordered, 95),
            own_ms=_median(own),
            samples_per_s=samples / (step_total / 1000.0) if step_total > 0 and samples > 0 else None,
            phases=means, has_comm=has_comm,
            comm_share=sums[_COMM] / self.comm_step if has_comm and self.comm_step > 0 else None,
            exposed_share=sums[_EXPOSED] / step_total if has_comm and step_total > 0 else None,
            compressing=self.last.get("compressing"),
            step_ms=steps,
        )


def rank_figures(rs: RankState) -> RankFigures:
    """One rank's figures from scratch (the cache in LiveFigures does it incrementally)."""
    window = RankWindow()
    window.update(rs)
    return window.figures()


def rank_status(rs: RankState, figures: RankFigures, now: float) -> str:
    if rs.status == "running" and rs.last_seen:
        if now - rs.last_seen > max(STALL_S, 10 * (figures.p50 or 0.0) / 1000.0):
            return "stalled?"
    return rs.status


def rank_location(rs: RankState) -> str:
    h = rs.hello
    return f"{h.host}/{h.device}" if h else "-"


@dataclass(frozen=True)
class Snapshot:
    state: RunState
    now: float
    ranks: dict[int, RankFigures]
    status: dict[int, str]
    slowest: int | None
    with_comm: bool
    steps_per_s: float | None
    samples_per_s: float | None
    comm: tuple[float, float] | None  # (in flight, exposed) share of step time, mean over ranks
    warming_up: bool  # a comm hook is configured but gradients still travel uncompressed
    straggler: Straggler | None = None  # state.straggler(), at most STRAGGLER_EVERY_S old
    stall: Stall | None = None  # state.stall while it is not cleared

    @property
    def phase_names(self) -> tuple[str, ...]:
        return PHASES_WITH_COMM if self.with_comm else PHASES


@dataclass
class LiveFigures:
    """Builds Snapshots, re-reading a rank's window only when it received records."""

    _windows: dict[tuple[str, int], tuple[RankWindow, RankFigures]] = field(default_factory=dict)
    _straggler: tuple[str, float, int, Straggler | None] = ("", 0.0, -1, None)  # run, when, records

    def snapshot(self, state: RunState, now: float) -> Snapshot:
        figures: dict[int, RankFigures] = {}
        for r, rs in state.ranks.items():
            key = (state.run_id, r)
            entry = self._windows.get(key)
            if entry is None:
                window = RankWindow()
                window.update(rs)
                entry = (window, window.figures())
            elif entry[0].update(rs):
                entry = (entry[0], entry[0].figures())
            self._windows[key] = entry
            figures[r] = entry[1]
        if len(self._windows) > len(state.ranks):  # an earlier run's windows
            self._windows = {k: v for k, v in self._windows.items() if k[0] == state.run_id}
        return Snapshot(
            state=state, now=now, ranks=figures,
            status={r: rank_status(state.ranks[r], f, now) for r, f in figures.items()},
            slowest=slowest(figures),
            with_comm=any(f.has_comm for f in figures.values()),
            steps_per_s=_steps_per_s(state, figures),
            samples_per_s=_samples_per_s(state, figures),
            comm=_comm(figures),
            warming_up=_warming_up(state, figures),
            straggler=self._straggler_of(state, now),
            stall=state.stall if state.stall is not None and state.stall.cleared_at is None else None,
        )

    def _straggler_of(self, state: RunState, now: float) -> Straggler | None:
        run, when, seen, verdict = self._straggler
        records = sum(rs.steps for rs in state.ranks.values())
        if run != state.run_id or (records != seen and abs(now - when) >= STRAGGLER_EVERY_S):
            verdict = state.straggler() if state.world_size > 1 else None
            self._straggler = (state.run_id, now, records, verdict)
        return verdict


def slowest(figures: dict[int, RankFigures]) -> int | None:
    """Same rule as RunState.slowest_rank: most own work; ties to the lowest rank."""
    own = {r: f.own_ms for r, f in figures.items() if f.own_ms is not None}
    if len(own) < 2:
        return None
    return max(sorted(own), key=lambda r: own[r])


def _steps_per_s(state: RunState, figures: dict[int, RankFigures]) -> float | None:
    # Live: the slowest rank's median step bounds the job. Finished: the whole run.
    if state.finished:
        return state.steps_per_s()
    medians = [f.p50 for f in figures.values() if f.p50]
    return 1000.0 / max(medians) if medians else None


def _samples_per_s(state: RunState, figures: dict[int, RankFigures]) -> float | None:
    if state.finished:
        return state.samples_per_s()
    rates = [f.samples_per_s for f in figures.values() if f.samples_per_s is not None]
    return sum(rates) if rates else None


def _comm(figures: dict[int, RankFigures]) -> tuple[float, float] | None:
    shares = [(f.comm_share, f.exposed_share or 0.0) for f in figures.values()
              if f.comm_share is not None]
    if not shares:
        return None
    return (sum(a for a, _ in shares) / len(shares), sum(b for _, b in shares) / len(shares))


def _warming_up(state: RunState, figures: dict[int, RankFigures]) -> bool:
    if state.config.get("comm_hook", "none") == "none":
        return False
    flags = [f.compressing for f in figures.values() if f.compressing is not None]
    if flags:
        return not any(flags)
    if state.config.get("comm_hook") == "powersgd":
        return state.current_step + 1 < int(state.config.get("powersgd_start_iter", 0))
    return False
