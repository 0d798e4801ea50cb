"""What the ranks' records say of each rank's work over a straggler check's steps: its own work
(the step less its exposed wait), its work outside backward, its backward less that wait; per
step what it costs the job (`Costs`, the rule in ddptop.model.straggler's docstring); and the
phase its excess is in (`phase_of`).

Pure: no I/O, no UI. Used by ddptop.model.straggler.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from ddptop.model.figures.stats import median_nonempty
from ddptop.model.paired import Paired, sign_p
from ddptop.wire.protocol import PHASES

AFTER_FORWARD = "host between forward and backward"  # a phase of its own where the host's gap holds it


def own_work(rec: dict[str, float]) -> float:
    return rec["step_ms"] - rec.get("exposed_comm_ms", 0.0)


def late(rec: dict[str, float]) -> float | None:
    """Larger for a rank that reaches the all-reduce later (it spends less time in it)."""
    comm = rec.get("comm_ms")
    return None if comm is None else -comm


def _unhidden(rec: dict[str, float]) -> float | None:
    """Less for a rank that waits less at backward's end for the all-reduce."""
    return -rec.get("exposed_comm_ms", 0.0)


def _outside(rec: dict[str, float]) -> float:
    """The step less backward: its data, forward and optimizer (and what lies between)."""
    return rec["step_ms"] - rec.get("backward_ms", 0.0)


def _bwd_own(rec: dict[str, float]) -> float:
    """Backward less the wait at its end: longer for a rank that waited for a peer inside it."""
    return rec.get("backward_ms", 0.0) - rec.get("exposed_comm_ms", 0.0)


class Costs:
    """Per rank and step how much shorter the step would be if it ran as fast as the others:
    its own work beyond the next-latest rank's (the largest of the others': with it as fast
    as they are, that rank would set the step; below 0 on a step it was not the last). Where
    the others waited for it inside their backward (their backward, less its exposed wait,
    longer than its own: the median of that), their own work holds that wait too, so it is
    added (`of`'s `added`): the next-latest rank, rid of the wait, would finish that much
    sooner (a GPU-bound job on 4x H200, session 13: 30 extra matmuls cost 6.64 ms, the margin
    read 3.1 and the wait inside backward 3.5). Not where the job is launch-bound (`launch_bound`:
    a rank's GPU waits for its host at its steps' start): there a GPU's backward is paced by its
    host, and the others' longer backward is their hosts' pace, not a wait that lengthens the step
    (4x H200, session 9: adding it read 8.2 ms for a 5.9 ms loss). Where its own work is not the
    latest beyond chance (the sign test at `alpha`) but the others waited for it, the wait hides
    it entirely: the work outside backward (data, forward, optimizer) is compared instead, and
    nothing added. A launch-bound job whose hosts all keep ahead while they wait for the slow
    rank shows no late host; there the cost is an upper bound: rid of the slow rank, the slowest
    host sets the step, and a host's pace cannot be read while it waits (its blocked launches
    spin: bench/investigations/host_pace.py; session 13 read 6.3 ms for a 1.7 ms loss)."""

    def __init__(self, windows: Mapping[int, Mapping[int, dict[str, float]]], alpha: float) -> None:
        self.alpha = alpha  # the sign test's level for "its own work is the latest beyond chance"
        self.launch_bound = launch_bound(windows)
        self.own = Paired(windows, own_work)
        self.bwd = Paired(windows, _bwd_own)
        self.outside = Paired(windows, _outside)
        self.exposed = Paired(windows, _unhidden)  # the others' wait at backward's end beyond its own

    def of(self, rank: int) -> tuple[dict[int, float], dict[int, float], float, float]:
        """step -> its margin over the next-latest rank; step -> its work beyond the others'
        median (whose median, its typical excess, is what "as fast as the others" takes off
        it); the others' median wait for it inside backward (0: none); what of that wait the
        cost adds to the margin (the wait where own work is compared, else 0)."""
        bwd = self.bwd.diffs[rank]
        paired = [s for s in self.own.diffs[rank] if s in bwd]
        hidden = max(-median_nonempty(sorted(bwd[s] for s in paired)) if paired else 0.0, 0.0)
        last = sum(self.own.over_next[rank].get(s, 0.0) > 0 for s in paired)  # own work the latest
        work = self.outside if hidden > 0 and sign_p(last, len(paired)) > self.alpha else self.own
        margin, excess = work.over_next[rank], work.diffs[rank]
        return ({s: margin[s] for s in paired if s in margin}, {s: excess[s] for s in paired if s in excess},
                hidden, hidden if work is self.own and not self.launch_bound else 0.0)


