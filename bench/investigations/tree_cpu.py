"""What a run costs the CPU, all of it: the CPU time of the whole process tree (torchrun, the
ranks, and under ddptop its own process and keeper) per step, plain torchrun against ddptop,
from two run lengths (the slope: start-up and ending drop out). CPU time is far steadier than
wall time on a shared VM (whole-run pairs of the CPU GPT read an A/A of ±30%): on a host whose
cores the ranks fill, what ddptop adds to the CPU per step is what it takes from the ranks.

    .venv/bin/python bench/investigations/tree_cpu.py [--short 110] [--long 610] [--rounds 3] [--nproc 2]
        [--gpt-args "..."] [--set KEY=VALUE ...]  (a ddptop --set for the ddptop arm)

Each round runs plain, ddptop, ddptop, plain (ABBA) at each length; a process's CPU is counted
once it is reaped (getrusage(RUSAGE_CHILDREN) around each run: torchrun reaps its ranks, ddptop
its torchrun and keeper).

Question: how much CPU does a run under ddptop use per step beyond the same run under plain
torchrun, on the CPU GPT that `ddptop cost` found +1.25 ms a step slower (session 10)?
Answer (2026-11-28, the 2-core VM, 2 rounds): not on this workload: each arm's CPU is about twice
its wall time (plain 24.1-28.9 ms of CPU a step, ddptop 24.4-29.6), because the ranks fill both
cores while they wait (gloo), so the tree's CPU measures wall time, not work. It tells work
apart only where the ranks sleep when they wait.
Quoted in: docs/BENCHMARKS.md, "2026-11-28 (session 12), the 2-core CPU VM".
"""

from __future__ import annotations

import argparse
import resource
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
GPT = "--data random --n-layer 2 --n-embd 64 --block 64 --batch-size 8 --vocab 256 --no-item-every-step --warmup 10"


def tree_cpu(cmd: list[str]) -> tuple[float, float]:
    """(CPU seconds of every process the command's tree reaped, wall seconds)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.monotonic()
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=900, cwd=ROOT)
    wall = time.monotonic() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if res.returncode != 0:
        raise SystemExit(f"tree_cpu: {cmd[:4]}... failed (rc {res.returncode}): {res.stderr[-800:]}")
    return (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime), wall


def command(arm: str, steps: int, args: argparse.Namespace) -> list[str]:
    script = [str(ROOT / "bench" / "gpt_train.py"), *shlex.split(args.gpt_args), "--steps", str(steps)]
    if arm == "plain":
        return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={args.nproc}",
                *script]
    sets = [x for s in args.set for x in ("--set", s)]
    return [sys.executable, "-m", "ddptop", "--headless", "--nproc", str(args.nproc), "--runs-dir", args.runs_dir,
            *sets, "--", sys.executable, *script]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--short", type=int, default=110)
    p.add_argument("--long", type=int, default=610)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--nproc", type=int, default=2)
    p.add_argument("--gpt-args", default=GPT)
    p.add_argument("--set", action="append", default=[])
    p.add_argument("--runs-dir", default="/tmp/ddptop-tree-cpu")
    args = p.parse_args()
    per_step: dict[str, list[float]] = {"plain": [], "ddptop": []}
    for i in range(args.rounds):
        for arm in ("plain", "ddptop", "ddptop", "plain"):
            short_cpu, short_wall = tree_cpu(command(arm, args.short, args))
            long_cpu, long_wall = tree_cpu(command(arm, args.long, args))
            slope = (long_cpu - short_cpu) / (args.long - args.short) * 1e3
            per_step[arm].append(slope)
            print(f"round {i + 1} {arm:<6}: CPU {short_cpu:.2f} s / {long_cpu:.2f} s at {args.short} / {args.long} steps "
                  f"(wall {short_wall:.1f} / {long_wall:.1f} s): {slope:.3f} ms of CPU a step", flush=True)
    plain, ours = statistics.median(per_step["plain"]), statistics.median(per_step["ddptop"])
    print(f"CPU a step, whole tree, {args.nproc} ranks: plain {plain:.3f} ms (range {min(per_step['plain']):.3f}-"
          f"{max(per_step['plain']):.3f}), ddptop {ours:.3f} ms (range {min(per_step['ddptop']):.3f}-"
          f"{max(per_step['ddptop']):.3f}): ddptop adds {ours - plain:+.3f} ms of CPU a step")
    return 0


if __name__ == "__main__":
    sys.exit(main())
