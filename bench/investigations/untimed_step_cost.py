"""What an untimed step costs the host under ddptop's default (one step in K timed), in µs.

Since session 16 the rank-side hooks time one step in K; on the other steps only the optimizer's
step hooks run (they count the step and choose whether to time the next). Whole runs cannot
resolve a few µs, so this measures it inside one process: a launch-bound DDP loop (world size 1,
`--layers` small layers) with ddptop's instrument installed as under ddptop (its probe talking to
a socket pair drained by a thread, as to a hub; the sender thread and its wake-ups included),
run in blocks that alternate ABBA between the instrument's optimizer hooks present ("on") and
taken out of torch's global hook tables ("off"). Only steps the instrument did not time count in
"on" blocks, and blocks are taken only while the instrument is bypassed, so "off" steps run no
forward hook either. Each block's figure is the median host time of the whole step and of the
`opt.step()` call alone; the difference on-off per ABBA pair gives a mean and a t 95% interval.
The timed steps seen in "on" blocks are reported beside them (their host cost, not the GPU's).
First, the hooks alone: `opt.step()` of a one-parameter SGD called `--calls` times a block, blocks
alternating ABBA the same way: µs a step over the whole block (the 1 in K steps it times, each
starting and ending a record, are in it too), and the median of the untimed calls alone.

    python bench/investigations/untimed_step_cost.py [--device cpu|cuda] [--layers 20] [--pairs 20]
        [--block 200] [--phase-every 0]

Question: how many µs of host time does a step the hooks do not time cost under the default?
Answer: see docs/BENCHMARKS.md (the section quoting this file).
Quoted in: docs/BENCHMARKS.md, "2026-11-28 (session 17)".
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from ddptop.analysis.cost_pairs import t_interval  # noqa: E402


def install(torch, phase_every: int):
    """ddptop's instrument as under ddptop, talking to a drained socket pair; the hooks it added."""
    from torch.optim import optimizer

    from ddptop.probe import Probe
    from ddptop.rank.instrument import Instrument

    before = (set(optimizer._global_optimizer_pre_hooks), set(optimizer._global_optimizer_post_hooks))
    ours, hub = socket.socketpair()
    threading.Thread(target=lambda: [None for _ in iter(lambda: hub.recv(65536), b"")], daemon=True).start()
    inst = Instrument(torch, Probe(ours, 0, owned=True), 0, {"phase_every": phase_every})
    inst.install()
    tables = (optimizer._global_optimizer_pre_hooks, optimizer._global_optimizer_post_hooks)
    added = [{k: v for k, v in table.items() if k not in old} for table, old in zip(tables, before)]
    return inst, tables, added


def toggle(tables, added, on: bool) -> None:
    for table, hooks in zip(tables, added):
        for key, hook in hooks.items():
            if on:
                table[key] = hook
            else:
                table.pop(key, None)


def hooks_alone(torch, inst, tables, added, pairs: int, calls: int) -> tuple[list[float], list[float]]:
    """µs an `opt.step()` of a one-parameter SGD gains with the instrument's hooks, per ABBA pair:
    over every call of a block (the 1 in K that start and end a record too), and by the median of
    the calls the instrument did not time (each call timed alone)."""
    p = torch.nn.Parameter(torch.zeros(1))
    p.grad = torch.zeros(1)
    opt = torch.optim.SGD([p], lr=0.0)
    per: dict[str, list[tuple[float, float]]] = {"on": [], "off": []}
    clock = time.perf_counter
    for arm in abba(pairs):
        while inst.engaged:
            opt.step()
        toggle(tables, added, arm == "on")
        untimed = []
        t0 = clock()
        for _ in range(calls):
            engaged = inst.engaged
            t1 = clock()
            opt.step()
            if not engaged:
                untimed.append(clock() - t1)
        per[arm].append(((clock() - t0) / calls * 1e6, statistics.median(untimed) * 1e6))
        toggle(tables, added, True)
    pairs_ = list(zip(per["on"], per["off"]))
    return [on[0] - off[0] for on, off in pairs_], [on[1] - off[1] for on, off in pairs_]


