"""What NCCL's own timing costs per collective (ddptop's default comm measurement on a GPU).

With `TORCH_NCCL_ENABLE_TIMING` each collective gets one more CUDA event (its start), and
ddptop's completion hook (ddptop.rank.comm.NcclTimes) is called once per collective on NCCL's
hook thread. Both are per collective, so their cost is measured per collective, in one
process: two NCCL groups over the same ranks, one with timing and ddptop's hook, one without,
used in alternating blocks in a random order; paired per round, so drift cancels. A
step's cost is then this times its collectives (DDP: one per bucket).

    torchrun --standalone --nproc-per-node 2 bench/investigations/nccl_timing_cost.py [--rounds 60] [--ops 400]
        [--numel 262144] [--python-us 20]

--python-us: pure-Python work on the main thread between collectives (a training loop's own
host work), so the hook thread's GIL handoffs show where they would hurt. Prints one table
(rank 0) and a JSON line `NCCL_TIMING_COST {...}`.

Question: what do TORCH_NCCL_ENABLE_TIMING and ddptop's completion hook cost per collective?
Answer: this script has not run on a GPU (docs/BENCHMARKS.md, "measured inside one run", says
why); bench/bill_of_costs.py measured the same pair since: +36 us an
all-reduce (2026-11-27, 2x H200). `bash bench/gpu_check.sh ncclcost` runs it.
Quoted in: docs/BENCHMARKS.md, "Against plain torchrun: `ddptop cost` and the bill of costs".
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from ddptop.analysis.cost_ab import median_ci  # noqa: E402
from ddptop.rank.comm import NcclTimes  # noqa: E402


def spin_python(us: float) -> None:
    until = time.perf_counter() + us / 1e6
    while time.perf_counter() < until:
        pass


def block(group, x, ops: int, python_us: float) -> float:
    """us per collective over `ops` all-reduces, launch to GPU end."""
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(ops):
        dist.all_reduce(x, group=group)
        if python_us:
            spin_python(python_us)
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / ops * 1e6


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--rounds", type=int, default=60)
    p.add_argument("--ops", type=int, default=400)
    p.add_argument("--numel", type=int, default=262144, help="elements per all-reduce (fp32)")
    p.add_argument("--python-us", type=float, default=20.0)
    a = p.parse_args()
    os.environ.pop("TORCH_NCCL_ENABLE_TIMING", None)
    local = int(os.environ.get("LOCAL_RANK", "0"))
    torch.cuda.set_device(local)
    dist.init_process_group("nccl", device_id=torch.device("cuda", local))
    ranks = list(range(dist.get_world_size()))
    # NCCL reads TORCH_NCCL_ENABLE_TIMING when a group is made: one group with it, one without
    plain = dist.new_group(ranks)
    os.environ["TORCH_NCCL_ENABLE_TIMING"] = "1"
    timed = dist.new_group(ranks)
    os.environ.pop("TORCH_NCCL_ENABLE_TIMING")
    x = torch.randn(a.numel, device="cuda")
    times = NcclTimes()
    c10d = __import__("torch._C._distributed_c10d", fromlist=["OpType"])
    times._allreduce = c10d.OpType.ALLREDUCE
    timed._register_on_completion_hook(times._on_done)
    for g in (plain, timed):
        block(g, x, 50, a.python_us)
    rng = random.Random(1)
    rows = []
    for _ in range(a.rounds):
        arms = ["plain", "timed"]
        rng.shuffle(arms)
        got = {arm: block(plain if arm == "plain" else timed, x, a.ops, a.python_us) for arm in arms}
        rows.append(got)
    time.sleep(0.3)  # the hook thread reports within ~0.1 s
    diff = median_ci([r["timed"] - r["plain"] for r in rows])
    ratio = median_ci([r["plain"] / r["timed"] for r in rows])
    out = {"rank": dist.get_rank(), "device": torch.cuda.get_device_name(), "torch": torch.__version__,
           "nccl": ".".join(map(str, torch.cuda.nccl.version())), "numel": a.numel, "ops": a.ops,
           "rounds": a.rounds, "python_us": a.python_us,
           "plain_us_per_op": statistics.median(r["plain"] for r in rows),
           "timed_us_per_op": statistics.median(r["timed"] for r in rows),
           "extra_us_per_op": diff.as_dict(), "ratio": ratio.as_dict(),
           "hook_reports": len(times._done), "hook_errors": times.errors,
           "reported_ms_median": statistics.median(d for _, d in times._done) if times._done else None}
    gathered = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, out)
    if dist.get_rank() == 0:
        for o in gathered:
            d = o["extra_us_per_op"]
            print(f"rank {o['rank']}: {o['numel'] * 4 / 1e6:.1f} MB all-reduce, {o['python_us']:g} us Python between: "
                  f"plain {o['plain_us_per_op']:.1f} us/op, timed+hook {o['timed_us_per_op']:.1f} us/op, "
                  f"extra {d['median']:+.2f} us/op [{d['lo']:+.2f}, {d['hi']:+.2f}] n={d['n']}; "
                  f"hook saw {o['hook_reports']} ({o['hook_errors']} errors), NCCL's own median {o['reported_ms_median']} ms")
        print("NCCL_TIMING_COST " + json.dumps(gathered))
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
