"""Does NCCL's own per-collective timing (ProcessGroupNCCL._enable_collectives_timing +
_register_on_completion_hook) cost a launch-bound DDP loop less than a Python comm hook?
Each variant in a fresh process, alternating; per-step host time (ms, median).

    python bench/investigations/completion_hook_cost.py [--rounds 3] [--layers 40] [--steps 300]

Question: does NCCL's own per-collective timing with a completion hook cost a launch-bound DDP
loop less than a Python comm hook?
Answer: not recorded in docs/ (no doc quotes its output). It came with the change to NCCL's own
timing (commit 3bff37b, 2026-11-24), whose step-level pairs are in docs/BENCHMARKS.md, "where the
last 3.5% went, and the fix"; bill_of_costs.py measured the timing plus the completion hook since
(+36 us an all-reduce, docs/BENCHMARKS.md, "Against plain torchrun: `ddptop cost` and the bill of
costs").
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

from instrument_host_cost import step_seconds


def one(variant: str, layers: int, steps: int) -> dict:
    import torch
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=os.environ.get("PORT", "29591"))
    dev = torch.device("cuda:0")
    dist.init_process_group("nccl", rank=0, world_size=1, device_id=dev)
    model = torch.nn.Sequential(*[torch.nn.Linear(256, 256) for _ in range(layers)]).to(dev)
    ddp = torch.nn.parallel.DistributedDataParallel(model, bucket_cap_mb=256 * 257 * 4 / 2**20)
    infos: list = []
    if variant == "completion":  # TORCH_NCCL_ENABLE_TIMING=1 set before the process started

        def done(info):
            try:
                infos.append((info.time_started, info.active_duration, info.seq))
            except Exception:  # noqa: BLE001
                pass

        ddp.process_group._register_on_completion_hook(done)
    elif variant == "pyhook":
        opts = dist.AllreduceOptions()
        opts.reduceOp = dist.ReduceOp.AVG
        pg = ddp.process_group

        def hook(state, bucket):
            return pg.allreduce([bucket.buffer()], opts).get_future().then(lambda f: f.value()[0])

        ddp.register_comm_hook(None, hook)
    opt = torch.optim.SGD(ddp.parameters(), lr=1e-3)
    x = torch.randn(64, 256, device=dev)
    times = [t * 1e3 for t in step_seconds(torch, ddp, opt, x, steps, cuda=True)]
    time.sleep(0.5)
    n = len(infos)
    fields = [str(v) for v in infos[-1]] if infos else []
    dist.destroy_process_group()
    return {"median_ms": statistics.median(times), "completions": n, "last": fields,
            "mean_duration_us": (statistics.mean(d[1].total_seconds() for d in infos[-100:]) * 1e6) if infos else None}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--layers", type=int, default=40)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--one")
    args = ap.parse_args()
    if args.one:
        print(json.dumps(one(args.one, args.layers, args.steps)))
        return 0
    res: dict[str, list[float]] = {}
    for r in range(args.rounds):
        for v in ("plain", "timing", "completion", "pyhook"):
            env = {**os.environ, "PORT": str(29591 + r)}
            if v in ("timing", "completion"):
                env["TORCH_NCCL_ENABLE_TIMING"] = "1"
            out = subprocess.run([sys.executable, __file__, "--one", v, "--layers", str(args.layers), "--steps",
                                  str(args.steps)], capture_output=True, text=True, check=False, env=env,
                                 timeout=90)
            if out.returncode:
                print(out.stderr[-3000:])
                return 1
            d = json.loads(out.stdout.strip().splitlines()[-1])
            res.setdefault(v, []).append(d["median_ms"])
            print(f"round {r + 1} {v:10s} {d['median_ms']:.3f} ms/step  {d}", flush=True)
    base = statistics.median(res["plain"])
    for v, xs in res.items():
        print(f"{v:10s} {statistics.median(xs):.3f} ms/step ({statistics.median(xs) - base:+.3f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