def abba(pairs: int) -> list[str]:
    return [arm for _ in range(pairs // 2 + 1) for arm in ("on", "off", "off", "on")][:2 * pairs]


def step(torch, ddp, opt, x, cuda: bool) -> tuple[float, float]:
    """Host µs of one training step and of its `opt.step()` alone (a device sync ends the step)."""
    t0 = time.perf_counter()
    loss = ddp(x).square().mean()
    opt.zero_grad(set_to_none=True)
    loss.backward()
    t1 = time.perf_counter()
    opt.step()
    t2 = time.perf_counter()
    if cuda:
        torch.cuda.synchronize()
    return (time.perf_counter() - t0) * 1e6, (t2 - t1) * 1e6


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    ap.add_argument("--layers", type=int, default=20)
    ap.add_argument("--pairs", type=int, default=20, help="ABBA pairs of blocks")
    ap.add_argument("--block", type=int, default=200, help="steps a block")
    ap.add_argument("--calls", type=int, default=5000, help="opt.step() calls a block of the hooks alone")
    ap.add_argument("--phase-every", type=int, default=0, help="the instrument's phase_every (0: auto, the default)")
    args = ap.parse_args()

    import torch
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=os.environ.get("PORT", "29571"), RANK="0")
    cuda = args.device == "cuda"
    dist.init_process_group("nccl" if cuda else "gloo", rank=0, world_size=1)
    inst, tables, added = install(torch, args.phase_every)
    dev = torch.device("cuda:0" if cuda else "cpu")
    model = torch.nn.Sequential(*[torch.nn.Linear(64, 64) for _ in range(args.layers)]).to(dev)
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=1e-4)
    x = torch.randn(8, 64, device=dev)
    for _ in range(300):  # the first 50 are timed, then K is chosen
        step(torch, ddp, opt, x, cuda)
    every, untimed = (t_interval(d) for d in hooks_alone(torch, inst, tables, added, args.pairs, args.calls))

    blocks: dict[str, list[tuple[float, float]]] = {"on": [], "off": []}
    timed: list[float] = []
    for arm in abba(args.pairs):
        while inst.engaged:  # blocks start on a bypassed step: "off" must run no forward hook
            step(torch, ddp, opt, x, cuda)
        toggle(tables, added, arm == "on")
        whole, opt_only = [], []
        for _ in range(args.block):
            engaged = inst.engaged
            t, o = step(torch, ddp, opt, x, cuda)
            if engaged:
                timed.append(t)
            else:
                whole.append(t)
                opt_only.append(o)
        toggle(tables, added, True)
        blocks[arm].append((statistics.median(whole), statistics.median(opt_only)))
    dist.destroy_process_group()

    diffs = [(on[0] - off[0], on[1] - off[1]) for on, off in zip(blocks["on"], blocks["off"])]
    whole_i, opt_i = t_interval([d[0] for d in diffs]), t_interval([d[1] for d in diffs])
    off_ms = statistics.median(b[0] for b in blocks["off"])
    result = {
        "device": args.device, "layers": args.layers, "pairs": len(diffs), "block": args.block,
        "k": inst.phases.k, "off_step_us": off_ms, "on_untimed_step_us": statistics.median(b[0] for b in blocks["on"]),
        "untimed_step_extra_us": [whole_i.mean, whole_i.lo, whole_i.hi] if whole_i else None,
        "untimed_opt_step_extra_us": [opt_i.mean, opt_i.lo, opt_i.hi] if opt_i else None,
        "hooks_alone_us": [every.mean, every.lo, every.hi] if every else None,
        "hooks_alone_untimed_us": [untimed.mean, untimed.lo, untimed.hi] if untimed else None,
        "timed_step_us_median": statistics.median(timed) if timed else None, "timed_steps_seen": len(timed),
    }
    print(f"{args.device}, {args.layers} layers, K = {inst.phases.k}, {len(diffs)} ABBA pairs of {args.block}-step blocks:")
    if every and untimed:
        print(f"  the hooks alone: {every.mean:+.2f} µs [{every.lo:+.2f}, {every.hi:+.2f}] an opt.step() over every "
              f"call (1 in K timed); {untimed.mean:+.2f} µs [{untimed.lo:+.2f}, {untimed.hi:+.2f}] an untimed one (medians)")
    print(f"  a step without the hooks: {off_ms:.1f} µs (median of blocks)")
    if whole_i and opt_i:
        print(f"  an untimed step's extra: {whole_i.mean:+.2f} µs [{whole_i.lo:+.2f}, {whole_i.hi:+.2f}] (whole step); "
              f"{opt_i.mean:+.2f} µs [{opt_i.lo:+.2f}, {opt_i.hi:+.2f}] (opt.step() alone)")
    if timed:
        print(f"  timed steps seen in 'on' blocks: {len(timed)}, median {statistics.median(timed):.1f} µs (host)")
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
