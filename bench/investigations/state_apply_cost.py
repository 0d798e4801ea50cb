"""What RunState.apply costs per step frame as the world grows: the hub's sink applies every
frame on the hub's one thread, so this bounds the frames/s one core can take at N ranks.

    .venv/bin/python bench/investigations/state_apply_cost.py [64 256 1024]

Question: how many frames/s can the hub's one thread apply to RunState at N ranks?
Answer (2026-11-25, the 2-core VM): 31 / 103 / 422 us per one-record frame at 64 / 256 / 1,024
ranks before the model fix (the straggler check walked every rank per frame), 5 / 5 / 7 us after.
Quoted in: docs/BENCHMARKS.md, "A thousand ranks on a hundred nodes: node 0's hub".
"""

from __future__ import annotations

import sys
import time

from ddptop.model.config import RunConfig
from ddptop.model.state import RunState
from ddptop.wire import protocol


def record(step: int) -> dict[str, float]:
    return {"step": step, "t": time.time(), "step_ms": 50.0, "data_ms": 2.5, "forward_ms": 15.0,
            "backward_ms": 27.5, "optimizer_ms": 5.0, "comm_ms": 12.5, "samples": 32}


def cost(n: int, warm: int = 20, measured: int = 4) -> float:
    """Seconds per one-record frame at `n` ranks (8 a node), after `warm` steps of every rank."""
    s = RunState(run_id="x", config=RunConfig(), world_size=n, nnodes=max(n // 8, 1))
    for r in range(n):
        s.apply(protocol.Hello(rank=r, local_rank=r % 8, world_size=n, host="h", pid=1, token="", node=r // 8),
                time.time())
    for step in range(warm):
        for r in range(n):
            s.apply(protocol.Steps(rank=r, records=[record(step)]), time.time())
    t0 = time.perf_counter()
    for step in range(warm, warm + measured):
        for r in range(n):
            s.apply(protocol.Steps(rank=r, records=[record(step)]), time.time())
    return (time.perf_counter() - t0) / (n * measured)


if __name__ == "__main__":
    for n in [int(a) for a in sys.argv[1:]] or [64, 256, 1024]:
        c = cost(n)
        print(f"{n} ranks: {c * 1e6:.0f} us per one-record frame -> {1 / c:.0f} frames/s on one core")
