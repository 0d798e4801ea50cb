"""Pieces of the `summary.json` contract (see README) that `RunState.summary()` puts
together: each rank's entry, all-reduce bus bandwidth, the straggler and the NCCL facts.

Pure: no I/O; reads rank states and reports, never changes them.
"""

from __future__ import annotations

from typing import Any

from ddptop.model import figures, straggler
from ddptop.model.figures import RankFigures
from ddptop.model.host_load import Contention
from ddptop.model.nccl_facts import NcclFacts
from ddptop.model.rank_state import RankState
from ddptop.model.straggler import Finding, Verdict

# steps/s is written with this many decimals everywhere: summary.json rounds to it and every
# view formats with report.fmt_step_rate, so the TUI, the exit summary and the JSON read
# the same digits (issue 46: 27.31, 27.30 and 27.305 of one run).
STEPS_PER_S_DIGITS = 2

__all__ = ["STEPS_PER_S_DIGITS", "bus_bandwidth", "host_dict", "last50", "nccl_facts", "rank_summary", "round_or_none", "straggler_dict", "verdict_dict"]


def rank_summary(rs: RankState, world_size: int, recent: RankFigures | None = None) -> dict[str, Any]:
    """One entry of the summary's `ranks` list; `recent`: the rank's last-50 figures, the
    ones the live view's rank table shows (its final screen, for the exit table)."""
    hello = rs.hello
    entry: dict[str, Any] = {
        "rank": rs.rank,
        "local_rank": hello.local_rank if hello else None,
        "pid": hello.pid if hello else None,
        "host": hello.host if hello else None,
        "node": hello.node if hello else None,
        "device": hello.device if hello else None,
        "status": rs.status,
        "steps": rs.steps_run(),  # the steps it ran (as it said at its end), else as its records show
        "timed_steps": rs.steps,  # its records: one step in K where phase_every samples
        "last_step": rs.last_step,
        "steps_per_s": round_or_none(figures.rank_steps_per_s_run(rs), STEPS_PER_S_DIGITS),
        "samples_per_s": round_or_none(figures.rank_samples_per_s_run(rs)),
        "tokens_per_s": round_or_none(figures.rank_tokens_per_s_run(rs)),
        "step_ms_p50": round_or_none(rs.step_hist.percentile(50)),
        "step_ms_p95": round_or_none(rs.step_hist.percentile(95)),
        "phases_ms": {p: round_or_none(v) for p, v in figures.rank_phases_mean_run(rs).items()},
    }
    if recent is not None and recent.p50 is not None:
        entry["last50"] = last50(recent)
    for key, total in rs.extra_ms.items():
        entry[key + "_mean"] = round_or_none(total / max(rs.measured, 1))
    if rs.exposed_hist.n:
        entry["comm_ms_p50"] = round_or_none(rs.comm_hist.percentile(50))
        entry["comm_timed_steps"] = rs.comm_hist.n
        # over the steps comm_ms_p50 is over (figures.exposed_of_comm), where comm is timed
        exposed = rs.timed_exposed_hist if rs.timed_exposed_hist.n else rs.exposed_hist
        entry["exposed_comm_ms_p50"] = round_or_none(exposed.percentile(50))
        if rs.hook_hist.n:  # the comm hook's whole span; comm_ms is then the collectives' own time
            entry["hook_ms_p50"] = round_or_none(rs.hook_hist.percentile(50))
        entry["comm_share"] = round_or_none(figures.rank_share_run(rs, "comm_ms"), 4)
        entry.update(bus_bandwidth(rs.timed_bytes, rs.extra_ms.get("comm_ms", 0.0), world_size))
        if rs.extra_ms.get("compressing", 0.0) > 0 and entry.get("busbw_gbps") is not None:
            entry["busbw_effective"] = True  # bytes before compression over the compressed collectives' time
        entry["exposed_comm_share"] = round_or_none(figures.rank_share_run(rs, "exposed_comm_ms"), 4)
    if rs.ddp_timing:
        entry["ddp_timing"] = {k: round_or_none(v) for k, v in rs.ddp_timing.items()}
    if rs.info:
        entry["info"] = dict(rs.info)
    return entry


