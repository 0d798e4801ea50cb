"""Timing the gradient all-reduce of the script's own DistributedDataParallel.

On a GPU, when neither the script nor the run sets a comm hook, DDP keeps its own C++
all-reduce (a Python hook per bucket cost ~3.5% of a ViT-L step on one H100): each step's
exposed communication comes from backward's events, and with `nccl_timing` `NcclTimes`
reads NCCL's own timing of each collective (TORCH_NCCL_ENABLE_TIMING, set by ddptop's
launcher: CUDA events around the kernels) from the process group's completion hook, so
nothing runs in Python per bucket on the thread that launches backward. Otherwise (gloo,
a comm hook):

DDP takes one comm hook per module, so ddptop registers one `CommTimer.hook` per DDP
module: around the hook the script registers (bf16, PowerSGD, its own; whenever it
registers it, before or after ours), or a plain all-reduce when it registers none (averaged
inside NCCL with ReduceOp.AVG, as DDP's C++ path fuses its division: measured free on H200,
docs/BENCHMARKS.md). On a step that is timed, each bucket's hand-over and completion are
stamped (CUDA events on GPU: the completion event costs 1.5-3% of a ViT-L step, so a GPU
times one step in `every`); on the others only its bytes are noted, and the step tracker
takes exposed communication from backward's own events.
"""

from __future__ import annotations

import collections
import importlib
import os
from collections.abc import Callable
from typing import Any

from ddptop.rank.kernel_clock import KernelClock
from ddptop.rank.quiet_stderr import call_without

DEPRECATION = "OnCompletion hook will be deprecated"
KNOWN_COMPRESSING = ("fp16_compress_hook", "bf16_compress_hook", "fp16_compress_wrapper", "bf16_compress_wrapper")


class CommTimer:
    def __init__(self, dist: Any, stamp: Callable[[], Any], add: Callable[[list[Any]], None],
                 average_in_nccl: bool, group: Any = None) -> None:
        self._dist = dist
        self._stamp = stamp
        self._add = add  # the step tracker's add_comm
        self.average_in_nccl = average_in_nccl
        self.timed = True  # stamp this step's buckets (set per step)
        self.user: tuple[Any, Callable[..., Any]] | None = None  # (state, hook) the script registered
        self._allreduce = _direct_allreduce(dist, group, average_in_nccl)
        self._queue = _engine_queue()

    def _raise_later(self, wait: Callable[[], Any]) -> bool:
        """A failed all-reduce raises in backward as DDP's own would: the future's `wait`, a C
        method, runs as an autograd callback after DDP's (queued at the first bucket), so the
        script sees the error as it is, from no Python frame of ddptop's. False where it cannot
        be queued (not inside backward): the error then reaches DDP through the bucket's future."""
        if self._queue is None:
            return False
        try:
            self._queue(wait)
        except Exception:  # noqa: BLE001
            return False
        return True

    def hook(self, state, bucket):  # unannotated: DDP checks the annotations it is given
        buf = bucket.buffer()
        entry = [self._stamp() if self.timed else None, None, buf.numel() * buf.element_size()]
        self._add(entry)
        if self.user is not None:
            user_state, user_hook = self.user
            fut = user_hook(user_state, bucket)
            if not self.timed:
                return fut
            first = False
        else:
            fut, first = self._allreduce(buf), True
        kept = buf if self._raise_later(fut.wait) else None
        if not self.timed:
            return fut.then(lambda f: _result(kept, first, f))

        def done(f):
            # a CUDA future's callback runs with the communication's stream current: the
            # event marks when the all-reduce finished on the GPU
            entry[1] = self._stamp()
            return _result(kept, first, f)

        return fut.then(done)

    def compressing(self) -> float | None:
        """1.0 when gradients travel compressed this step (PowerSGD only after its warm-up)."""
        if self.user is None:
            return None
        state, hook = self.user
        if getattr(hook, "__name__", "") in KNOWN_COMPRESSING:
            return 1.0
        if hasattr(state, "start_powerSGD_iter") and hasattr(state, "iter"):
            return float(state.iter >= state.start_powerSGD_iter)
        return None

    def hook_name(self) -> str:
        if self.user is None:
            return "allreduce (ddptop's timed)"
        return getattr(self.user[1], "__qualname__", None) or repr(self.user[1])[:80]


def _result(kept, first, f):
    """The reduced bucket (the all-reduce's first tensor, or what the script's hook gave).
    Where the all-reduce failed (a peer died) and its future raises later (`kept`:
    CommTimer._raise_later), the bucket as it was: an error raised in a callback reaches the
    script rewrapped by torch, the callback's frame in it ("Got the following error when
    running the callback: ... At: ddptop/rank/comm.py")."""
    if kept is None:
        value = f.value()
    else:
        try:
            value = f.value()
        except Exception:  # noqa: BLE001 - raised as it is by the all-reduce's own future
            return kept
    return value[0] if first else value


