"""Timing the gradient all-reduce of the script's own DistributedDataParallel.

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

from collections.abc import Callable
from typing import Any

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

    def hook(self, state, bucket):  # unannotated: DDP checks the annotations it is given
        buf = bucket.buffer()
        entry: list[Any] = [self._stamp() if self.timed else None, None, buf.numel() * buf.element_size()]
        self._add(entry)
        if self.user is not None:
            user_state, user_hook = self.user
            fut = user_hook(user_state, bucket)
            if not self.timed:
                return fut

            def user_done(f):
                entry[1] = self._stamp()
                return f.value()

            return fut.then(user_done)
        fut = self._allreduce(buf)
        if not self.timed:
            return fut.then(_first)

        def done(f):
            # a CUDA future's callback runs with the communication's stream current: the
            # event marks when the all-reduce finished on the GPU
            entry[1] = self._stamp()
            return f.value()[0]

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


def _first(f):
    return f.value()[0]


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
