"""Whole-run figures (window "run": every measured step after warmup): each rank's rates,
shares and phase means from its running sums, the job's (the slowest rank bounds a DDP
job), whole-run percentiles from the ranks' histograms, and the comm shares read back from
a run's summary (the advisor, sweep and tune tables read those).

Pure: rank totals in (anything shaped like ddptop.model.rank_state.RankState), figures out.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Protocol

from ddptop.model.figures.stats import Histogram, mean, merged_percentiles
from ddptop.wire.protocol import PHASES


class RankTotals(Protocol):
    """What the run-window figures read of a rank (ddptop.model.rank_state.RankState)."""

    measured: int  # steps after warmup
    measured_ms: float
    measured_samples: float
    measured_tokens: float
    span_steps: float  # steps the measured records' spans cover (one in K timed), with their host time
    span_ms: float
    phase_ms: dict[str, float]
    extra_ms: dict[str, float]  # comm_ms, exposed_comm_ms, ... summed
    timed_step_ms: float  # step time of the steps that carry comm_ms
    timed_exposed_ms: float  # the exposed part of their all-reduce (figures.exposed_of_comm)
    step_hist: Histogram
    comm_hist: Histogram  # comm_ms of the steps that carry it


class RankHello(Protocol):
    @property
    def hello(self) -> object | None: ...


def ranks_connected(ranks: Iterable[RankHello]) -> int:
    """How many ranks have said hello (the "waiting for ranks" line of every view)."""
    return sum(1 for rs in ranks if rs.hello is not None)


# --- one rank -------------------------------------------------------------------------
def rank_steps_per_s_run(rs: RankTotals) -> float | None:
    """The rank's pace after warmup: where one step in K is timed, the steps its records' spans
    cover over their host time (the untimed steps, which run without the hooks, count at their own
    pace); else its records over their step time."""
    if rs.span_steps >= rs.measured > 0 and rs.span_ms > 0:
        return rs.span_steps / (rs.span_ms / 1000.0)
    return rs.measured / (rs.measured_ms / 1000.0) if rs.measured_ms > 0 else None


def _per_s(rs: RankTotals, total: float) -> float | None:
    """`total` (samples or tokens of the measured records) a second: per timed step, at the pace."""
    pace = rank_steps_per_s_run(rs)
    return total / rs.measured * pace if pace is not None and total > 0 and rs.measured else None


def rank_samples_per_s_run(rs: RankTotals) -> float | None:
    """The rank's own samples a second; None when no step carried samples (unknown, not zero)."""
    return _per_s(rs, rs.measured_samples)


def rank_tokens_per_s_run(rs: RankTotals) -> float | None:
    """None unless the script reported tokens."""
    return _per_s(rs, rs.measured_tokens)


def rank_share_run(rs: RankTotals, key: str) -> float | None:
    """Fraction of measured step time spent in `key` (comm_ms: over the steps that carry it,
    as GPUs time comm every Nth step; exposed_comm_ms: over those same steps, the exposed part
    of each timed all-reduce, so never above comm's share; over every measured step, the wait,
    only where the all-reduce is not timed)."""
    if key not in rs.extra_ms:
        return None
    if key == "exposed_comm_ms" and rs.timed_step_ms > 0:
        return rs.timed_exposed_ms / rs.timed_step_ms
    total = rs.timed_step_ms if key == "comm_ms" else rs.measured_ms
    return rs.extra_ms[key] / total if total > 0 else None


def rank_phases_mean_run(rs: RankTotals) -> dict[str, float]:
    """Mean ms a measured step per phase; where the wait after backward's compute is measured,
    it is split out of backward as `exposed` (as the live view's phase bar splits it), so a
    rank that waits for another does not read as backward-bound (issue 46)."""
    n = max(rs.measured, 1)
    means = {p: rs.phase_ms[p] / n for p in PHASES}
    if "exposed_comm_ms" not in rs.extra_ms:
        return means
    exposed = rs.extra_ms["exposed_comm_ms"] / n
    return {"data": means["data"], "forward": means["forward"],
            "backward": max(means["backward"] - exposed, 0.0), "exposed": exposed,
            "optimizer": means["optimizer"]}


# --- the job --------------------------------------------------------------------------
def job_steps_per_s_run(ranks: Iterable[RankTotals]) -> float | None:
    """Run throughput after warmup: the slowest rank bounds a DDP job (None until every rank has one)."""
    rates = [rank_steps_per_s_run(rs) for rs in ranks]
    known = [rate for rate in rates if rate is not None]
    return min(known) if known and len(known) == len(rates) else None


