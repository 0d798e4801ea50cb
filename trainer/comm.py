"""Times gradient communication: wraps whichever DDP comm hook is active (plain
all-reduce included) and notes when each bucket is handed over and when its
all-reduce completes (CUDA events on GPU, a monotonic clock on gloo)."""

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
                entry[1] = self._stamp()
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
            entry[1] = self._stamp()
            return f.value()[0]

        return fut.then(done)

    def take(self) -> list[list[Any]]:
        out, self._current = self._current, []
        return out


def summarize(entries: list[list[Any]], step_start: Any, elapsed: Callable[[Any, Any], float]) -> dict[str, float]:
    """Per step: comm_ms (time any all-reduce was in flight: the union of the
    buckets' intervals), exposed_comm_ms (from the last bucket's hand-over, i.e.
    the end of backward compute, to the end of the last all-reduce), buckets, bytes."""
    spans = []
    for start, end, _ in entries:
        if end is None:
            continue
        spans.append((elapsed(step_start, start), elapsed(step_start, end)))
    if not spans:
        return {}
    busy = union_length(spans)
    last_ready = max(s for s, _ in spans)
    last_done = max(e for _, e in spans)
    return {
        "comm_ms": busy,
        "exposed_comm_ms": max(0.0, last_done - last_ready),
        "buckets": float(len(spans)),
        "comm_bytes": float(sum(b for _, _, b in entries)),
    }
