"""What one GPU stamp costs the host, and its parts, inside a real NCCL job (issue 27).

Each rank keeps its GPU busy (matmuls and an all-reduce a round, NCCL timing on as under
ddptop) and, between rounds, times N calls of each candidate from the main thread: a new
event on torch.cuda.current_stream (the stamp ddptop used until 2026-11-25), ddptop's
CudaClock (events reused once read, the current stream's object remembered), and the parts
(current_stream, a new Event, record, query, elapsed_time). Medians over rounds, us a call.

    TORCH_NCCL_ENABLE_TIMING=1 torchrun --standalone --nproc-per-node 2 bench/investigations/clock_cost.py [--rounds 30]

Question: what does one GPU stamp cost the host inside an NCCL job, and which part?
Answer (2026-11-25 evening, 2x H100): the new CUDA event per stamp: 148 us a call against 65 us
with events reused; ddptop's stamps reuse them since (ddptop.rank.clock.CudaClock).
`bash bench/gpu_check.sh clockcost` runs it.
Quoted in: docs/BENCHMARKS.md, "the cost found (new CUDA events) and cut"; docs/GPU.md,
"2026-11-25 (evening)".
"""

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from ddptop.rank.clock import CudaClock  # noqa: E402


def per_call(fn, n: int) -> float:
    t = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - t) / n * 1e6


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--rounds", type=int, default=30)
    p.add_argument("--calls", type=int, default=50)
    args = p.parse_args()
    dist.init_process_group("nccl")
    rank = dist.get_rank()
    dev = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
    torch.cuda.set_device(dev)
    a = torch.randn(4096, 4096, device=dev)
    grad = torch.randn(25_000_000, device=dev)
    clock = CudaClock(torch, dev)
    held: list = []
    ev0, ev1, ev2 = (torch.cuda.Event(enable_timing=True) for _ in range(3))
    ev0.record()
    ev1.record()
    ev1.synchronize()  # ev0, ev1: done, read by query/elapsed_time; ev2 is re-recorded

    def old_stamp():
        e = torch.cuda.Event(enable_timing=True)
        e.record(torch.cuda.current_stream(dev))
        held.append(e)

    def new_stamp():
        held.append(clock.stamp())

    stream = torch.cuda.current_stream(dev)
    cases = {
        "old stamp (new Event + current_stream + record)": old_stamp,
        "CudaClock.stamp (reused events)": new_stamp,
        "torch.cuda.current_stream(dev)": lambda: torch.cuda.current_stream(dev),
        "torch.cuda.Event(enable_timing=True)": lambda: held.append(torch.cuda.Event(enable_timing=True)),
        "event.record(stream) (same event)": lambda: ev2.record(stream),
        "event.query()": ev1.query,
        "event.elapsed_time()": lambda: ev0.elapsed_time(ev1),
    }
    times: dict[str, list[float]] = {k: [] for k in cases}
    for r in range(args.rounds):
        for _ in range(4):
            a = (a @ a).clamp_(-1, 1)  # ~ms of GPU work queued ahead of the host
        dist.all_reduce(grad)
        for name, fn in cases.items():
            times[name].append(per_call(fn, args.calls))
        clock.release(held[-args.calls:] if r % 2 else [])
        if len(held) > 5000:
            held.clear()
    torch.cuda.synchronize()
    for name, t in times.items():
        print(f"rank {rank} {name:<52} {statistics.median(t):8.1f} us/call (p90 {statistics.quantiles(t, n=10)[-1]:.1f})")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
