"""Training steps and their phases from the events torch's hooks see, whatever loop made them.

Pure: no torch, no I/O. A `Clock` makes opaque stamps (host times on CPU, CUDA events on a
GPU) and measures between them; this module only orders them. One step is one cycle of the
script's optimizers (every optimizer that steps once per iteration steps once in it), so
gradient accumulation, several optimizers, GradScaler and Lightning's closures all count
one step per iteration.

Events, in the order a plain loop makes them:
    fwd      outermost forward begins            fwd_end  it returned
    bwd      backward reached the model's output  bwd_end  backward's compute ended
    bwd_ret  backward returned (after DDP waited for its all-reduces)
    opt      an optimizer step begins             opt_end  it ended
    eval     a forward without grad begins        eval_end it returned (validation, generation)
    cfwd     a forward with grad inside an optimizer step, after its first (a closure's
             second call and on: LBFGS)
The time between two events belongs to a phase decided by the event that opens it and the
one that closes it (`phase_of`), so the phases of a step always add up to its time. An event
that would close no phase of its own is not stamped (a GPU stamp costs the host ~16 us in a
real script, docs/BENCHMARKS.md): `fwd_end` of a forward with grad (forward runs on to
backward's start: the loss is computed in it), `opt` (the time before it, since backward
returned, and in it are both the optimizer's) and `bwd_ret` of a backward under no_sync. Forwards
without grad, and the time between two of them (a validation loop's own batches and
metrics), are `eval`: apart from the training step's four phases (`eval_ms`, sent only when
some). Inside an optimizer step the time before a closure's forward is the optimizer's (its
line search between calls), not data: `cfwd` closes no data phase.
"""

from __future__ import annotations

import collections
from collections.abc import Callable, Hashable
from typing import Any, Protocol

PHASE_KEYS = {"data": "data_ms", "forward": "forward_ms", "backward": "backward_ms", "optimizer": "optimizer_ms",
              "eval": "eval_ms"}
MAX_SPANS = 64  # bucket spans a record carries at most (protocol.MAX_SPANS): more are merged pairwise


class Clock(Protocol):
    def stamp(self) -> Any: ...
    def elapsed(self, a: Any, b: Any) -> float: ...  # ms from a to b
    def done(self, stamp: Any) -> bool: ...  # the stamp's time is known (a CUDA event has run)
    def sync(self) -> None: ...
    def release(self, stamps: list[Any]) -> None: ...  # stamps read, free for reuse


def phase_of(kind: str, following: str) -> str:
    """The phase of the time between event `kind` and the next event `following`."""
    if kind == "eval" or (kind == "eval_end" and following == "eval"):
        return "eval"
    if kind == "start":
        return "data"
    if following == "cfwd":
        return "optimizer"  # the closure optimizer's own work between its calls
    if kind in ("fwd", "fwd_end", "cfwd"):
        return "forward"  # the model's forward, then the loss computed from its output
    if kind == "bwd" or following == "bwd" or (kind == "bwd_end" and following == "bwd_ret"):
        return "backward"  # compute, then the wait for DDP's last all-reduce
    # between backward and the next forward (the next micro-batch) or in/around optimizer steps
    return "data" if following in ("fwd", "eval") else "optimizer"


