"""The `summary.json` contract (see README): a run's state as one plain dict, with the
per-rank entries, bus bandwidth and NCCL facts it keeps.

Pure: no I/O; reads a RunState, never changes it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ddptop.model.figures import Straggler
from ddptop.model.rank_state import RankState

if TYPE_CHECKING:
    from ddptop.model.state import RunState

__all__ = ["bus_bandwidth", "nccl_facts", "rank_summary", "run_summary"]


def run_summary(state: RunState) -> dict[str, Any]:
    """What `RunState.summary()` returns."""
    first = next((rs.hello for rs in state.ranks.values() if rs.hello), None)
    info = next((rs.info for rs in state.ranks.values() if rs.info), {})
    p50, p95 = state.step_ms_pcts(50, 95)
    return {
        "run_id": state.run_id,
        "preset": state.config.get("preset"),
        "config": state.config,
        "command": state.command,
        "params": info.get("params"),
        "batch_size": info.get("batch_size"),
        "notes": list(state.notes),
        "world_size": state.world_size,
        "nnodes": state.nnodes,
        "backend": first.backend if first else None,
        "model": first.model if first else None,
        "torch": first.torch if first else None,
        "nccl_version": first.nccl if first else None,
        "status": state.status,
        "error": state.error,
        "failed_rank": state.failed_rank,
        "failure_log": list(state.failure_log),
        "elapsed_s": _round(state.elapsed(state.ended_at or state.started_at)),
        "warmup": state.warmup,
        "steps_per_s": _round(state.steps_per_s()),
        "samples_per_s": _round(state.samples_per_s()),
        "tokens_per_s": _round(state.tokens_per_s()),
        "step_ms_p50": _round(p50),
        "step_ms_p95": _round(p95),
        "slowest_rank": state.slowest_rank(),
        "straggler": _straggler_dict(state.straggler()),
        "stalls": state.stalls,
        "stall": state.stall.to_dict() if state.stall else None,
        "comm_share": _round(state.mean_share("comm_ms"), 4),
        "exposed_comm_share": _round(state.mean_share("exposed_comm_ms"), 4),
        "nccl": nccl_facts(state.nccl),
        "advice": state.advice.to_dict() if state.advice is not None else None,
        "captures": [c.to_dict() for c in state.captures.values()],
        "nsys": state.nsys,
        "dropped_frames": dict(state.dropped),
        "refused_connections": state.refused,
        "ranks": [rank_summary(state.ranks[r], state.world_size) for r in sorted(state.ranks)],
    }


def rank_summary(rs: RankState, world_size: int) -> dict[str, Any]:
    """One entry of the summary's `ranks` list."""
    hello = rs.hello
    entry: dict[str, Any] = {
        "rank": rs.rank,
        "local_rank": hello.local_rank if hello else None,
        "pid": hello.pid if hello else None,
        "host": hello.host if hello else None,
        "node": hello.node if hello else None,
        "device": hello.device if hello else None,
        "status": rs.status,
        "steps": rs.steps,
        "last_step": rs.last_step,
        "steps_per_s": _round(rs.steps_per_s),
        "samples_per_s": _round(rs.samples_per_s),
        "tokens_per_s": _round(rs.tokens_per_s),
        "step_ms_p50": _round(rs.step_hist.percentile(50)),
        "step_ms_p95": _round(rs.step_hist.percentile(95)),
        "phases_ms": {p: _round(v) for p, v in rs.phases_mean().items()},
    }
    for key, total in rs.extra_ms.items():
        entry[key + "_mean"] = _round(total / max(rs.measured, 1))
    if rs.exposed_hist.n:
        entry["comm_ms_p50"] = _round(rs.comm_hist.percentile(50))
        entry["comm_timed_steps"] = rs.comm_hist.n
        entry["exposed_comm_ms_p50"] = _round(rs.exposed_hist.percentile(50))
        entry["comm_share"] = _round(rs.share("comm_ms"), 4)
        entry.update(bus_bandwidth(rs.timed_bytes, rs.extra_ms.get("comm_ms", 0.0), world_size))
        entry["exposed_comm_share"] = _round(rs.share("exposed_comm_ms"), 4)
    if rs.ddp_timing:
        entry["ddp_timing"] = {k: _round(v) for k, v in rs.ddp_timing.items()}
    if rs.info:
        entry["info"] = dict(rs.info)
    return entry


def bus_bandwidth(nbytes: float, comm_ms: float, world: int) -> dict[str, float | None]:
    """All-reduce bandwidth as nccl-tests define it: algbw = bytes / time, busbw = algbw x
    2(n-1)/n. Bytes are the gradient bytes handed to the hook (before any compression), so
    with a compression hook this is the effective bandwidth."""
    if nbytes <= 0 or comm_ms <= 0 or world < 2:
        return {"algbw_gbps": None, "busbw_gbps": None}
    algbw = nbytes / (comm_ms / 1000.0) / 1e9
    return {"algbw_gbps": round(algbw, 3), "busbw_gbps": round(algbw * 2 * (world - 1) / world, 3)}


def _straggler_dict(s: Straggler | None) -> dict[str, Any] | None:
    if s is None:
        return None
    return {"rank": s.rank, "phase": s.phase, "own_ms": _round(s.own_ms), "others_ms": _round(s.others_ms),
            "excess_ms": _round(s.excess_ms), "text": s.describe()}


def nccl_facts(report: Any) -> dict[str, Any] | None:
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


def _round(value: float | None, digits: int = 3) -> float | None:
    return None if value is None else round(value, digits)
