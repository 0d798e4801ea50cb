"""Times gradient communication: wraps whichever DDP comm hook is active (plain
all-reduce included) and notes when each bucket is handed over and when its
all-reduce completes (CUDA events on GPU, a monotonic clock on gloo).

Hand-over is stamped every step. On GPU the completion stamp (an event recorded
in the future's callback, on the stream that waits for NCCL) is what costs
(bench/comm_overhead.py: 1.5-3% of a ViT-L step), so the trainer asks for it
only on some steps (`time_completion`); exposed comm needs only the hand-over."""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from typing import Any

import torch

from ddptop.capture import union_length


class CommTimer:
    def __init__(self, cuda: bool, average_in_nccl: bool | None = None) -> None:
        self.cuda = cuda
        # NCCL averages inside the all-reduce (ReduceOp.AVG): no separate division
        # kernel over the whole bucket, which DDP's own C++ path fuses into its copy
        self.average_in_nccl = cuda if average_in_nccl is None else average_in_nccl
        self._current: list[list[Any]] = []  # [start, end, bytes] per bucket this step
        self.time_completion = True  # stamp when each all-reduce completes (set per step)

    def _stamp(self) -> Any:
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()  # on the stream the hook/callback runs on
            return event
        return time.perf_counter()

    def wrap(self, hook: Callable[[Any, Any], torch.futures.Future]) -> Callable[[Any, Any], torch.futures.Future]:
        @functools.wraps(hook)  # DDP checks the hook's annotations
        def timed_hook(state: Any, bucket: Any) -> torch.futures.Future:
            buf = bucket.buffer()
            entry: list[Any] = [self._stamp(), None, buf.numel() * buf.element_size()]
            self._current.append(entry)
            fut = hook(state, bucket)

            def done(f: torch.futures.Future) -> Any:
                # For CUDA futures this runs with the communication's stream current,
                # so the event marks when the all-reduce finished on the GPU.
                entry[1] = self._stamp() if self.time_completion else None
                return f.value()

            return fut.then(done)

        return timed_hook

    def allreduce_hook(self, state, bucket):  # unannotated: DDP rejects annotations it does not expect
        """Plain all-reduce (as torch's allreduce_hook: average, then sum across ranks),
        timed with one callback instead of wrapping torch's hook in a second one."""
        import torch.distributed as dist

        buf = bucket.buffer()
        entry: list[Any] = [self._stamp(), None, buf.numel() * buf.element_size()]
        self._current.append(entry)
        if self.average_in_nccl:
            fut = dist.all_reduce(buf, op=dist.ReduceOp.AVG, async_op=True).get_future()
        else:
            buf.div_(dist.get_world_size())
            fut = dist.all_reduce(buf, async_op=True).get_future()

        def done(f: torch.futures.Future) -> Any:
            entry[1] = self._stamp() if self.time_completion else None
            return f.value()[0]

        return fut.then(done)

    def take(self) -> list[list[Any]]:
        out, self._current = self._current, []
        return out


def summarize(entries: list[list[Any]], step_start: Any, backward_end: Any,
              elapsed: Callable[[Any, Any], float]) -> dict[str, float]:
    """Per step: buckets, bytes, exposed_comm_ms (comm that backward could not hide: from the
    last bucket's hand-over, i.e. the end of backward compute, to the end of the last
    all-reduce) and, when every completion was stamped, comm_ms (time any all-reduce was in
    flight: the union of the buckets' intervals). Without completion stamps the exposed part
    ends when backward() returned, which DDP holds until every all-reduce is done (and its
    result copied back: a bound a little above the true end)."""
    if not entries:
        return {}
    spans = [(elapsed(step_start, s), None if e is None else elapsed(step_start, e)) for s, e, _ in entries]
    last_ready = max(s for s, _ in spans)
    out = {"buckets": float(len(entries)), "comm_bytes": float(sum(b for _, _, b in entries))}
    if all(e is not None for _, e in spans):
        out["comm_ms"] = union_length(spans)  # type: ignore[arg-type]
        out["exposed_comm_ms"] = max(0.0, max(e for _, e in spans) - last_ready)  # type: ignore[type-var]
    else:
        out["exposed_comm_ms"] = max(0.0, elapsed(step_start, backward_end) - last_ready)
    return out