class StepTracker:
    """Feed it events; closed steps wait in `pending` until their stamps are readable."""

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self.step = 0  # index of the step being recorded
        self.marks: list[tuple[str, Any, float]] = []  # (event, stamp, samples) of this step
        self.comm: list[tuple[int, list[Any]]] = []  # (marks so far, [hand-over, completion, bytes])
        self.extra: dict[str, Any] = {}  # values for this step's record (profiled, loss...)
        self.pending: collections.deque[tuple[int, list[tuple[str, Any, float]], list[list[Any]],
                                              dict[str, Any]]] = collections.deque()
        self._stepped: set[Hashable] = set()  # optimizers that stepped in this step
        self._cycle: set[Hashable] | None = None  # the optimizers that stepped in every step so far
        self.rates_differ = False  # a step closed with other optimizers than the first one's
        self._last_end: int | None = None  # index in marks of the last opt_end
        self._opt_depth = 0  # GradScaler.step -> optimizer.step: only the outer one counts
        self._closure_calls = 0  # forwards inside this optimizer step (a closure's calls)
        self.seen_opt = False
        # the all-reduce is timed elsewhere (NCCL's own timing): no comm entries come, and
        # each step's exposed communication is taken from backward's events
        self.comm_elsewhere = False

    # --- events -------------------------------------------------------------------------
    def mark(self, kind: str, samples: float = 0.0) -> None:
        if kind == "fwd" and self._opt_depth:
            self._closure_calls += 1
            kind = "cfwd" if self._closure_calls > 1 else kind
        stamp = self.clock.stamp()
        if not self.marks:
            self.marks.append(("start", stamp, 0.0))
        self.marks.append((kind, stamp, samples))

    def drop_samples(self) -> None:
        """The last forward's samples are taken back (its batch turned out unknown)."""
        for i in range(len(self.marks) - 1, -1, -1):
            kind, stamp, samples = self.marks[i]
            if samples:
                self.marks[i] = (kind, stamp, 0.0)
                return

    def add_comm(self, entry: list[Any]) -> None:
        self.comm.append((len(self.marks), entry))

    def opt_begin(self, key: Hashable) -> int | None:
        """An optimizer step begins. Returns the index of a step this closed: the script's
        optimizers went round once more, so the last step ended at the last opt_end."""
        self._opt_depth += 1
        self.seen_opt = True
        if self._opt_depth > 1:
            return None
        self._closure_calls = 0
        closed = None
        if key in self._stepped and self._last_end is not None:
            closed = self._close(self._last_end)
        self._stepped.add(key)
        return closed

    def opt_end(self, key: Hashable) -> int | None:  # noqa: ARG002 - symmetric with opt_begin
        """An optimizer step ended; returns the step index when this ends a step."""
        if self._opt_depth == 0:
            return None
        self._opt_depth -= 1
        if self._opt_depth:
            return None
        self.mark("opt_end")
        self._last_end = len(self.marks) - 1
        if self._cycle is not None and self._stepped >= self._cycle:
            return self._close(self._last_end)
        return None

    def finish(self) -> int | None:
        """The process ends: a step whose optimizers stepped is complete. Once a step's
        optimizers are known, a tail where only others stepped (a WGAN's last generator step
        after its critic's) is no step of its own."""
        if self._last_end is None or self._opt_depth:
            return None
        if self._cycle is not None and not self._stepped >= self._cycle:
            self.rates_differ = True
            return None
        return self._close(self._last_end)

    def restart(self) -> None:
        """The step being recorded starts now (time before it, e.g. a trace being written,
        belongs to no step)."""
        self.marks = [("start", self.clock.stamp(), 0.0)]
        self.comm = [(1, entry) for _, entry in self.comm]

    def resume(self) -> None:
        """Events come again after a pause (cost_ab's bypassed blocks): the step being
        recorded starts now, with no optimizer stepped yet."""
        self.restart()
        self.comm = []
        self.extra = {}
        self._stepped = set()
        self._last_end = None
        self._opt_depth = 0

    @property
    def in_optimizer(self) -> bool:
        """Inside an optimizer step (an LBFGS closure's forwards run here)."""
        return self._opt_depth > 0

    @property
    def cycle(self) -> set[Hashable]:
        """The optimizers of one step, once seen (empty before)."""
        return self._cycle or set()

    def _close(self, end: int) -> int:
        marks, rest = self.marks[: end + 1], self.marks[end + 1:]
        comm = [entry for at, entry in self.comm if at <= end + 1]
        later = [(at - end, entry) for at, entry in self.comm if at > end + 1]
        step = self.step
        self.pending.append((step, marks, comm, self.extra))
        self.rates_differ |= self._cycle is not None and self._stepped != self._cycle
        if self._cycle is None or not self._cycle & self._stepped:
            self._cycle = set(self._stepped) if self._cycle is None else self._cycle
        else:  # those that stepped in every step so far (a teacher stepping in the first one falls out)
            self._cycle &= self._stepped
        self._stepped = set()
        self._last_end = None
        self.marks = [("start", marks[-1][1], 0.0), *rest]
        self.comm = later
        self.extra = {}
        self.step += 1
        return step

    # --- records ------------------------------------------------------------------------
    def ready(self, keep_last: bool = False, flush: bool = False) -> list[dict[str, Any]]:
        """Records of closed steps whose stamps can be read, in step order. `keep_last`
        holds back the latest one (a script's own tick() may still add to it)."""
        if flush:
            self.clock.sync()
        out = []
        while self.pending and not (keep_last and not flush and len(self.pending) == 1):
            step, marks, comm, extra = self.pending[0]
            if not flush and not self.clock.done(marks[-1][1]):
                break
            self.pending.popleft()
            out.append(record(step, marks, comm, extra, self.clock.elapsed, self.comm_elsewhere))
            self.clock.release(read_stamps(marks))
        return out

    @property
    def last_closed(self) -> dict[str, Any] | None:
        """The extra values of the newest step still pending (for a script's own values)."""
        return self.pending[-1][3] if self.pending else None


