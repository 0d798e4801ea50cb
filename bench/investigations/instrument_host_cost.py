"""What the rank-side instrument costs the host per training step, in microseconds.

A launch-bound DDP loop (world size 1, many small layers, one bucket per layer, so the
host's own work is the step) runs plainly and with ddptop's instrument installed (its
probe talking to a socket pair drained by a thread, as to a hub), alternating, each
variant in a fresh process. The difference of the per-step medians is the host time the
instrument adds; on a GPU that is what a step pays when the GPU has caught up with the
host (after a sync such as the script's own `.item()`).

    python bench/investigations/instrument_host_cost.py [--device cpu|cuda] [--layers 40] [--steps 400]
        [--rounds 3] [--variants plain,instrument,nocomm]

Variants: plain (no ddptop), instrument (as under ddptop: comm timed every 10th step on a
GPU, every step on a CPU; one step in K timed after the first 50 since session 16), every
(phase_every=1: every step timed, the default before), k64 (one step in 64), nocomm (comm_timing=false: no comm hook), timed (comm timed every
step), torchhook (no ddptop; torch's own Python `allreduce_hook` on the DDP: the floor of any
Python comm hook), builtin (no ddptop; DDP's built-in C++ ALLREDUCE hook).

Question: how many microseconds of host time a step does the rank-side instrument add to a
launch-bound loop?
Answer (2026-11-27, session 10, the 2-core VM, 40 buckets, 5 rounds pinned): any Python comm
hook costs a gloo step ~60-72 us a bucket (torch's own allreduce_hook +2890 us a step, ddptop's
timer +2350, DDP's built-in C++ hook -135, ddptop with comm_timing=false +371): docs/BENCHMARKS.md,
"a Python comm hook costs a gloo step per bucket". Earlier: the commit that added it (2026-11-24)
gives dist.all_reduce's Python checks at ~35 us a bucket, and its variants led to the GPU comm
path without a Python hook (docs/BENCHMARKS.md, "where the last 3.5% went, and the fix").
`bash bench/gpu_check.sh ovhsplit` runs it; completion_hook_cost.py imports its step loop.
Quoted in: docs/BENCHMARKS.md, "2026-11-27 (session 10), the 2-core CPU VM: a Python comm hook costs a gloo step per bucket".
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SETTINGS = {"instrument": {}, "nocomm": {"comm_timing": False}, "timed": {"comm_timing_every": 1},
            "every": {"phase_every": 1}, "k64": {"phase_every": 64}}


def step_seconds(torch, ddp, opt, x, steps: int, cuda: bool, warmup: int = 50) -> list[float]:
    """Host seconds of each of `steps` training steps after `warmup` (synchronized on CUDA)."""
    times = []
    for i in range(steps + warmup):
        t0 = time.perf_counter()
        loss = ddp(x).square().mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if cuda:
            torch.cuda.synchronize()
        if i >= warmup:
            times.append(time.perf_counter() - t0)
    return times


def one(variant: str, device: str, layers: int, steps: int) -> dict[str, float]:
    import torch
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=os.environ.get("PORT", "29561"), RANK="0")
    cuda = device == "cuda"
    dist.init_process_group("nccl" if cuda else "gloo", rank=0, world_size=1)
    dev = torch.device("cuda:0" if cuda else "cpu")
    if variant in SETTINGS:
        sys.path.insert(0, str(ROOT))
        from ddptop.probe import Probe
        from ddptop.rank.instrument import Instrument

        ours, hub = socket.socketpair()
        threading.Thread(target=lambda: [None for _ in iter(lambda: hub.recv(65536), b"")], daemon=True).start()
        inst = Instrument(torch, Probe(ours, 0, owned=True), 0, SETTINGS[variant])
        inst.install()
    model = torch.nn.Sequential(*[torch.nn.Linear(64, 64) for _ in range(layers)]).to(dev)
    ddp = torch.nn.parallel.DistributedDataParallel(model, bucket_cap_mb=64 * 65 * 4 / 2**20)
    if variant == "torchhook":
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

        ddp.register_comm_hook(None, default_hooks.allreduce_hook)
    elif variant == "builtin":
        ddp._register_builtin_comm_hook(dist.BuiltinCommHookType.ALLREDUCE)
    opt = torch.optim.SGD(ddp.parameters(), lr=1e-3)
    x = torch.randn(8, 64, device=dev)
    times = [t * 1e6 for t in step_seconds(torch, ddp, opt, x, steps, cuda)]
    logged = ddp._get_ddp_logging_data() if hasattr(ddp, "_get_ddp_logging_data") else {}
    # the buckets after the first step's rebuild (bucket_sizes is the first step's one)
    buckets = len(str(logged.get("rebuilt_bucket_sizes") or logged.get("bucket_sizes", "")).split(","))
    dist.destroy_process_group()
    return {"median_us": statistics.median(times), "mean_us": statistics.fmean(times), "buckets": buckets}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    ap.add_argument("--layers", type=int, default=40)
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--variants", default="plain,instrument,nocomm")
    ap.add_argument("--one", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one:
        print(json.dumps(one(args.one, args.device, args.layers, args.steps)))
        return 0
    variants = args.variants.split(",")
    results: dict[str, list[float]] = {v: [] for v in variants}
    means: dict[str, list[float]] = {v: [] for v in variants}
    buckets = 0
    for r in range(args.rounds):
        for v in variants:
            out = subprocess.run([sys.executable, __file__, "--one", v, "--device", args.device, "--layers",
                                  str(args.layers), "--steps", str(args.steps)], capture_output=True, text=True,
                                 env={**os.environ, "PORT": str(29561 + r)}, check=False)
            if out.returncode != 0:
                print(out.stderr[-2000:], file=sys.stderr)
                return 1
            res = json.loads(out.stdout.strip().splitlines()[-1])
            buckets = res["buckets"]
            results[v].append(res["median_us"])
            means[v].append(res["mean_us"])
            print(f"round {r + 1} {v:11s} {res['median_us']:8.1f} us/step (mean {res['mean_us']:.1f})", flush=True)
    base, base_mean = statistics.median(results[variants[0]]), statistics.median(means[variants[0]])
    print(f"\n{args.device}, {args.layers} layers, {buckets} buckets, median of {args.rounds} rounds"
          " (a step's median: a bypassed step's where one in K is timed; its mean: the timed ones' share too):")
    for v in variants:
        med, mean = statistics.median(results[v]), statistics.median(means[v])
        print(f"{v:11s} {med:8.1f} us/step  {med - base:+8.1f} us vs {variants[0]};  mean {mean:8.1f}  {mean - base_mean:+8.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
