"""The rules over ranks, on their recent windows (ddptop.model.figures.window): the slowest
and fastest rank, the job's median step and pace now, the stall bound, the comm shares and
phase shares the header and legend show, whether a comm hook is still warming up, and a
node's step and own work over its ranks (the rank table's node rows).

Pure: RankFigures in, figures out.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence

from ddptop.model.config import RunConfig
from ddptop.model.figures.stats import median
from ddptop.model.figures.window import RECENT_LABEL, STALL_MIN_S, STALL_STEPS, RankFigures


def _own(figures: Mapping[int, RankFigures]) -> dict[int, float]:
    return {r: f.own_ms for r, f in figures.items() if f.ranked and f.own_ms is not None}


def _extreme(figures: Mapping[int, RankFigures], pick: Callable[..., int]) -> int | None:
    """The rank `pick` (max or min) chooses by own work (ties: the lowest rank); None with
    fewer than two ranked ranks."""
    own = _own(figures)
    if len(own) < 2:
        return None
    return pick(sorted(own), key=lambda r: own[r])


def slowest(figures: Mapping[int, RankFigures]) -> int | None:
    """The rank doing the most own work per step over its last WINDOW records (ties: the
    lowest rank); None with fewer than two ranked ranks. A view marks the straggler instead
    while one is named (Snapshot.slowest, RunState.slowest_rank)."""
    return _extreme(figures, max)


def job_step_ms_p50_last50(figures: Mapping[int, RankFigures]) -> float | None:
    """The slowest rank's median step: what bounds a DDP job right now."""
    medians = [f.p50 for f in figures.values() if f.p50]
    return max(medians) if medians else None


def job_steps_per_s_last50(figures: Mapping[int, RankFigures]) -> float | None:
    """The job's pace now: 1000 / the slowest rank's median step over its last WINDOW records; where
    one step in K is timed, over the steps their spans cover (the untimed ones too: a timed step
    pays the hooks), when every rank's records carry them."""
    shown = [f for f in figures.values() if f.p50]
    if shown and all(f.pace_ms for f in shown):
        return 1000.0 / max(f.pace_ms for f in shown if f.pace_ms)
    p50 = job_step_ms_p50_last50(figures)
    return 1000.0 / p50 if p50 else None


def fastest(figures: Mapping[int, RankFigures]) -> int | None:
    """The rank doing the least own work per step over its last WINDOW records (ties: the
    lowest rank); None with fewer than two ranked ranks. Not a verdict: what a view shows
    beside the slowest (the step timelines side by side)."""
    return _extreme(figures, min)


def job_samples_per_step_last50(figures: Mapping[int, RankFigures]) -> float | None:
    """Samples one step of the whole job takes in: the sum over ranks (None unless every
    rank with figures knows its own)."""
    counts = [f.samples_per_step for f in figures.values() if f.p50 is not None]
    if not counts or any(c is None for c in counts):
        return None
    return sum(c for c in counts if c is not None)


def stall_bound_s(figures: Mapping[int, RankFigures]) -> float:
    """How long no progress means a stall: STALL_STEPS of the job's median step, at least STALL_MIN_S."""
    p50 = job_step_ms_p50_last50(figures)
    return max(STALL_MIN_S, STALL_STEPS * p50 / 1000.0) if p50 else STALL_MIN_S


def comm_shares_last50(figures: Mapping[int, RankFigures]) -> tuple[float | None, float] | None:
    """(in flight, exposed) share of step time, mean over the ranks that time comm; in flight
    is None where only exposed comm is measured (GPU, DDP's own all-reduce, no nccl_timing)."""
    shares = [(f.comm_share, f.exposed_share or 0.0) for f in figures.values() if f.comm_share is not None]
    if shares:
        return (sum(a for a, _ in shares) / len(shares), sum(b for _, b in shares) / len(shares))
    exposed = [f.exposed_share for f in figures.values() if f.exposed_share is not None]
    return (None, sum(exposed) / len(exposed)) if exposed else None


def comm_window(figures: Mapping[int, RankFigures]) -> str:
    """The window comm_shares_last50 is over, in words: the last 50 steps, or, where the
    all-reduce is timed on some steps only (a GPU times one in comm_timing_every), the timed
    ones among them (both shares are over those same steps)."""
    timed = [(f.comm_steps, f.window_steps) for f in figures.values() if f.comm_steps]
    if not timed or all(k == n for k, n in timed):
        return RECENT_LABEL
    k, n = min(k for k, _ in timed), max(n for _, n in timed)
    return f"the steps of the {RECENT_LABEL} that timed the all-reduce, {k} of {n}"


def warming_up(config: RunConfig, figures: Mapping[int, RankFigures], current_step: int) -> bool:
    """A comm hook is configured but gradients still travel uncompressed."""
    if config.comm_hook == "none":
        return False
    flags = [f.compressing for f in figures.values() if f.compressing is not None]
    if flags:
        return not any(flags)
    if config.comm_hook == "powersgd":
        return current_step + 1 < config.powersgd_start_iter
    return False


def phase_shares_last50(figures: Mapping[int, RankFigures], phases: Sequence[str]) -> dict[str, float]:
    """Each phase's share of the step over the ranks with figures (the legend's numbers)."""
    figs = [f for f in figures.values() if f.p50 is not None]
    totals = {p: sum(f.phases.get(p, 0.0) for f in figs) for p in phases}
    whole = sum(totals.values())
    return {p: v / whole for p, v in totals.items()} if whole > 0 else {}


def job_samples_per_s_last50(figures: Mapping[int, RankFigures]) -> float | None:
    """The job's samples per second now: its pace now x the samples one job step takes in."""
    rate, per_step = job_steps_per_s_last50(figures), job_samples_per_step_last50(figures)
    return rate * per_step if rate is not None and per_step is not None else None


def rank_samples_per_s_last50(figures: Mapping[int, RankFigures]) -> dict[int, float | None]:
    """What each rank contributes to job_samples_per_s_last50 (the job's pace, the rank's
    samples per step): the rows of the rank table add up to the header's figure."""
    rate = job_steps_per_s_last50(figures)
    return {r: f.samples_per_step * rate if f.samples_per_step and rate else None for r, f in figures.items()}


def node_step_ms_p50_last50(figures: Iterable[RankFigures]) -> float | None:
    """A node's step now: the median over its ranks (`figures`: theirs only) of each rank's
    median step over its last WINDOW records; None before any rank has one."""
    return median(sorted(f.p50 for f in figures if f.p50 is not None))


def node_own_ms_last50(figures: Iterable[RankFigures]) -> float | None:
    """A node's own work now: the most of its ranks' median own work (step minus exposed comm)
    over their last WINDOW records; the rank the others wait for sets it."""
    return max((f.own_ms for f in figures if f.own_ms is not None), default=None)
