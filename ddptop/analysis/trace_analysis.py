"""What one torch.profiler (Kineto) Chrome trace says about a rank: the GPU window, busy and
idle time (idle per stream split as Holistic Trace Analysis does: host wait, kernel wait,
other), compute / communication / memory time and their overlaps, per-kernel statistics and
the steps covered. CPU-only traces (gloo) get the same figures from CPU ops.

Events are classified by what the profiler labels them, never by guessing from names: a
kernel is communication when its args name a collective (torch adds 'Collective name',
'In msg nelems', 'Process Group Name'... to NCCL kernels), when it runs under a `nccl:*`
record_function (GPU annotation, or launched inside the CPU one), or when its name is in
NCCL's own kernel namespace (`ncclKernel_*`, `ncclDevKernel_*`); gpu_memcpy / gpu_memset
are memory; every other GPU activity is compute (a `...GemmWithEpilogueBroadcast...` GEMM
is compute). Pure: takes parsed JSON, no I/O (ddptop.run.trace_files reads the files)."""

from __future__ import annotations

import math
import re
from collections import defaultdict
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from ddptop.analysis.intervals import (  # noqa: F401 - re-exported
    Cover,
    Span,
    intersect,
    intersection_length,
    length,
    merge,
    outermost,
    union_length,
)
from ddptop.model.figures.stats import percent

KERNEL_CATS = frozenset({"kernel"})
MEMORY_CATS = frozenset({"gpu_memcpy", "gpu_memset", "memcpy", "memset"})
GPU_ANNOTATION_CATS = frozenset({"gpu_user_annotation"})
LAUNCH_CATS = frozenset({"cuda_runtime", "cuda_driver", "runtime", "driver"})
CPU_CATS = frozenset({"cpu_op", "user_annotation", "operator"})
# The args torch's profiler puts on a collective's kernel (and on record_param_comms).
COLLECTIVE_ARGS = ("Collective name", "In msg nelems", "Out msg nelems", "Process Group Name",
                   "Process Group Ranks")
# record_function / op names the distributed backends give their collectives (CPU traces).
COMM_PREFIXES = ("nccl:", "gloo:", "c10d::", "c10d:", "mpi:", "ucc:", "xccl:")
# The record_functions a GPU backend wraps a collective's launch in (ProcessGroupNCCL: `nccl:all_reduce`).
# Not `c10d::*`: that op also launches the backend's own bookkeeping (copies, fills), which is not
# communication.
GPU_COMM_PREFIXES = ("nccl:", "xccl:")
NCCL_KERNEL = re.compile(r"^nccl\w*Kernel")  # NCCL's kernel namespace: a label, not a guess
STEP = re.compile(r"^(?:ddptop_step_(\d+)|ProfilerStep\s*#\s*(\d+))$")
# HTA's default `consecutive_kernel_delay` (its docs say ns; it compares trace times, in us).
KERNEL_WAIT_US = 30.0
OPEN_WITH = "open a trace in https://ui.perfetto.dev (drop the .json.gz in) or run `ddptop trace DIR`"


# ---------------------------------------------------------------------------- events


@dataclass(frozen=True, slots=True)  # slots: a large trace has hundreds of thousands
class Activity:
    """One GPU activity (kernel, memcpy, memset) or, on a CPU trace, one CPU op."""

    name: str
    kind: str  # compute | comm | memory
    start: float  # us
    end: float
    device: Any
    stream: Any
    launch: float | None = None  # when the CPU launched it (host-wait split)
    call: float | None = None  # comm: when the CPU called the collective (c10d::*, nccl:*) that launched it
    comm_by: str = ""  # args | annotation | name (how it was recognised as communication)
    group: str = ""  # comm named by its args: process group and collective ("0/allreduce")
    thread: tuple[Any, Any] | None = None  # (pid, tid) of the CPU thread that launched it

    @property
    def dur(self) -> float:
        return self.end - self.start


