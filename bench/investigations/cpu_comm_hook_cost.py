"""What a Python DDP comm hook costs a CPU (gloo) step, against DDP's own C++ all-reduce
(issue 42: on the 2-core VM the rank-side layer cost ~1.3 ms of a 15 ms step, about half of it
with the timed per-bucket hook on).

Each arm is a whole torchrun job of the demo's CPU model (trainer.models' tiny ViT, batch 32,
2 ranks on gloo), each rank pinned to core LOCAL_RANK in every arm, arms interleaved ABBA:
  none    DDP as it is (C++ all-reduce; what plain torchrun runs)
  torch   torch's own Python `allreduce_hook` (one `.then` per bucket): the floor of any
          Python hook
  timed   a hook shaped like ddptop's timer: the process group's allreduce, a `.then` that
          stamps perf_counter when the bucket is done (rank/comm.py CommTimer.hook)

    python bench/investigations/cpu_comm_hook_cost.py [--rounds 4] [--steps 200] [--arms none,torch,timed]

Prints each run's median step (ms) and, per arm, the mean over rounds of its difference from
`none` in the same round, with a t interval.

Question: is a Python comm hook what ddptop's timed per-bucket hook costs a CPU step?
Answer (2026-11-27, session 9, the 2-core VM, 6 rounds of 300 steps, ~11.8 ms a step): no.
torch's own Python hook +257 us [-248, +762], a hook shaped like ddptop's -142 us [-628, +344]
against DDP's C++ all-reduce: nothing measurable. The rank-side layer's own Python (~30 calls a
step) is what a CPU step pays: `ddptop --nproc 1 --cost 5000` reads +286 us [+252, +334] with the
hook, +150 [+136, +164] without (A/A 1.000).
Corrected (session 10): that job had one bucket and whole runs carry ±500 us of noise; in a
40-bucket step measured in-process (bench/investigations/instrument_host_cost.py, arms
torchhook/instrument) any Python comm hook costs ~60-72 us a bucket, so a CPU run now keeps
DDP's C++ all-reduce by default (gloo_timing=false).
Quoted in: docs/BENCHMARKS.md, "what the rank-side layer costs a CPU step, part by part".
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time


def rank_main(arm: str, steps: int, warmup: int) -> None:
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    from trainer.models import SPECS, build_model

    local = int(os.environ["LOCAL_RANK"])
    os.sched_setaffinity(0, {local % os.cpu_count()})
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = DDP(build_model(SPECS["tiny_vit"]))
    if arm == "torch":
        from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
        model.register_comm_hook(None, allreduce_hook)
    elif arm == "timed":
        pg = dist.distributed_c10d._get_default_group()
        opts = dist.AllreduceOptions()
        opts.reduceOp = dist.ReduceOp.SUM
        world = pg.size()
        stamps: list[float] = []

        def hook(state, bucket):  # unannotated, as ddptop's
            buf = bucket.buffer()
            stamps.append(time.perf_counter())
            buf.div_(world)

            def done(f):
                stamps.append(time.perf_counter())
                return f.value()[0]

            return pg.allreduce([buf], opts).get_future().then(done)

        model.register_comm_hook(None, hook)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(32, 3, 32, 32)
    y = torch.randint(0, 10, (32,))
    times = []
    for i in range(steps):
        t0 = time.perf_counter()
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if i >= warmup:
            times.append(time.perf_counter() - t0)
    med = statistics.median(times) * 1000
    if dist.get_rank() == 0:
        print(f"RESULT {arm} {med:.4f}", flush=True)
    dist.destroy_process_group()


def run(arm: str, steps: int, warmup: int) -> float:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
           __file__, "--rank-arm", arm, "--steps", str(steps), "--warmup", str(warmup)]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=600,
                         cwd=os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    for line in out.stdout.splitlines():
        if line.startswith("RESULT "):
            return float(line.split()[2])
    raise RuntimeError(out.stdout[-1500:] + out.stderr[-1500:])


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--warmup", type=int, default=20)
    p.add_argument("--arms", default="none,torch,timed")
    p.add_argument("--rank-arm", default=None)
    args = p.parse_args()
    if args.rank_arm:
        rank_main(args.rank_arm, args.steps, args.warmup)
        return
    arms = args.arms.split(",")
    diffs: dict[str, list[float]] = {a: [] for a in arms if a != "none"}
    for r in range(args.rounds):
        order = arms if r % 2 == 0 else arms[::-1]
        got = {a: run(a, args.steps, args.warmup) for a in order}
        print(f"round {r + 1}: " + "  ".join(f"{a} {got[a]:.3f} ms" for a in order), flush=True)
        for a in diffs:
            diffs[a].append(got[a] - got["none"])
    from ddptop.analysis.cost_pairs import t_interval

    for a, d in diffs.items():
        ci = t_interval(d)
        if ci is None:
            print(f"{a:6s} vs none: {1000 * d[0]:+.0f} us a step (one round: no interval)")
            continue
        print(f"{a:6s} vs none: {1000 * ci.mean:+.0f} us a step [{1000 * ci.lo:+.0f}, {1000 * ci.hi:+.0f}] "
              f"(95%, t over {ci.n} rounds)")


if __name__ == "__main__":
    main()