def last50(f: RankFigures) -> dict[str, Any]:
    """A rank's figures over its last 50 steps, as the live view's rank table shows them: step
    p50/p95, own work (step minus the exposed wait), the phases with the exposed wait split out
    of backward, samples/s (the rank's samples a step over the same p50)."""
    phases = {("exposed" if p == "comm" else p): round_or_none(v) for p, v in f.phases.items()}
    return {"p50_ms": round_or_none(f.p50), "p95_ms": round_or_none(f.p95), "own_ms": round_or_none(f.own_ms),
            "phases_ms": phases, "samples_per_s": round_or_none(f.samples_per_s_last50)}


def bus_bandwidth(nbytes: float, comm_ms: float, world: int) -> dict[str, float | None]:
    """All-reduce bandwidth as nccl-tests define it: algbw = bytes / time, busbw = algbw x
    2(n-1)/n. Bytes are the gradient bytes handed to the hook (before any compression), so
    with a compression hook this is the effective bandwidth."""
    if nbytes <= 0 or comm_ms <= 0 or world < 2:
        return {"algbw_gbps": None, "busbw_gbps": None}
    algbw = nbytes / (comm_ms / 1000.0) / 1e9
    return {"algbw_gbps": round(algbw, 3), "busbw_gbps": round(algbw * 2 * (world - 1) / world, 3)}


def straggler_dict(s: Finding | None) -> dict[str, Any] | None:
    """The named straggler and what the verdict rests on (None: no straggler)."""
    return None if s is None else {**_finding(s), "text": s.describe()}


def _finding(s: Finding) -> dict[str, Any]:
    return {"rank": s.rank, "phase": s.phase, "own_ms": round_or_none(s.own_ms),
            "others_ms": round_or_none(s.others_ms), "step_ms": round_or_none(s.step_ms),
            "excess_ms": round_or_none(s.excess_ms), "share": round_or_none(s.share, 4),
            "ci95_ms": [round_or_none(s.ci_low_ms), round_or_none(s.ci_high_ms)],
            "p": float(f"{s.p:.3g}"), "n_steps": s.n, "ranks": s.ranks, "step": s.step,
            "cost_ms": round_or_none(s.cost_ms), "phase_excess_ms": round_or_none(s.phase_ms),
            "others_wait_ms": {"exposed": round_or_none(s.exposed_ms), "hidden": round_or_none(s.hidden_ms)},
            "launch_bound": s.launch_bound,
            "sees_ms": round_or_none(s.sees_ms), "contended": s.contended or None, "host": s.host or None,
            "host_late_ms": round_or_none(s.host_late_ms) if s.host_late_ms else None}


def verdict_dict(v: Verdict) -> dict[str, Any] | None:
    """The run's straggler verdict in words (the one in force on most checks: `held`, by
    verdict), the one in force at the end (`now`) and the latest check (None: never checked)."""
    if v.latest is None:
        return None
    run = v.run_straggler()
    return {"straggler": run.rank if run is not None else None, "text": straggler.words(v, True),
            "now": straggler.words(v, False), "held": dict(v.held), "latest": _finding(v.latest),
            "rule": {"window_steps": straggler.WINDOW, "min_steps": straggler.MIN_STEPS,
                     "every_steps": straggler.EVERY, "persist_checks": straggler.PERSIST,
                     "alpha": straggler.ALPHA, "min_ms": straggler.MIN_MS, "min_share": straggler.MIN_SHARE}}


def host_dict(c: Contention | None) -> dict[str, Any] | None:
    """The host's CPU over the run's last readings (None: not read, or not Linux)."""
    if c is None:
        return None
    return {"seconds": round(c.seconds, 1), "cores": c.cores, "runnable": round(c.runnable, 1),
            "steal": round(c.steal, 3), "run_queue_wait_share": {r: round(v, 3) for r, v in sorted(c.wait_share.items())},
            "cpu_share": {r: round(v, 3) for r, v in sorted(c.cpu_share.items())}}


def nccl_facts(report: NcclFacts | None) -> dict[str, Any] | None:
    """The NCCL facts a summary keeps: version, network, transport per ring pair."""
    if report is None or not report.nccl_lines:
        return None
    return {
        "version": report.version,
        "nranks": report.nranks,
        "network": report.network,
        "env": report.env,
        "transports": {f"{a}->{b}": t.label for (a, b), t in sorted(report.transports.items())},
        "algorithms": {op: sorted(v) for op, v in report.algorithms().items()},
        "unknown_lines": report.unknown_count,
    }


def round_or_none(value: float | None, digits: int = 3) -> float | None:
    return None if value is None else round(value, digits)


