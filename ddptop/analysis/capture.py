"""Capture windows, monitor side: parsing `--capture STEP:COUNT`, and
summarising the per-rank Chrome traces a window produced (what ddptop.analysis.trace_analysis
gives per rank, next to ddptop's own comm timer for the same steps). The Capture record is
ddptop.model.capture's (re-exported here). Pure: the traces are read
by ddptop.run.nsys.summarize_capture; finding nsys is ddptop.run.nsys's too."""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from ddptop.analysis.trace_analysis import OPEN_WITH, analyze, intersection_length, union_length
from ddptop.model.capture import Capture
from ddptop.model.figures.stats import median_nonempty

__all__ = ["Capture", "capture_summary", "compare_with_timer", "intersection_length", "parse_capture_spec",
           "summarize_trace", "union_length"]


def parse_capture_spec(spec: str, steps: int) -> tuple[int, int]:
    """`STEP:COUNT` -> (start, count); ValueError with a one-line reason."""
    start, sep, count = spec.partition(":")
    if not sep or not start.isdigit() or not count.isdigit():
        raise ValueError(f"--capture expects STEP:COUNT (e.g. 10:3), got {spec!r}")
    first, n = int(start), int(count)
    if n < 1:
        raise ValueError(f"--capture {spec}: COUNT must be at least 1")
    if first + n > steps:
        raise ValueError(f"--capture {spec}: steps {first}-{first + n - 1} are past the run's {steps} steps")
    return first, n


def summarize_trace(trace: dict[str, Any], top: int = 10) -> dict[str, Any]:
    """One rank's torch.profiler trace -> what the window shows (ddptop.analysis.trace_analysis)."""
    return analyze(trace, top=top)


def capture_summary(ranks: dict[str, Any]) -> dict[str, Any]:
    """A capture's summary from its per-rank entries (`analyze` of each rank's trace, or why
    there is none): the ranks' mean comm time, and what opens the traces."""
    comm = [r["comm_ms"] for r in ranks.values() if r.get("comm_ms") is not None]
    out: dict[str, Any] = {"ranks": ranks, "comm_ms_mean": round(sum(comm) / len(comm), 3) if comm else None}
    if any("source" in r for r in ranks.values()):
        out["open_with"] = OPEN_WITH
    return out


def compare_with_timer(summary: dict[str, Any], records: dict[int, list[dict[str, float]]],
                       steps: range) -> None:
    """Put ddptop's own comm timer for the window's steps next to what the trace saw, per rank
    (`timer_comm_ms`, and `timer_vs_trace` = timer / trace): the live comm figure checked
    against the profiler on exactly the same steps: the trace's all-reduce kernels (what the
    timer times; the script's other collectives are `other_comm_ms`), and only where the
    timer timed every step of the window (`timer_steps` says how many it did). The timer runs
    from DDP's hand-over of a bucket to the end of its all-reduce, so where the host launches
    late (one GPU: the kernel starts ~0.4 ms after the bucket is ready) it is also compared
    with the trace's span from each collective's call to its kernel's end (`timer_vs_call`)."""
    for rank, recs in records.items():
        entry = summary.get("ranks", {}).get(str(rank))
        window = [r for r in recs if int(r.get("step", -1)) in steps and "comm_ms" in r]
        if entry is None or not window:
            continue
        ours = sum(r["comm_ms"] for r in window)
        entry["timer_comm_ms"] = round(ours, 3)
        entry["timer_steps"] = len(window)
        # like with like: the timer times all-reduces, on every step of the window or it is no match
        trace = entry.get("allreduce_ms", entry.get("comm_ms"))
        if entry.get("allreduce_ms") is not None and entry.get("comm_ms"):
            entry["other_comm_ms"] = round(max(0.0, entry["comm_ms"] - entry["allreduce_ms"]), 3)
        if trace and len(window) == len(steps):
            entry["timer_vs_trace"] = round(ours / trace, 3)
        _compare_hook(entry, window, ours)
        if entry.get("comm_call_ms") and len(window) == len(steps):
            entry["timer_vs_call"] = round(ours / entry["comm_call_ms"], 3)
    for key in ("timer_vs_trace", "timer_vs_call", "timer_vs_trace_hook"):
        ratios = [r[key] for r in summary.get("ranks", {}).values() if key in r]
        if ratios:
            summary[f"{key}_mean"] = round(sum(ratios) / len(ratios), 3)


BEFORE = 10  # unprofiled steps compared with a window's