def _engine_queue() -> Callable[[Callable[[], Any]], None] | None:
    try:
        return importlib.import_module("torch").autograd.Variable._execution_engine.queue_callback
    except (ImportError, AttributeError):
        return None


def _direct_allreduce(dist: Any, group: Any, average: bool) -> Callable[[Any], Any]:
    """The bucket's all-reduce as a future, through the process group's own (C++) call with
    options made once: `dist.all_reduce`'s Python checks cost ~35 us a bucket, every step,
    on the host that launches backward. Falls back to `dist.all_reduce` where the group
    does not take that call."""
    op = dist.ReduceOp.AVG if average else dist.ReduceOp.SUM
    try:
        pg = group if group is not None else dist.distributed_c10d._get_default_group()
        world = pg.size()
        opts = dist.AllreduceOptions()
        opts.reduceOp = op
        if not callable(getattr(pg, "allreduce", None)):
            raise TypeError("no allreduce")
    except Exception:  # noqa: BLE001 - a private layout changed: the public call does the same

        def public(buf: Any) -> Any:
            if not average:
                buf.div_(dist.get_world_size(group))
            return dist.all_reduce(buf, op=op, group=group, async_op=True).get_future()

        return public

    def direct(buf: Any) -> Any:
        if not average:
            buf.div_(world)
        return pg.allreduce([buf], opts).get_future()

    return direct


class NcclTimes:
    """NCCL's own start-to-end time of each all-reduce on one process group, as its
    completion hook reports them (on NCCL's hook thread, up to ~0.1 s after the kernel
    ended: the watchdog's poll). Steps take the all-reduces the host issued before they
    closed (`take`), once a later one has been reported (`reported_after`)."""

    def __init__(self) -> None:
        self._done: collections.deque[tuple[float, float]] = collections.deque(maxlen=1 << 16)
        self.latest = float("-inf")  # host time the last reported collective was issued
        self.errors = 0
        self._allreduce: Any = None
        # the kernels' own time where ddptop's NCCL profiler plugin runs (ddptop.rank.kernel_clock);
        # NCCL's event span (launch latency included) for an all-reduce it has no record of
        self.clock: KernelClock | None = None
        self._comm: int | None = None  # the group's communicator, as the plugin names it

    @classmethod
    def attach(cls, dist: Any, pg: Any) -> NcclTimes | None:
        """Hooked to `pg`, or None where NCCL does not time (TORCH_NCCL_ENABLE_TIMING unset
        when the group was made: its hook would then abort the communicator), the backend is
        not NCCL, this torch has no completion hooks, or the group has a hook already."""
        if os.environ.get("TORCH_NCCL_ENABLE_TIMING", "0").strip().lower() not in ("1", "true", "yes", "y", "on"):
            return None
        try:
            if str(dist.get_backend(pg)) != "nccl":
                return None
            register = pg._register_on_completion_hook
            times = cls()
            c10d: Any = importlib.import_module("torch._C._distributed_c10d")  # no OpType in its stubs
            times._allreduce = c10d.OpType.ALLREDUCE
            # torch says, once and on fd 2, that this hook will be deprecated: not the script's line
            call_without(lambda: register(times._on_done), DEPRECATION)
        except Exception:  # noqa: BLE001 - no such hook, or one is set: the Python hook times instead
            return None
        return times

    def _on_done(self, info: Any) -> None:  # NCCL's hook thread: must never raise
        try:
            if self._allreduce is not None and info.op_type != self._allreduce:
                return
            start = info.time_started.total_seconds()  # steady clock: time.monotonic()'s
            self._done.append((start, info.active_duration.total_seconds() * 1000.0))
            self.latest = start
        except Exception:  # noqa: BLE001
            self.errors += 1

    def reported_after(self, t: float) -> bool:
        return self.latest > t

    def count_until(self, until: float) -> int:
        """All-reduces issued up to host time `until` that are reported and not yet taken."""
        n = 0
        for start, _ in self._done:
            if start > until:
                break
            n += 1
        return n

    def take(self, until: float, kernel: bool = False) -> list[float]:
        """Durations (ms) of the all-reduces issued up to host time `until`, oldest first:
        the kernels' own (`kernel`: the plugin stamped them) or NCCL's spans."""
        out = []
        done = self._done
        clock = self.clock if kernel else None
        if clock is not None:
            clock.drain()
        while done and done[0][0] <= until:
            issued, span_ms = done.popleft()
            if clock is not None:
                kernel_ms, self._comm = clock.kernel_ms(issued, self._comm)
                span_ms = span_ms if kernel_ms is None else kernel_ms
            out.append(span_ms)
        return out