def read_stamps(marks: list[tuple[str, Any, float]]) -> list[Any]:
    """A closed step's stamps, once each, but its last (the next step's start)."""
    last = marks[-1][1]
    seen: dict[int, Any] = {}
    for _, stamp, _ in marks:
        if stamp is not last:
            seen.setdefault(id(stamp), stamp)
    return list(seen.values())


def record(step: int, marks: list[tuple[str, Any, float]], comm: list[list[Any]], extra: dict[str, Any],
           elapsed: Callable[[Any, Any], float], comm_elsewhere: bool = False) -> dict[str, Any]:
    rec: dict[str, Any] = dict.fromkeys(PHASE_KEYS.values(), 0.0)
    at = offsets(marks, elapsed)
    for i, ((kind, _, _), (following, _, _)) in enumerate(zip(marks, marks[1:])):
        rec[PHASE_KEYS[phase_of(kind, following)]] += at[i + 1] - at[i]
    if not rec["eval_ms"]:
        del rec["eval_ms"]
    rec["step_ms"] = at[-1]
    samples = sum(s for _, _, s in marks)
    if samples:
        rec["samples"] = samples
    if comm:
        rec.update(summarize_comm(comm, marks, elapsed, at))
    elif comm_elsewhere:
        exposed = exposed_from_marks(marks, at)
        if exposed is not None:
            rec["exposed_comm_ms"] = exposed
    for key, value in extra.items():
        if value is not None:
            rec[key] = value
    rec["step"] = step
    return rec


def offsets(marks: list[tuple[str, Any, float]], elapsed: Callable[[Any, Any], float]) -> list[float]:
    """Each mark's time in ms from the step's start: one read per stamp (a CUDA event's
    elapsed_time costs the host ~3 us), a stamp shared by two marks read once."""
    start = marks[0][1]
    out, last, last_at = [0.0], start, 0.0
    for _, stamp, _ in marks[1:]:
        if stamp is not last:
            last, last_at = stamp, elapsed(start, stamp)
        out.append(last_at)
    return out


def summarize_comm(entries: list[list[Any]], marks: list[tuple[str, Any, float]],
                   elapsed: Callable[[Any, Any], float], at: list[float]) -> dict[str, Any]:
    """Buckets, bytes, exposed_comm_ms (communication backward could not hide) and, when
    every bucket's hand-over and completion were stamped, comm_ms (time any all-reduce was
    in flight) and comm_spans (each bucket's [hand-over, completion], ms from the step's
    start, in hand-over order). Exposed: from the last hand-over to the last completion when
    stamped; else from backward's events (`exposed_from_marks`). `at`: the marks' offsets."""
    start = marks[0][1]
    out: dict[str, Any] = {"buckets": float(len(entries)), "comm_bytes": float(sum(e[2] for e in entries))}
    if all(e[0] is not None and e[1] is not None for e in entries):
        spans = [(elapsed(start, e[0]), elapsed(start, e[1])) for e in entries]
        out["comm_ms"] = union_length(spans)
        out["exposed_comm_ms"] = max(0.0, max(b for _, b in spans) - max(a for a, _ in spans))
        out["comm_spans"] = bounded_spans(spans)
        return out
    exposed = exposed_from_marks(marks, at)
    if exposed is not None:
        out["exposed_comm_ms"] = exposed
    return out


def exposed_from_marks(marks: list[tuple[str, Any, float]], at: list[float]) -> float | None:
    """From the end of backward's compute to backward's return, which DDP holds until every
    all-reduce is done (and copied back: a bound a little above the true end): the last
    backward that waited for DDP (a micro-batch under no_sync has no return mark)."""
    end = None
    for i in range(len(marks) - 1, -1, -1):
        kind = marks[i][0]
        if kind == "bwd_ret" and end is None:
            end = at[i]
        elif kind == "bwd_end" and end is not None:
            return max(0.0, end - at[i])
    return None


def bounded_spans(spans: list[tuple[float, float]], limit: int = MAX_SPANS) -> list[list[float]]:
    """The spans for the wire: rounded to the microsecond, neighbours merged pairwise until
    at most `limit` are left (a model with hundreds of buckets still draws as one lane)."""
    while len(spans) > limit:
        spans = [(min(a[0], b[0]), max(a[1], b[1])) for a, b in zip(spans[::2], spans[1::2])] + (
            [spans[-1]] if len(spans) % 2 else [])
    return [[round(a, 3), round(b, 3)] for a, b in spans]


def union_length(spans: list[tuple[float, float]]) -> float:
    total, end = 0.0, float("-inf")
    for a, b in sorted(spans):
        if b > end:
            total += b - max(a, end)
            end = b
    return total