def perturbation(records: dict[int, list[dict[str, float]]], steps: range, warmup: int = 0) -> dict[str, Any] | None:
    """What the profiler did to the steps it recorded: each rank's median step over the window
    against its median over the up to BEFORE unprofiled steps just before it (the warmup step
    and any step marked `profiled` left out), then the mean over ranks; None where either side
    has no step. `pct`: how much slower the profiled steps ran (issue 45)."""
    first = steps.start - warmup
    inside: list[float] = []
    before: list[float] = []
    for recs in records.values():
        ms = [r["step_ms"] for r in recs if int(r.get("step", -1)) in steps and "step_ms" in r]
        clean = [r["step_ms"] for r in recs if first - BEFORE <= int(r.get("step", -1)) < first
                 and "step_ms" in r and not r.get("profiled")]
        if ms and clean:
            inside.append(median_nonempty(sorted(ms)))
            before.append(median_nonempty(sorted(clean)))
    if not inside:
        return None
    profiled, unprofiled = sum(inside) / len(inside), sum(before) / len(before)
    return {"profiled_ms": round(profiled, 3), "unprofiled_ms": round(unprofiled, 3),
            "pct": round(100.0 * (profiled / unprofiled - 1.0), 1) if unprofiled > 0 else None,
            "ranks": len(inside), "warmup_steps": warmup}


def discount_late(cross: dict[str, Any] | None, said: dict[str, Any] | None, steps: int,
                  unprofiled: str | None) -> None:
    """Who-waits against what the profiler itself added: where the late rank's lateness a step
    is within the profiled steps' excess over the unprofiled ones, the verdict says so rather
    than naming a straggler the profiler made; `unprofiled` is the run's own straggler finding
    on unprofiled steps (None: none), said either way (issue 45)."""
    if not cross or cross.get("late_rank") is None or not said or steps < 1:
        return
    added = said["profiled_ms"] - said["unprofiled_ms"]
    late = cross["late_ms"] / steps
    rank = cross["late_rank"]
    if unprofiled is not None:
        cross["verdict"] += f"; in the unprofiled steps too: {unprofiled}"
    elif late <= max(added, 0.0):
        cross["verdict"] = (f"rank {rank} late by {late:.1f} ms a step: within the profiler's own "
                            f"+{added:.1f} ms a step; unprofiled, no straggler")
        cross["profiler_made"] = True
    else:
        cross["verdict"] += (f" ({late:.1f} ms a step, more than the profiler's own +{max(added, 0.0):.1f}; "
                             "the unprofiled steps name no straggler)")


def _compare_hook(entry: dict[str, Any], window: list[dict[str, float]], ours: float) -> None:
    """Under a comm hook: the timer's hook span (`hook_ms`, hand-over to the hook's future
    done; `comm_ms` is then NCCL's own collective time) against the trace's hook span (the
    hook's work and its collectives, ddptop.analysis.hook_work): `timer_vs_trace_hook`. Where
    the ranks sent no hook_ms (no NCCL timing) the timer's comm_ms is that span itself, so it
    is what is compared with the trace's hook span."""
    hooked = [r for r in window if "hook_ms" in r]
    span = (entry.get("hook") or {}).get("span_ms")
    if hooked:  # the hook's own work beside the collectives (cast, divide, decompress)
        timer_hook = sum(r["hook_ms"] for r in hooked)
        entry["timer_hook_ms"] = round(timer_hook, 3)
        entry["hook_extra_ms"] = round(sum(r["hook_ms"] - r["comm_ms"] for r in hooked), 3)
        if span:
            entry["timer_vs_trace_hook"] = round(timer_hook / span, 3)
    elif span:
        entry["timer_hook_ms"] = round(ours, 3)
        entry["timer_vs_trace_hook"] = round(ours / span, 3)


def nsys_window_at(captures: Iterable[Capture], last_step: int) -> Capture | None:
    """The nsys capture whose window starts or ends where the ranks stand (`last_step` is the
    last step they reported; a window's last step is reported only after cudaProfilerStop
    returns): a stall there is nsys starting, or writing what it recorded."""
    for cap in captures:
        if cap.profiler == "nsys" and cap.start <= last_step + 1 < cap.start + cap.count:
            return cap
    return None


def nsys_files_by_rank(paths: list[Path]) -> dict[int, list[str]]:
    """nsys outputs (named nsys_rank<RANK>...) grouped by rank."""
    out: dict[int, list[str]] = {}
    for path in paths:
        m = re.match(r"nsys_rank(\d+)", path.name)
        if m:
            out.setdefault(int(m.group(1)), []).append(str(path))
    return out