def _per_step(ranks: list[RankTotals], attr: str) -> float | None:
    """Samples (or tokens) one step of the whole job processes: the sum over ranks."""
    counts = [(rs.measured, getattr(rs, attr)) for rs in ranks]
    if not counts or any(n == 0 for n, _ in counts):
        return None
    total = sum(v / n for n, v in counts)
    return total if total > 0 else None


def job_samples_per_s_run(ranks: Iterable[RankTotals]) -> float | None:
    """job_steps_per_s_run x samples per job step: the same steps, the same statistic."""
    ranks = list(ranks)
    rate, per_step = job_steps_per_s_run(ranks), _per_step(ranks, "measured_samples")
    return rate * per_step if rate is not None and per_step is not None else None


def job_tokens_per_s_run(ranks: Iterable[RankTotals]) -> float | None:
    """None unless every rank's script reported tokens."""
    ranks = list(ranks)
    if not all(rs.measured_tokens > 0 for rs in ranks):
        return None
    rate, per_step = job_steps_per_s_run(ranks), _per_step(ranks, "measured_tokens")
    return rate * per_step if rate is not None and per_step is not None else None


def eval_ms_per_step_run(ranks: Iterable[RankTotals]) -> float | None:
    """Forwards without grad (validation, generation), outside the phases: their mean ms a
    measured step, over the ranks that ran some (None when none did)."""
    return mean([rs.extra_ms["eval_ms"] / rs.measured for rs in ranks if rs.measured and rs.extra_ms.get("eval_ms")])


def step_ms_pcts_run(ranks: Iterable[RankTotals], *qs: float) -> tuple[float | None, ...]:
    """Whole-run percentiles over all ranks' measured steps, the histograms merged once."""
    return merged_percentiles((rs.step_hist for rs in ranks), *qs)


def mean_share_run(ranks: Iterable[RankTotals], key: str) -> float | None:
    """rank_share_run's mean over the ranks that have one: summary.json's comm_share and
    exposed_comm_share."""
    return mean(rank_share_run(rs, key) for rs in ranks)


def comm_window_run(ranks: Iterable[RankTotals]) -> str | None:
    """The steps summary.json's comm_share and exposed_comm_share are both over, in words:
    every measured step, or the ones that timed the all-reduce (a GPU times one in
    comm_timing_every). None where no rank timed it."""
    timed = [(rs.comm_hist.n, rs.measured) for rs in ranks if rs.comm_hist.n]
    if not timed:
        return None
    if all(k == n for k, n in timed):
        return "run: every measured step"
    k, n = min(k for k, _ in timed), max(n for _, n in timed)
    return f"run: the steps that timed the all-reduce, {k} of {n} measured"


def speedup(rate: float | None, ref_rate: float | None) -> float | None:
    """A throughput against a reference's (sweep, tune, scaling efficiency); None unless both are known."""
    return rate / ref_rate if rate and ref_rate else None


# --- read back from a summary ---------------------------------------------------------
def summary_comm_shares(summary: Mapping[str, Any]) -> tuple[float | None, float | None]:
    """(comm share, exposed comm share) of a run's summary: its run-level fields (mean_share_run)
    when present, else, for a summary without them, the ranks' mean comm_ms / exposed_comm_ms
    over the step p50. None when unmeasured. The advisor, batch, sweep and tune tables read this."""
    ranks = summary.get("ranks") or []
    step = summary.get("step_ms_p50")
    out: list[float | None] = []
    for key in ("comm", "exposed_comm"):
        share = summary.get(f"{key}_share")
        if share is None and step:
            ms = mean(r.get(f"{key}_ms_mean") for r in ranks)
            share = ms / step if ms is not None else None
        out.append(share)
    return out[0], out[1]


def timing_switch(summary: Mapping[str, Any]) -> str:
    """The setting that times a run's all-reduce total, off by default: gloo_timing on gloo (a
    CPU), nccl_timing otherwise. The report and the advisor name it where the total is missing."""
    return "gloo_timing" if summary.get("backend") == "gloo" else "nccl_timing"


def summary_mean_ms(summary: Mapping[str, Any], key: str) -> float | None:
    """Mean over a summary's ranks of a per-rank `<key>_mean` field (comm_ms, exposed_comm_ms)."""
    return mean(r.get(key + "_mean") for r in summary.get("ranks") or [])
