"""What ddptop's own process (hub, model, straggler checks, steps.jsonl, the headless view)
takes of the CPU per step: runs `ddptop --headless` on a 2-rank CPU GPT of two lengths, alternated,
and reads the process's own CPU time (getrusage at its exit; its children not counted). The
slope between the lengths is its CPU per step; the intercept its start-up and ending.

    .venv/bin/python bench/investigations/monitor_cpu.py [--short 110] [--long 1010] [--rounds 3] [--nproc 2]

Question: how much CPU does ddptop's own process take per step of a CPU run?
Answer (2026-11-28, the 2-core VM): 0.23 ms a step at 2 ranks (median of 3 rounds, 0.20-0.25;
0.33-0.35 s at 110 steps, 0.53-0.56 s at 1,010); the code before session 12's changes 0.22
(0.22-0.22): the same. The straggler check is ~0.08 of it (0.8 ms a check at 2 ranks, every 10
steps). Session 11 read ~0.55 ms a step (psutil every 0.2 s, a larger GPT, 420 against 1,620 steps).
Quoted in: docs/BENCHMARKS.md, "2026-11-28 (session 12), the 2-core CPU VM".
"""

from __future__ import annotations

import argparse
import re
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
GPT = "--data random --n-layer 1 --n-embd 32 --block 32 --batch-size 4 --vocab 256 --warmup 10"
# ddptop run in this process's child with its own CPU time printed at exit (getrusage(SELF))
RUNNER = """
import atexit, resource, runpy, sys
def said():
    r = resource.getrusage(resource.RUSAGE_SELF)
    print(f"MONITOR_CPU {r.ru_utime + r.ru_stime:.4f}", file=sys.stderr)
atexit.register(said)
sys.argv = ["ddptop", *sys.argv[1:]]
runpy.run_module("ddptop", run_name="__main__")
"""


def monitor_cpu_s(steps: int, nproc: int, runs_dir: str) -> float:
    cmd = [sys.executable, "-c", RUNNER, "--headless", "--nproc", str(nproc), "--runs-dir", runs_dir, "--",
           sys.executable, str(ROOT / "bench" / "gpt_train.py"), *GPT.split(), "--steps", str(steps)]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=ROOT)
    found = re.search(r"MONITOR_CPU ([0-9.]+)", res.stderr)
    if res.returncode != 0 or not found:
        raise SystemExit(f"monitor_cpu: the run failed (rc {res.returncode}): {res.stderr[-800:]}")
    return float(found.group(1))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--short", type=int, default=110)
    p.add_argument("--long", type=int, default=1010)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--nproc", type=int, default=2)
    p.add_argument("--runs-dir", default="/tmp/ddptop-monitor-cpu")
    args = p.parse_args()
    slopes = []
    for i in range(args.rounds):
        short = monitor_cpu_s(args.short, args.nproc, args.runs_dir)
        long = monitor_cpu_s(args.long, args.nproc, args.runs_dir)
        slope = (long - short) / (args.long - args.short) * 1e3
        slopes.append(slope)
        print(f"round {i + 1}: {short:.3f} s at {args.short} steps, {long:.3f} s at {args.long}: "
              f"{slope:.3f} ms a step", flush=True)
    print(f"ddptop's own process: median {statistics.median(slopes):.3f} ms of CPU a step "
          f"(range {min(slopes):.3f}-{max(slopes):.3f}) at {args.nproc} ranks")
    return 0


if __name__ == "__main__":
    sys.exit(main())
