"""Is a rank host-bound or device-bound? From its torch.profiler trace, as Holistic Trace
Analysis (0.5.0) defines the measures:
- queue length (HTA's TraceCounters): per stream, +1 when a CUDA runtime call (cudaLaunchKernel,
  cudaLaunchKernelExC, cuLaunchKernel, cudaMemcpyAsync, cudaMemsetAsync) enqueues a GPU
  activity, -1 when that activity starts; summarised over the series' change points (mean, max);
- launch delay (HTA's cuda_kernel_launch_stats): activity start - end of its runtime call, >= 0;
- the GPU's idle time (outside every stream's work) by cause: waiting on the host (the work
  after the gap was launched after the gap began), short gaps between kernels (< 30 us), other
  (waiting on another stream, an event, a synchronisation).
Pure: takes parsed events and activities (ddptop.analysis.trace_analysis)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from typing import Any

from ddptop.analysis.intervals import merge
from ddptop.analysis.trace_analysis import (
    KERNEL_CATS,
    KERNEL_WAIT_US,
    MEMORY_CATS,
    Activity,
    _num,
    idle_cause,
)

LAUNCHES = frozenset({"cudaLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernel", "cudaMemcpyAsync",
                      "cudaMemsetAsync", "hipLaunchKernel", "hipExtModuleLaunchKernel", "hipMemcpyAsync",
                      "hipMemsetAsync", "hipMemcpyWithStream"})
DELAY_LAUNCHES = LAUNCHES - {"cuLaunchKernel"}  # HTA's launch stats leave the driver's launches out
HOST_BOUND_PCT = 10.0  # the GPU waited on the host this share of its window: host-bound


def _launch_pairs(events: Iterable[Any]) -> list[tuple[Any, float, float, float, bool]]:
    """(stream, launch start, launch end, activity start, whether HTA's launch delay counts it)
    of each GPU activity a launch call of HTA's set enqueued (matched by correlation)."""
    launches: dict[Any, tuple[float, float, bool]] = {}
    gpu: list[tuple[Any, Any, float]] = []
    for e in events:
        if not isinstance(e, dict) or e.get("ph") != "X":
            continue
        ts, dur = _num(e.get("ts")), _num(e.get("dur"))
        raw = e.get("args")
        args: dict[str, Any] = raw if isinstance(raw, dict) else {}
        corr = args.get("correlation")
        if ts is None or dur is None or dur < 0 or corr is None:
            continue
        cat = str(e.get("cat", "")).lower()
        if e.get("name") in LAUNCHES and cat in ("cuda_runtime", "cuda_driver", "runtime", "driver"):
            launches[corr] = (ts, ts + dur, e.get("name") in DELAY_LAUNCHES)
        elif cat in KERNEL_CATS or cat in MEMORY_CATS:
            gpu.append((corr, args.get("stream", e.get("tid")), ts))
    return [(stream, launches[corr][0], launches[corr][1], start, launches[corr][2])
            for corr, stream, start in gpu if corr in launches]


def queue_lengths(pairs: Sequence[tuple[Any, float, float, float, bool]]) -> dict[Any, dict[str, float]]:
    """Per stream: HTA's queue length series summarised (mean and max over its change points)."""
    changes: dict[Any, list[tuple[float, int]]] = defaultdict(list)
    for stream, launch, _, start, _ in pairs:
        changes[stream] += [(launch, 1), (start, -1)]
    out = {}
    for stream, points in changes.items():
        level, series = 0, []
        for _, step in sorted(points, key=lambda p: (p[0], -p[1])):
            level += step
            series.append(level)
        out[stream] = {"mean": round(sum(series) / len(series), 2), "max": float(max(series)),
                       "kernels": float(len(series) // 2)}
    return out


def gpu_idle(acts: Sequence[Activity], kernel_wait_us: float = KERNEL_WAIT_US) -> dict[str, float]:
    """The GPU's idle time (no stream busy) by cause, us."""
    out = {"host_wait": 0.0, "kernel_wait": 0.0, "other": 0.0}
    busy = merge((a.start, a.end) for a in acts)
    launched: dict[float, float] = {}  # start -> when the earliest work starting then was launched
    for a in acts:
        if a.launch is not None:
            launched[a.start] = min(a.launch, launched.get(a.start, a.launch))
    for (_, gap_start), (gap_end, _) in zip(busy, busy[1:]):
        gap = gap_end - gap_start
        # host wait: nothing was queued when the GPU went idle
        out[idle_cause(gap, launched.get(gap_end, gap_start) > gap_start, kernel_wait_us)] += gap
    return out


def host_or_device(events: Iterable[Any], acts: Sequence[Activity]) -> dict[str, Any] | None:
    """Queue length, launch delay, GPU idle by cause and the verdict in one line (None on a
    CPU-only trace)."""
    if not acts:
        return None
    pairs = _launch_pairs(events)
    queues = queue_lengths(pairs)
    delays = sorted(max(0.0, start - end) for _, _, end, start, counted in pairs if counted)
    idle = gpu_idle(acts)
    busy = merge((a.start, a.end) for a in acts)
    window = busy[-1][1] - busy[0][0]
    out: dict[str, Any] = {"window_ms": _ms(window), **{f"idle_{k}_ms": _ms(v) for k, v in idle.items()},
                           "host_wait_pct": round(100.0 * idle["host_wait"] / window, 1) if window > 0 else None,
                           "launches": len(pairs)}
    if queues:
        main = max(queues, key=lambda s: (queues[s]["kernels"], str(s)))
        out.update({"queue_stream": main, "queue_mean": queues[main]["mean"], "queue_max": queues[main]["max"],
                    "queues": {str(s): {"mean": q["mean"], "max": q["max"]} for s, q in queues.items()}})
    if delays:
        out.update({"launch_delay_mean_ms": _ms(sum(delays) / len(delays), 4),
                    "launch_delay_p50_ms": _ms(delays[len(delays) // 2], 4), "launch_delay_max_ms": _ms(delays[-1], 4)})
    out["verdict"] = _verdict(out)
    return out


def _verdict(b: dict[str, Any]) -> str:
    measures = []
    if "queue_mean" in b:
        measures.append(f"queue {b['queue_mean']:.1f} (max {b['queue_max']:.0f}) on stream {b['queue_stream']}")
    if "launch_delay_mean_ms" in b:
        measures.append(f"launch delay {b['launch_delay_mean_ms']:.2f} ms")
    how = f" ({', '.join(measures)})" if measures else ""
    pct = b["host_wait_pct"]
    if pct is None:
        return "no GPU window"
    if pct >= HOST_BOUND_PCT:
        return (f"host-bound: the GPU waited on the host {b['idle_host_wait_ms']:.1f} ms ({pct:.0f}%) of its "
                f"{b['window_ms']:.1f} ms window{how}")
    return (f"device-bound: the GPU waited on the host only {b['idle_host_wait_ms']:.1f} ms ({pct:.0f}%) of its "
            f"{b['window_ms']:.1f} ms window{how}")


def _ms(us: float, digits: int = 3) -> float:
    return round(us / 1000.0, digits)