def _num(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    value = float(value)
    return value if math.isfinite(value) else None


def _timed(events: Iterable[Any]) -> Iterator[tuple[dict[str, Any], float, float]]:
    """Complete events ('X') with numeric ts/dur as (event, start, end), one at a time."""
    for e in events:
        if not isinstance(e, dict) or e.get("ph") != "X":
            continue
        ts, dur = _num(e.get("ts")), _num(e.get("dur"))
        if ts is None or dur is None or dur < 0:
            continue
        yield e, ts, ts + dur


def _args(e: dict[str, Any]) -> dict[str, Any]:
    args = e.get("args")
    return args if isinstance(args, dict) else {}


def names_collective(e: dict[str, Any]) -> bool:
    args = _args(e)
    return any(k in args for k in COLLECTIVE_ARGS)


def is_comm_name(name: str) -> bool:
    return name.startswith(COMM_PREFIXES)


def gpu_activities(events: Iterable[Any]) -> list[Activity]:
    """The trace's GPU activities, each classified compute / comm / memory."""
    timed = _timed(events)
    launches: dict[Any, tuple[Any, Any, float]] = {}
    cpu_comm: dict[tuple[Any, Any], list[Span]] = defaultdict(list)
    cpu_calls: dict[tuple[Any, Any], list[Span]] = defaultdict(list)  # any collective call on the CPU
    gpu_comm: dict[tuple[Any, Any], list[Span]] = defaultdict(list)
    gpu: list[tuple[dict[str, Any], float, float, str]] = []
    for e, s, t in timed:
        cat = str(e.get("cat", "")).lower()
        name = str(e.get("name", ""))
        if cat in KERNEL_CATS or cat in MEMORY_CATS:
            gpu.append((e, s, t, cat))
        elif cat in LAUNCH_CATS:
            corr = _args(e).get("correlation")
            if corr is not None and (corr not in launches or cat == "cuda_runtime"):
                launches[corr] = (e.get("pid"), e.get("tid"), s)
        elif cat in GPU_ANNOTATION_CATS:
            if name.startswith(GPU_COMM_PREFIXES):
                gpu_comm[(e.get("pid"), e.get("tid"))].append((s, t))
        elif cat in CPU_CATS and (is_comm_name(name) or names_collective(e)):
            cpu_calls[(e.get("pid"), e.get("tid"))].append((s, t))
            if name.startswith(GPU_COMM_PREFIXES):
                cpu_comm[(e.get("pid"), e.get("tid"))].append((s, t))
    under_gpu, under_cpu, calls = Cover(gpu_comm), Cover(cpu_comm), Cover(cpu_calls)
    out = []
    for e, s, t, cat in gpu:
        args = _args(e)
        name = str(e.get("name", "?"))
        launch = launches.get(args.get("correlation"))
        kind, by = "compute", ""
        if cat in MEMORY_CATS:
            kind = "memory"
        elif names_collective(e):
            kind, by = "comm", "args"
        elif under_gpu.contains((e.get("pid"), e.get("tid")), s, t) or (
                launch is not None and under_cpu.contains((launch[0], launch[1]), launch[2])):
            kind, by = "comm", "annotation"
        elif NCCL_KERNEL.match(name):
            kind, by = "comm", "name"
        call = calls.span_at((launch[0], launch[1]), launch[2]) if kind == "comm" and launch else None
        group = f"{args.get('Process Group Name', '')}/{args.get('Collective name', '')}" if by == "args" else ""
        out.append(Activity(name, kind, s, t, args.get("device", e.get("pid")), args.get("stream", e.get("tid")),
                            launch=launch[2] if launch else None, comm_by=by, call=call[0] if call else None,
                            group=group, thread=(launch[0], launch[1]) if launch else None))
    return out


def cpu_activities(events: Iterable[Any]) -> list[Activity]:
    """On a trace without GPU activity: CPU ops as compute, collectives (gloo:*, c10d::*,
    record_param_comms...) as communication; ops inside a collective on the same thread
    belong to it."""
    ops, comm = [], []
    for e, s, t in _timed(events):
        cat = str(e.get("cat", "")).lower()
        if cat not in CPU_CATS:
            continue
        name = str(e.get("name", "?"))
        if STEP.match(name):
            continue
        if is_comm_name(name) or names_collective(e):
            comm.append(Activity(name, "comm", s, t, e.get("pid"), e.get("tid"),
                                 comm_by="args" if names_collective(e) else "annotation"))
        elif cat != "user_annotation":  # annotations (forward, optimizer...) wrap ops, they are not work
            ops.append(Activity(name, "compute", s, t, e.get("pid"), e.get("tid")))
    inside = Cover(_by_thread(comm))
    return comm + [a for a in ops if not inside.contains((a.device, a.stream), a.start, a.end)]


def _by_thread(acts: Iterable[Activity]) -> dict[tuple[Any, Any], list[Span]]:
    out: dict[tuple[Any, Any], list[Span]] = defaultdict(list)
    for a in acts:
        out[(a.device, a.stream)].append((a.start, a.end))
    return out


def step_spans(events: Iterable[Any]) -> tuple[dict[int, float], str]:
    """Step number -> CPU duration (ms), from `ddptop_step_N` or `ProfilerStep#N` markers."""
    steps: dict[int, float] = {}
    marker = ""
    for e, s, t in _timed(events):
        if str(e.get("cat", "")).lower() in GPU_ANNOTATION_CATS:
            continue
        m = STEP.match(str(e.get("name", "")))
        if m:
            n = int(m.group(1) or m.group(2))
            steps[n] = max(steps.get(n, 0.0), (t - s) / 1000.0)
            marker = marker or ("ddptop_step_N" if m.group(1) else "ProfilerStep#N")
    return steps, marker


# ---------------------------------------------------------------------------- summary


def stream_idle(acts: Sequence[Activity], kernel_wait_us: float = KERNEL_WAIT_US) -> dict[str, float]:
    """HTA's idle split for one stream: the gap before each activity is host wait when the CPU
    launched it after the previous one ended, kernel wait when shorter than `kernel_wait_us`,
    else other (e.g. waiting on an event from another stream)."""
    out = {"host_wait": 0.0, "kernel_wait": 0.0, "other": 0.0}
    ordered = sorted(acts, key=lambda a: a.start)
    for prev, cur in zip(ordered, ordered[1:]):
        gap = cur.start - prev.end
        if gap <= 0:
            continue
        out[idle_cause(gap, cur.launch is not None and cur.launch > prev.end, kernel_wait_us)] += gap
    return out


def idle_cause(gap: float, launched_late: bool, kernel_wait_us: float = KERNEL_WAIT_US) -> str:
    """Why the GPU (or a stream) sat idle for `gap` us, as HTA tells it: the host launched
    the next work only after the idle began (host wait), a short gap between kernels
    (kernel wait), or else (e.g. waiting on another stream)."""
    if launched_late:
        return "host_wait"
    return "kernel_wait" if gap < kernel_wait_us else "other"


def kernel_stats(acts: Iterable[Activity], top: int) -> list[dict[str, Any]]:
    """Per name: count, total, min, max, mean, std (sample, as HTA/pandas) in ms, by total."""
    by_name: dict[str, list[Activity]] = defaultdict(list)
    for a in acts:
        by_name[a.name].append(a)
    rows: list[dict[str, Any]] = []
    for name, group in by_name.items():
        durs = [a.dur / 1000.0 for a in group]
        n, total = len(durs), sum(durs)
        mean = total / n
        std = math.sqrt(sum((d - mean) ** 2 for d in durs) / (n - 1)) if n > 1 else 0.0
        rows.append({"name": name[:240], "kind": group[0].kind, "count": n, "ms": round(total, 3),
                     "min_ms": round(min(durs), 4), "max_ms": round(max(durs), 4),
                     "mean_ms": round(mean, 4), "std_ms": round(std, 4)})
    rows.sort(key=lambda r: -r["ms"])
    return rows[:top]


def _ms(us: float) -> float:
    return round(us / 1000.0, 3)


def trace_events(trace: Any) -> tuple[list[Any], dict[str, Any] | None]:
    """A parsed Chrome trace (an object with traceEvents, or the bare event list) -> its events
    and distributedInfo; ValueError when it is not a trace."""
    events = trace.get("traceEvents") if isinstance(trace, dict) else trace
    if not isinstance(events, list):
        raise ValueError("not a Chrome trace (no traceEvents list)")
    meta = trace.get("distributedInfo") if isinstance(trace, dict) else None
    return events, meta if isinstance(meta, dict) else None


def activities(events: Sequence[Any]) -> tuple[list[Activity], str]:
    """The GPU activities, or on a trace without any, the CPU ops; and which (gpu | cpu)."""
    acts = gpu_activities(events)
    return (acts, "gpu") if acts else (cpu_activities(events), "cpu")


def analyze(trace: Any, top: int = 10) -> dict[str, Any]:
    """One rank's trace -> its summary, JSON-ready, times in ms. ValueError when it is not a trace."""
    events, meta = trace_events(trace)
    acts, source = activities(events)
    return summarize(events, meta, acts, source, top)


def summarize(events: Sequence[Any], meta: dict[str, Any] | None, acts: list[Activity], source: str,
              top: int = 10) -> dict[str, Any]:
    """The summary of one rank's trace from its events and `activities`."""
    steps, marker = step_spans(events)
    out: dict[str, Any] = {"source": source}
    if meta is not None:
        for key in ("rank", "world_size", "backend"):
            if key in meta:
                out[key] = meta[key]
    out.update({"steps": sorted(steps), "step_ms": [round(steps[s], 3) for s in sorted(steps)],
                "step_marker": marker or None})
    if not acts:
        out["note"] = "no GPU kernels or CPU ops in this trace"
        return out
    spans = {k: merge((a.start, a.end) for a in acts if a.kind == k) for k in ("compute", "comm", "memory")}
    busy = merge((a.start, a.end) for a in acts)
    begin, end = busy[0][0], busy[-1][1]
    window, busy_us = end - begin, length(busy)
    comm_compute = length(intersect(spans["comm"], spans["compute"]))
    comm_memory = length(intersect(spans["comm"], spans["memory"]))
    comm_us = length(spans["comm"])
    out.update({
        "window_ms": _ms(window), "busy_ms": _ms(busy_us),
        "idle_ms": _ms(window - busy_us), "idle_pct": percent(window - busy_us, window),
    })
    for kind in ("compute", "comm", "memory"):
        if kind == "memory" and source == "cpu":
            out["memory_ms"] = out["memory_pct"] = None
            continue
        out[f"{kind}_ms"] = _ms(length(spans[kind]))
        out[f"{kind}_pct"] = percent(length(spans[kind]), window)
    out.update({
        "overlap_ms": _ms(comm_compute), "overlap_pct": percent(comm_compute, window),
        "comm_memory_overlap_ms": _ms(comm_memory), "comm_memory_overlap_pct": percent(comm_memory, window),
        "comm_hidden_pct": percent(comm_compute, comm_us),  # HTA's comp_comm_overlap
        # from the CPU's call of each collective to its kernel's end: what a timer started at the
        # hand-over sees, launch latency included (a host-bound rank's GPU idles meanwhile)
        "comm_call_ms": _ms(union_length((a.start if a.call is None else min(a.call, a.start), a.end)
                                         for a in acts if a.kind == "comm"))
        if any(a.call is not None for a in acts if a.kind == "comm") else None,
        # the collectives ddptop's comm timer times (DDP's gradients, a comm hook's): all-reduces;
        # a script's other collectives (HF's token-count all_gather, Lightning's broadcasts) apart
        "allreduce_ms": _ms(length(merge((a.start, a.end) for a in acts if a.kind == "comm" and is_all_reduce(a)))),
        "counts": {k: sum(1 for a in acts if a.kind == k) for k in ("compute", "comm", "memory")},
        "comm_by": _count(a.comm_by for a in acts if a.kind == "comm"),
    })
    if source == "gpu":
        out["devices"] = sorted({a.device for a in acts}, key=str)
        out["streams"] = _streams(acts)
    out["top"] = kernel_stats(acts, top)
    return out


OTHER_COLLECTIVES = ("allgather", "broadcast", "reduce", "alltoall", "send", "recv", "barrier", "gather", "scatter")


def is_all_reduce(a: Activity) -> bool:
    """Communication of an all-reduce: the collective its args name ("0/allreduce") or its
    kernel's name (ncclDevKernel_AllReduce_Sum_f32_RING_LL) says so, or names no other one (a
    memset NCCL launches inside the call)."""
    text = (a.group or a.name).lower().replace("_", "")
    return "allreduce" in text or not any(other in text for other in OTHER_COLLECTIVES)


def _count(values: Iterable[str]) -> dict[str, int]:
    out: dict[str, int] = defaultdict(int)
    for v in values:
        out[v] += 1
    return dict(out)


def _streams(acts: Sequence[Activity]) -> list[dict[str, Any]]:
    by_stream: dict[tuple[Any, Any], list[Activity]] = defaultdict(list)
    for a in acts:
        by_stream[(a.device, a.stream)].append(a)
    rows = []
    for (device, stream), group in by_stream.items():
        idle = stream_idle(group)
        busy = merge((a.start, a.end) for a in group)
        rows.append({"device": device, "stream": stream, "kernels": len(group), "busy_ms": _ms(length(busy)),
                     "idle_ms": _ms(sum(idle.values())), "host_wait_ms": _ms(idle["host_wait"]),
                     "kernel_wait_ms": _ms(idle["kernel_wait"]), "other_wait_ms": _ms(idle["other"]),
                     "kinds": _count(a.kind for a in group)})
    rows.sort(key=lambda r: -r["busy_ms"])
    return rows
