"""Snapshot: every figure a view shows of a run at one moment, read once per refresh
from RunState and ddptop.model.figures and handed to all views (TUI, headless line), so no
two views can disagree. Pure: no I/O, no UI.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ddptop.model import figures
from ddptop.model.figures import PHASES_WITH_COMM, RankFigures
from ddptop.model.nodes import STALLED, NodeFigures, node_figures
from ddptop.model.state import RankState, RunState, Stall
from ddptop.model.status import RankStatus
from ddptop.model.straggler import Finding, Verdict, words
from ddptop.wire.protocol import PHASES


@dataclass(frozen=True)
class Snapshot:
    state: RunState
    now: float
    ranks: dict[int, RankFigures]
    status: dict[int, str]  # rank -> its status, "stalled?" past the run's stall bound
    # The rank views mark: the straggler while one is named, else none. It changes only when
    # the verdict does (ddptop.model.straggler's hysteresis), never with step-to-step noise.
    slowest: int | None
    with_comm: bool
    steps_per_s: float | None  # window "run": figures.job_steps_per_s_run, bounded by the slowest rank
    samples_per_s_run: float | None  # window "run": figures.job_samples_per_s_run (steps_per_s x samples per step)
    p50_ms: float | None  # window "last 50": the slowest rank's recent median step
    comm: tuple[float | None, float] | None  # (in flight, exposed) share of step, mean over ranks; in flight
    # is None where only exposed comm is measured (GPU, DDP's own all-reduce, no nccl_timing)
    comm_window: str  # the steps both comm shares are over (figures.comm_window)
    # (in flight, exposed) over the whole run, as the exit summary and summary.json say them
    comm_run: tuple[float | None, float | None]
    warming_up: bool  # a comm hook is configured but gradients still travel uncompressed
    straggler: Finding | None = None  # the straggler named (ddptop.model.straggler), with its evidence
    verdict: Verdict = Verdict()  # the straggler verdict, named or not
    # ...in the one wording every view shows (straggler.words): in force while the run goes,
    # the run's verdict once it ended ("no straggler (largest: rank 1 +0.6 ms, 2%; ...)")
    verdict_text: str = ""
    stall: Stall | None = None  # state.stall while it is not cleared
    # window "last 50" (figures.RECENT_LABEL): the job's pace now, 1000 / p50_ms, and what
    # each rank contributes to it (the rows of the rank table add up to the job's figure)
    recent_steps_per_s: float | None = None
    recent_samples_per_s: float | None = None
    rank_samples_per_s: dict[int, float | None] = field(default_factory=dict)
    heaviest: int | None = None  # most own work now (figures.slowest; noisy: not a mark)
    lightest: int | None = None  # least own work now (figures.fastest)
    nodes: tuple[NodeFigures, ...] = ()  # a multi-node run's nodes over their ranks (ddptop.model.nodes)
    # the run's live fields as they were at `now`: a paused view shows these, not the state's
    # (which goes on changing underneath it; issue 46: a paused header kept counting steps)
    current_step: int = -1
    run_status: str = ""
    finished: bool = False
    dropped: int = 0

    @property
    def phase_names(self) -> tuple[str, ...]:
        return PHASES_WITH_COMM if self.with_comm else PHASES


def rank_status(rs: RankState, now: float, bound_s: float) -> str:
    """A running rank silent for longer than the run's stall bound reads "stalled?"."""
    if rs.status == RankStatus.RUNNING and rs.last_seen and now - rs.last_seen > bound_s:
        return STALLED
    return rs.status


def snapshot(state: RunState, now: float) -> Snapshot:
    ranks = state.rank_figures()
    bound = figures.stall_bound_s(ranks)
    many = state.world_size > 1
    verdict = state.straggler_verdict if many else Verdict()
    # once the run ended, the run's verdict (the one in force on most checks) marks the rank
    named = verdict.run_straggler() if state.finished else verdict.straggler
    status = {r: rank_status(state.ranks[r], now, bound) for r in ranks}
    return Snapshot(
        state=state, now=now, ranks=ranks,
        status=status,
        slowest=named.rank if named is not None else None,
        with_comm=any(f.has_comm for f in ranks.values()),
        steps_per_s=figures.job_steps_per_s_run(state.ranks.values()),
        samples_per_s_run=figures.job_samples_per_s_run(state.ranks.values()),
        p50_ms=figures.job_step_ms_p50_last50(ranks),
        comm=figures.comm_shares_last50(ranks),
        comm_window=figures.comm_window(ranks),
        comm_run=(figures.mean_share_run(state.ranks.values(), "comm_ms"),
                  figures.mean_share_run(state.ranks.values(), "exposed_comm_ms")),
        warming_up=figures.warming_up(state.config, ranks, state.current_step),
        straggler=named, verdict=verdict, verdict_text=words(verdict, state.finished),
        stall=state.stall if state.stall is not None and state.stall.cleared_at is None else None,
        recent_steps_per_s=figures.job_steps_per_s_last50(ranks),
        recent_samples_per_s=figures.job_samples_per_s_last50(ranks),
        rank_samples_per_s=figures.rank_samples_per_s_last50(ranks),
        heaviest=figures.slowest(ranks) if many else None,
        lightest=figures.fastest(ranks) if many else None,
        nodes=node_figures(state, ranks, status, named.rank if named is not None else None),
        current_step=state.current_step, run_status=str(state.status), finished=state.finished,
        dropped=state.total_dropped,
    )
