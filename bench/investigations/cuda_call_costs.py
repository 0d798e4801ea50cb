"""Host cost of the calls ddptop's rank-side layer makes per step and per bucket, on a GPU
(world size 1, NCCL): microseconds per call, median of 5 rounds of 500 calls.

    python bench/investigations/cuda_call_costs.py

Question: what does each call the rank-side layer makes per step and per bucket cost the host?
Answer (2026-11-24, 1x H100): the Python comm hook is the cost: 41 us a call, 77 us with one
`.then`, 99 us with the stamping one; the default GPU path since keeps DDP's C++ all-reduce.
Quoted in: docs/BENCHMARKS.md, "where the last 3.5% went, and the fix".
"""

from __future__ import annotations

import os
import statistics
import time

import torch
import torch.distributed as dist


def per_call(fn, n: int = 500, rounds: int = 5) -> float:
    for _ in range(50):
        fn()
    torch.cuda.synchronize()
    out = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        out.append((time.perf_counter() - t0) / n * 1e6)
        torch.cuda.synchronize()
    return statistics.median(out)


def main() -> None:
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29581")
    dist.init_process_group("nccl", rank=0, world_size=1, device_id=torch.device("cuda:0"))
    dev = torch.device("cuda:0")
    t = torch.zeros(1 << 16, device=dev)
    pg = dist.distributed_c10d._get_default_group()
    opts = dist.AllreduceOptions()
    opts.reduceOp = dist.ReduceOp.AVG
    stream = torch.cuda.current_stream(dev)

    def stamp():
        e = torch.cuda.Event(enable_timing=True)
        e.record(torch.cuda.current_stream(dev))
        return e

    def done(f):
        stamp()
        return f.value()[0]

    rows = {
        "tensor add_ (one kernel, baseline)": lambda: t.add_(1.0),
        "dist.all_reduce(async).get_future()": lambda: dist.all_reduce(t, op=dist.ReduceOp.AVG, async_op=True).get_future(),
        "pg.allreduce().get_future()": lambda: pg.allreduce([t], opts).get_future(),
        "pg.allreduce().get_future().then(first)": lambda: pg.allreduce([t], opts).get_future().then(lambda f: f.value()[0]),
        "pg.allreduce().get_future().then(stamp)": lambda: pg.allreduce([t], opts).get_future().then(done),
        "Event(enable_timing).record(current_stream(dev))": stamp,
        "Event(enable_timing).record(stream)": lambda: torch.cuda.Event(enable_timing=True).record(stream),
        "Event().record(stream) (no timing)": lambda: torch.cuda.Event().record(stream),
        "torch.cuda.current_stream(dev)": lambda: torch.cuda.current_stream(dev),
        "torch.cuda.current_stream()": lambda: torch.cuda.current_stream(),
    }
    ev = stamp()
    torch.cuda.synchronize()
    rows["event.query() (done)"] = ev.query
    for name, fn in rows.items():
        print(f"{per_call(fn):9.1f} us  {name}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
