"""Why does one fresh process launch kernels up to 20% faster than the next?

The bill of costs (bench/bill_of_costs.py, session 13) resolves ddptop's cost per kernel launch
no better than its own A/A, ±1.3 µs: plain runs of one pinned, single-threaded loop of tiny
launches read 8.05-11.63 µs a launch from one process to the next. This runs the same loop in
fresh processes, each pinned to the same core, under four starts: as is; with a fixed
PYTHONHASHSEED (dict and set layouts the same in every process); without address-space
randomization (`setarch -R`); and both. If one of them narrows the spread, a whole-run or
bill comparison can fix it in both arms and resolve far less than 1.3 µs.

    python bench/investigations/launch_spread.py [--rounds 6] [--launches 20000] [--cpu 2]

Question: what makes a pinned launch loop's speed differ between fresh processes: the hash
seed, address-space layout, or neither?
Answer: neither (session 14, 20 rounds on 1x H200, docs/measurements/2026-11-28-s14-call1): sd
1.21 as is, 1.41 with the hash seed fixed, 1.35 without ASLR, 1.23 with both. The slow processes
come in runs of rounds (12 of the 16 processes of rounds 10-13 over 8 µs, whatever their start)
and a process's own reps change mid-process: the machine has slow spells, a process does not
(launch_episodes.py: each core has its own).
Quoted in: docs/BENCHMARKS.md, "2026-11-28 (session 13)" and "2026-11-28 (session 14)".
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys

LOOP = """
import json, os, statistics, sys, time
os.sched_setaffinity(0, {int(sys.argv[2])})
import torch
x = torch.zeros(1, device="cuda")
for _ in range(2000):
    x.add_(1)
torch.cuda.synchronize()
reps = []
for _ in range(5):
    t = time.perf_counter()
    for _ in range(int(sys.argv[1])):
        x.add_(1)
    torch.cuda.synchronize()
    reps.append((time.perf_counter() - t) / int(sys.argv[1]) * 1e6)
print(json.dumps({"launch_us": statistics.median(reps), "reps": [round(r, 3) for r in reps]}))
"""


def starts() -> dict[str, tuple[list[str], dict[str, str]]]:
    setarch = shutil.which("setarch")
    norand = [setarch, os.uname().machine, "-R"] if setarch else None
    out = {"as is": ([], {}), "PYTHONHASHSEED=0": ([], {"PYTHONHASHSEED": "0"})}
    if norand:
        out["setarch -R"] = (norand, {})
        out["both"] = (norand, {"PYTHONHASHSEED": "0"})
    return out


def one(prefix: list[str], env: dict[str, str], launches: int, cpu: int) -> tuple[float | None, list[float]]:
    proc = subprocess.run([*prefix, sys.executable, "-c", LOOP, str(launches), str(cpu)], capture_output=True,
                          text=True, env={**os.environ, **env}, timeout=120)
    if proc.returncode != 0:
        print(proc.stderr[-600:], flush=True)
        return None, []
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    return got["launch_us"], got["reps"]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--launches", type=int, default=20000)
    p.add_argument("--cpu", type=int, default=2)
    args = p.parse_args()
    modes = starts()
    got: dict[str, list[float]] = {m: [] for m in modes}
    for r in range(args.rounds):
        order = list(modes) if r % 2 == 0 else list(reversed(modes))
        for mode in order:
            us, reps = one(*modes[mode], args.launches, args.cpu)
            if us is not None:
                got[mode].append(us)
            print(f"round {r} {mode:<18} {us} us a launch (reps {reps})", flush=True)
    for mode, vals in got.items():
        if len(vals) >= 2:
            print(f"{mode:<18} median {statistics.median(vals):.3f} us, range {min(vals):.3f}-{max(vals):.3f}, "
                  f"sd {statistics.stdev(vals):.3f} over {len(vals)} processes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