def launch_bound(windows: Mapping[int, Mapping[int, dict[str, float]]]) -> bool:
    """Some rank's GPU waits for its host at its steps' start: its data phase (a GPU span from
    the step's start to the forward's first kernel) is longer than the others' by HOST_LATE_MS,
    and at least as long again (`data_late`), on the median of the window's steps."""
    data = {r: median_nonempty(sorted(rec.get("data_ms", 0.0) for rec in w.values())) for r, w in windows.items() if w}
    if len(data) < 2:
        return False
    for rank, mine in data.items():
        theirs = median_nonempty(sorted(v for r, v in data.items() if r != rank))
        if data_late(mine - theirs, theirs):
            return True
    return False


def _phase_ms(rec: dict[str, float], phase: str) -> float:
    value = rec.get(phase + "_ms", 0.0)
    return value - rec.get("exposed_comm_ms", 0.0) if phase == "backward" else value


def phase_of(rank: int, windows: Mapping[int, Mapping[int, dict[str, float]]],
             steps: Iterable[int]) -> tuple[str, float, float]:
    """The phase of `rank`'s own work with the largest median excess over the others' median,
    that excess, and its data phase's excess where that says its host is late (else 0). The
    forward phase runs on to backward's start: where the rank's host spent at least half of a
    forward excess between the forward's return and backward (host_gap_ms: a loader there,
    nanoGPT's prefetch), the phase is AFTER_FORWARD, not the model's forward."""
    keys = (*PHASES, "host_gap")
    excess: dict[str, list[float]] = {p: [] for p in keys}
    their_data: list[float] = []
    mine = windows[rank]
    for s in steps:
        theirs = [w[s] for r, w in windows.items() if r != rank and s in w]
        for p in keys:
            others = median_nonempty(sorted(_phase_ms(t, p) for t in theirs))
            excess[p].append(_phase_ms(mine[s], p) - others)
            if p == "data":
                their_data.append(others)
    medians = {p: median_nonempty(sorted(excess[p])) for p in keys}
    worst = max(PHASES, key=lambda p: medians[p])
    if worst == "forward" and medians[worst] > 0 and 2 * medians["host_gap"] >= medians[worst]:
        return AFTER_FORWARD, medians["host_gap"], 0.0
    return worst, medians[worst], host_late(worst, medians["data"], median_nonempty(sorted(their_data)))


HOST_LATE_MS = 0.1  # a data phase this much longer than the others' (and at least doubled): its host is late


def host_late(phase: str, data_excess: float, their_data: float) -> float:
    """A rank slow in its forward, backward or optimizer whose data phase is longer than the
    others' too (by HOST_LATE_MS, and at least as long again as theirs) is late on its host,
    not in its GPU's work: on a GPU the data phase is the GPU's time from the step's start to
    the forward's first kernel, near nothing while the host keeps ahead, so a longer one is the
    GPU idle, waiting for its host to launch. On 4x H200 (session 11) every rank slow without
    an injection read data +0.3-0.7 ms against the others' 0.01 (and its optimizer +1-2 ms);
    a rank made slow by 30 extra matmuls in its forward +0.00. Its data excess, else 0."""
    if phase in ("data", AFTER_FORWARD):
        return 0.0  # already the host's
    return data_excess if data_late(data_excess, their_data) else 0.0


def data_late(data_excess: float, their_data: float) -> bool:
    """A data phase longer than the others' by HOST_LATE_MS, and at least as long again: the
    GPU idle at the step's start, waiting for its host to launch."""
    return data_excess >= max(HOST_LATE_MS, their_data)


def phase_words(phase: str, host_late_ms: float | None = None) -> str:
    """The verdict's words for where a straggler's time goes: its phase, and that its host is
    late where the records say so (`host_late`); every view and the advisor say it so."""
    return f"{phase}, its host late" if host_late_ms else phase
