"""A comm hook's own work in a trace: what DDP's comm hook does besides the collective (bf16:
cast, divide, the decompressing copy; PowerSGD: its matmuls and QR), so communication under a
hook is reported as the collective's kernels plus this work, and ddptop's timer (hand-over to
the hook's future done) is compared with the same span.

The profiler does not mark a Python comm hook; torch runs it where the bucket became ready: on
the thread that calls the collective, inside the same outermost CPU op (autograd's
`evaluate_function: ...AccumulateGrad` of the bucket's last gradient), after DDP's own bucket
copy (`torch::distributed::reducer::*`); a CUDA future's callback (the decompress) runs there
too, on a pool stream. So a bucket's hook work is what that op launched (GPU) or ran (CPU)
outside DDP's reducer ranges and outside the collective's own call. A callback a CPU backend
runs on its own thread later (gloo) is not seen. Pure."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from typing import Any

from ddptop.analysis.intervals import Cover, Span, merge, union_length
from ddptop.analysis.trace_analysis import (
    CPU_CATS,
    Activity,
    _timed,
    is_comm_name,
    names_collective,
)

# DDP's own work where a bucket becomes ready: the gradient's accumulation, the bucket copy
DDP_OWN = ("torch::distributed::reducer::", "torch.distributed.ddp.reducer::", "torch::autograd::AccumulateGrad")
Thread = tuple[Any, Any]


def _cpu_spans(events: Iterable[Any]) -> tuple[dict[Thread, list[Span]], dict[Thread, list[Span]],
                                               dict[Thread, list[Span]]]:
    """Per thread: every CPU op (not annotations: a step's range holds the whole backward on a
    CPU rank), DDP's own ops, the collectives' calls."""
    ops: dict[Thread, list[Span]] = defaultdict(list)
    reducer: dict[Thread, list[Span]] = defaultdict(list)
    calls: dict[Thread, list[Span]] = defaultdict(list)
    for e, s, t in _timed(events):
        cat = str(e.get("cat", "")).lower()
        if cat not in CPU_CATS:
            continue
        key, name = (e.get("pid"), e.get("tid")), str(e.get("name", ""))
        if cat != "user_annotation":
            ops[key].append((s, t))
        if name.startswith(DDP_OWN):
            reducer[key].append((s, t))
        elif is_comm_name(name) or names_collective(e) or name == "record_param_comms":
            calls[key].append((s, t))
    return ops, reducer, calls


def hook_work(events: Sequence[Any], acts: Sequence[Activity], source: str) -> dict[str, Any] | None:
    """The hook's own work (`work_ms`, union of its kernels or ops), its whole span per bucket
    (`span_ms`: first to last of the bucket's hook work and collectives, union), the buckets,
    and the work's top ops; None when no collective has work of its own around it."""
    ops, own_spans, calls = _cpu_spans(events)
    outer, own, inside_call = Cover(ops), Cover(own_spans), Cover(calls)
    first_call: dict[tuple[Thread, Span], float] = {}  # (thread, outer op) -> its first collective call
    for key, spans in calls.items():
        for s, t in spans:
            o = outer.span_at(key, s, t)
            if o is not None and o != (s, t):
                first_call[(key, o)] = min(s, first_call.get((key, o), s))
    if not first_call:
        return None
    # the hook starts after DDP's own work in that op (accumulation, bucket copy)
    floor = {(key, o): max((t for s, t in own_spans.get(key, ()) if o[0] <= s and t <= fc), default=o[0])
             for (key, o), fc in first_call.items()}
    groups: dict[tuple[Thread, Span], list[Activity]] = defaultdict(list)  # (thread, outer op) -> work
    comm_of: dict[tuple[Thread, Span], list[Activity]] = defaultdict(list)
    for a in acts:
        thread, at = _where(a, source)
        if thread is None or at is None:
            continue
        o = outer.span_at(thread, at)
        if o is None or (thread, o) not in first_call:
            continue
        if a.kind == "comm":
            comm_of[(thread, o)].append(a)
        elif (at >= floor[(thread, o)] and not own.contains(thread, at) and not inside_call.contains(thread, at)
              and not (source == "cpu" and a.start <= first_call[(thread, o)] <= a.end)):
            groups[(thread, o)].append(a)
    work = [a for group in groups.values() for a in group]
    if not work:
        return None
    spans = [(min(a.start for a in g + comm_of[k]), max(a.end for a in g + comm_of[k])) for k, g in groups.items()]
    by_name: dict[str, float] = defaultdict(float)
    for a in work:
        by_name[a.name] += a.dur
    top = sorted(by_name.items(), key=lambda kv: -kv[1])[:4]
    return {"work_ms": _ms(union_length((a.start, a.end) for a in work)), "span_ms": _ms(_length(spans)),
            "buckets": len(groups), "count": len(work),
            "top": [{"name": n[:120], "ms": _ms(us)} for n, us in top]}


def _where(a: Activity, source: str) -> tuple[Thread | None, float | None]:
    """The thread and time an activity was issued from: its launch (GPU) or itself (CPU op)."""
    if source == "gpu":
        return a.thread, a.launch
    return (a.device, a.stream), a.start


def _length(spans: list[Span]) -> float:
    return sum(e - s for s, e in merge(spans))


def _ms(us: float) -> float:
    return round(us / 1000.0, 3)


def describe_hook(entry: dict[str, Any]) -> str | None:
    """One rank's comm hook in a line (`ddptop trace`, the captures tab), from its summary."""
    hook = entry.get("hook")
    if not hook:
        return None
    ops = ", ".join(f"{t['name']} {t['ms']:.2f}" for t in hook["top"][:3])
    line = (f"comm hook: own work {hook['work_ms']:.2f} ms ({ops}); with its collectives "
            f"{hook['span_ms']:.2f} ms over {hook['buckets']} buckets")
    if "timer_vs_trace_hook" in entry:
        line += f"; ddptop's hook timer {entry['timer_hook_ms']:.2f} ms ({entry['timer_vs_trace_hook']:.3f} of that)"
    return line
