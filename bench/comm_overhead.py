"""Where the comm-timing overhead comes from: one torchrun job trains ViT-L/32 under
DDP with each way of running the gradient all-reduce, back to back and interleaved,
timed like the reference recipe (synchronize, perf_counter, batches made on the GPU):

  builtin   DDP's own C++ all-reduce (no comm hook): what the reference recipe runs
  pyhook    torch's Python allreduce_hook, untimed
  timed     ddptop's CommTimer around allreduce_hook (CUDA events per bucket, two callbacks)
  fused     CommTimer.allreduce_hook: the same timing with one callback, division kernel + sum
  avg       CommTimer.allreduce_hook averaging inside NCCL (ReduceOp.AVG, no division kernel): the trainer's default
  host      as avg, but host clock stamps instead of CUDA events (wrong times; isolates the events' cost)
  pyavg     untimed all-reduce with ReduceOp.AVG (the floor of any Python hook)
  start     a CUDA event at hand-over only (host clock at completion)
  end       a CUDA event at completion only (host clock at hand-over)

  torchrun --standalone --nproc-per-node=2 bench/comm_overhead.py --steps 30 --rounds 2
Prints one line per (config, variant, round) and a table of medians from rank 0.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel as DDP
from torchvision.models import vit_l_32

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from trainer.comm import CommTimer, summarize  # noqa: E402

CONFIGS = {"baseline": {"bucket_cap_mb": 2000}, "overlap": {"bucket_cap_mb": 100, "static_graph": True,
                                                              "gradient_as_bucket_view": True}}


def plain_avg(state, bucket):  # unannotated: DDP checks hook annotations
    fut = dist.all_reduce(bucket.buffer(), op=dist.ReduceOp.AVG, async_op=True).get_future()
    return fut.then(lambda f: f.value()[0])


def partial_hook(event_at: str, keep: list):
    """All-reduce with a CUDA event at one end of it only, to tell which one costs."""
    def stamp(kind: str):
        if kind != event_at:
            return time.perf_counter()
        ev = torch.cuda.Event(enable_timing=True)
        ev.record()
        return ev

    def hook(state, bucket):  # unannotated: DDP checks hook annotations
        start = stamp("start")
        fut = dist.all_reduce(bucket.buffer(), op=dist.ReduceOp.AVG, async_op=True).get_future()

        def done(f):
            keep.append((start, stamp("end")))
            return f.value()[0]

        return fut.then(done)

    return hook


def run(variant: str, config: dict, steps: int, warmup: int, local: int, rank: int) -> float:
    torch.manual_seed(0)
    model = DDP(vit_l_32(weights=None).cuda(local), device_ids=[local], **config)
    timer = None
    if variant == "pyhook":
        model.register_comm_hook(None, default_hooks.allreduce_hook)
    elif variant == "pyavg":
        model.register_comm_hook(None, plain_avg)
    elif variant == "timed":
        timer = CommTimer(cuda=True)
        model.register_comm_hook(None, timer.wrap(default_hooks.allreduce_hook))
    elif variant in ("start", "end"):
        keep: list = []
        model.register_comm_hook(None, partial_hook(variant, keep))
    elif variant in ("fused", "avg", "host"):
        timer = CommTimer(cuda=variant != "host", average_in_nccl=variant != "fused")
        model.register_comm_hook(None, timer.allreduce_hook)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    crit = nn.CrossEntropyLoss()
    gen = torch.Generator(device=f"cuda:{local}").manual_seed(rank)
    times = []
    for _ in range(warmup + steps):
        x = torch.randn(32, 3, 224, 224, device=local, generator=gen)
        y = torch.randint(0, 1000, (32,), device=local, generator=gen)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        start = torch.cuda.Event(enable_timing=True)
        start.record()
        loss = crit(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
        if timer is not None:  # read the step's comm figures as the trainer does
            entries = timer.take()
            if timer.cuda:
                summarize(entries, start, start, lambda a, b: a.elapsed_time(b))
    del model, opt
    torch.cuda.empty_cache()
    m = times[warmup:]
    return len(m) / sum(m)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--warmup", type=int, default=8)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--variants", default="builtin,pyhook,pyavg,timed,fused,avg,host")
    p.add_argument("--configs", default="baseline,overlap")
    a = p.parse_args()
    rank, local = int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local)
    dist.init_process_group("nccl")
    results: dict[tuple[str, str], list[float]] = {}
    for rnd in range(a.rounds):
        for cfg in a.configs.split(","):
            for variant in a.variants.split(","):
                rate = run(variant, CONFIGS[cfg], a.steps, a.warmup, local, rank)
                results.setdefault((cfg, variant), []).append(rate)
                if rank == 0:
                    print(f"round {rnd} {cfg:<9} {variant:<8} {rate:.3f} steps/s", flush=True)
    if rank == 0:
        print(f"{'config':<9} {'variant':<8} steps/s (median of {a.rounds})  vs builtin")
        for (cfg, variant), rates in results.items():
            ref = statistics.median(results[(cfg, "builtin")]) if (cfg, "builtin") in results else None
            med = statistics.median(rates)
            print(f"{cfg:<9} {variant:<8} {med:.3f}  {med / ref:.3f}" if ref else f"{cfg:<9} {variant:<8} {med:.3f}")
        print("RESULT " + json.dumps({f"{c}/{v}": r for (c, v), r in results.items()}))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
