"""One step laid out in time, from its record: data, forward, backward's compute, the wait for
the last all-reduce (exposed comm), optimizer, and the all-reduce in flight drawn under
backward, so how much of the communication backward hides is seen. With the buckets' own
spans (hand-over and completion of each, from the rank side) each bucket is drawn where it
was; without them, the all-reduce's total is placed at the end of backward. Pure: a record
in, spans (in ms from the step's start, and in terminal columns) out."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from ddptop.model.figures.stats import merge_spans, span_length

# The step's own lane, in the order the phases happen.
LANE = ("data", "forward", "backward", "exposed", "optimizer")


@dataclass(frozen=True)
class Span:
    what: str  # a LANE name, "comm" (all-reduce in flight), "bucket", or "other" (the step's unaccounted rest)
    start_ms: float
    end_ms: float

    @property
    def ms(self) -> float:
        return self.end_ms - self.start_ms


@dataclass(frozen=True)
class StepTimeline:
    step: int
    step_ms: float
    lane: tuple[Span, ...]  # data, forward, backward compute, exposed comm, optimizer, other
    comm: Span | None  # the all-reduce in flight (union of the buckets), None if not timed
    hidden_ms: float | None  # the part of `comm` that ran under backward's compute
    # each bucket from when the one before it completed (or its own hand-over, if later) to
    # its completion: the time the all-reduce worked on it, buckets going out one at a time
    buckets: tuple[Span, ...] = ()
    in_flight_ms: float = 0.0  # time any all-reduce was in flight (the union of the buckets' spans)

    @property
    def exposed_ms(self) -> float:
        """The all-reduce's in-flight time that backward's compute did not hide: in flight
        minus hidden, so hidden + exposed = in flight on every step (issue 46)."""
        return max(0.0, self.in_flight_ms - (self.hidden_ms or 0.0))

    @property
    def wait_ms(self) -> float:
        """The lane's wait after backward's compute (exposed_comm_ms): the all-reduce's
        exposed part plus DDP's own work after it (copying the buckets back), as the rank
        measured it; not the same figure as exposed_ms."""
        return next((s.ms for s in self.lane if s.what == "exposed"), 0.0)

    def columns(self, span: Span, width: int) -> tuple[int, int]:
        """Where a span falls in a bar of `width` columns: [start, end), at least one column
        for any span of positive length."""
        scale = width / self.step_ms if self.step_ms > 0 else 0.0
        start = min(width - 1, max(0, round(span.start_ms * scale)))
        end = min(width, max(start + (1 if span.ms > 0 else 0), round(span.end_ms * scale)))
        return start, end


def _ms(rec: Mapping[str, float], key: str) -> float:
    value = rec.get(key)
    return max(float(value), 0.0) if value is not None else 0.0


def step_timeline(rec: Mapping[str, float],
                  spans: Sequence[tuple[float, float]] = ()) -> StepTimeline | None:
    """The layout of one step record, or None when it has no step time.

    backward_ms runs from the end of forward to backward's return, which DDP holds until the
    last bucket's all-reduce is done: its tail is the exposed wait (exposed_comm_ms). The
    all-reduce's in-flight time (comm_ms, a union over buckets) ends where backward does,
    unless `spans` (the buckets' [hand-over, completion], ms from the step's start) say
    where each bucket was."""
    step_ms = rec.get("step_ms")
    if step_ms is None or step_ms <= 0:
        return None
    data, fwd, bwd = _ms(rec, "data_ms"), _ms(rec, "forward_ms"), _ms(rec, "backward_ms")
    exposed = min(_ms(rec, "exposed_comm_ms"), bwd)
    parts = {"data": data, "forward": fwd, "backward": bwd - exposed, "exposed": exposed,
             "optimizer": _ms(rec, "optimizer_ms")}
    lane, t = [], 0.0
    for what in LANE:
        if parts[what] > 0:
            lane.append(Span(what, t, t + parts[what]))
        t += parts[what]
    if step_ms > t:
        lane.append(Span("other", t, float(step_ms)))
    comm = hidden = None
    if spans:
        return _with_buckets(int(rec.get("step", -1)), float(max(step_ms, t)), tuple(lane), spans,
                             data + fwd + bwd - exposed)
    if rec.get("comm_ms") is not None:
        bwd_end = data + fwd + bwd
        start = max(data + fwd, bwd_end - _ms(rec, "comm_ms"))
        comm = Span("comm", start, bwd_end)
        hidden = max(0.0, comm.ms - exposed)
    return StepTimeline(int(rec.get("step", -1)), float(max(step_ms, t)), tuple(lane), comm, hidden,
                        in_flight_ms=comm.ms if comm is not None else 0.0)


def _with_buckets(step: int, step_ms: float, lane: tuple[Span, ...], spans: Sequence[tuple[float, float]],
                  compute_end: float) -> StepTimeline:
    ordered = sorted(spans, key=lambda s: s[1])  # by completion: the order they went out
    buckets, done = [], float("-inf")
    for handed, completed in ordered:
        buckets.append(Span("bucket", max(handed, min(done, completed)), completed))
        done = completed
    comm = Span("comm", min(a for a, _ in spans), max(b for _, b in spans))
    union = merge_spans(spans)
    hidden = sum(max(0.0, min(b, compute_end) - a) for a, b in union)
    return StepTimeline(step, step_ms, lane, comm, hidden, tuple(buckets), span_length(union))
