"""Can a rank's host pace be read while its host runs ahead of its GPU?

A launch-bound job's step is set by its slowest host. Where one rank is slow on its GPU (or its
loader), the others' hosts run ahead and block in a full launch queue, so their CUDA-event phases
show only their GPU's work: when the slow rank is taken away, the step falls to the slowest host,
which those phases cannot show (4x H200, session 13: rank 1's 30 extra matmuls cost the job 1.7 ms
a step, not the 4.2 its GPU excess over the next-latest rank says, because rank 0's host then set
the step at 20.7 ms). This reads the CPU time of each rank's launching threads (its main thread and
the autograd engine's pt_autograd_* threads, /proc/<pid>/task/<tid>/schedstat, ns) against its
step records, per block of a --slow-pause run: if a blocked launch sleeps, CPU time per step is
the host's own pace whether it runs ahead or not.

    python bench/investigations/host_pace.py --launches 20000   # part 1: one GPU, no job
    python bench/investigations/host_pace.py --nproc 4 --pause 120:240 -- bench/gpt_train.py ARGS...

Part 1: a loop of launches of a 0.2 ms kernel (the queue fills; the host blocks) and of a tiny
one (the host sets the pace): the main thread's CPU time over the loop's wall time.
Part 2: per rank and block (slow before the pause, paused, slow after), the launching threads' CPU
ms a step beside the step and the rank's own work (step less exposed wait).

Question: does a host blocked on a full launch queue use CPU (then CPU time cannot tell a rank's
host pace) or sleep (then it can, and the straggler's cost can take the others' host pace as a
floor)?
Answer: it spins (4x H200, session 13, docs/measurements/2026-11-28-s13-call2): 20,000 launches
of a 0.2 ms kernel with the queue full used 3861 ms of CPU in 3861 ms (1.00), as tiny host-bound
launches do; in the GPT runs every rank's launching threads read 0.98-1.00 of wall time in every
block, whichever rank's host set the step. A host's pace is not in any record while it waits, so
in a launch-bound job the straggler's cost is an upper bound (ddptop.model.straggler_work.Costs).
Quoted in: docs/GPU.md, "2026-11-28 (session 13)", "The straggler cases with the loss read in each run".
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from host_late import rank_pids, step_records  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
LAUNCHERS = ("pt_autograd",)  # thread names (besides the main thread) that launch a step's kernels


def launches(n: int) -> None:
    import torch
    torch.cuda.init()
    for label, cycles in (("0.2 ms kernels (queue fills)", 400_000), ("tiny kernels (host-bound)", 100)):
        torch.cuda._sleep(cycles)
        torch.cuda.synchronize()
        w0, c0 = time.perf_counter(), time.thread_time()
        for _ in range(n):
            torch.cuda._sleep(cycles)
        w1, c1 = time.perf_counter(), time.thread_time()
        torch.cuda.synchronize()
        w2 = time.perf_counter()
        print(f"{label}: {n} launches, host loop {1e3 * (w1 - w0):.0f} ms wall, {1e3 * (c1 - c0):.0f} ms CPU "
              f"({(c1 - c0) / (w1 - w0):.2f}), GPU done {1e3 * (w2 - w0):.0f} ms after the first launch", flush=True)


def cpu_ns(pid: int) -> dict[str, int]:
    """'launch' (main + autograd threads) and 'other' CPU ns of one process's threads."""
    out = {"launch": 0, "other": 0}
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tids:
        try:
            name = Path(f"/proc/{pid}/task/{tid}/comm").read_text().strip()
            ns = int(Path(f"/proc/{pid}/task/{tid}/schedstat").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            continue
        key = "launch" if int(tid) == pid or name.startswith(LAUNCHERS) else "other"
        out[key] += ns
    return out


def at(readings: list[tuple[float, dict[str, int]]], t: float, key: str) -> float | None:
    """The CPU ns of `key` at wall time t, linear between the readings around it."""
    for (t0, a), (t1, b) in zip(readings, readings[1:]):
        if t0 <= t <= t1 and key in a and key in b:
            return a[key] + (b[key] - a[key]) * (t - t0) / (t1 - t0)
    return None


def blocks(pause: tuple[int, int], steps: int, warmup: int) -> list[tuple[str, int, int]]:
    a, b = pause
    edge = 10  # steps left out at each switch
    return [("slow", warmup + edge, warmup + a), ("paused", warmup + a + edge, warmup + b),
            ("slow again", warmup + b + edge, steps)]


def per_block(run_dir: Path, readings: dict[int, list], pause: tuple[int, int], steps: int, warmup: int) -> None:
    recs = step_records(run_dir)
    for name, a, b in blocks(pause, steps, warmup):
        print(f"{name} (steps {a}-{b - 1}):")
        for rank in sorted(recs):
            mine = recs[rank]
            got = [mine[s] for s in range(a, b) if s in mine]
            if a not in mine or b - 1 not in mine or not got:
                continue
            t0, t1, n = mine[a]["t"], mine[b - 1]["t"], b - 1 - a
            step = statistics.median(r["step_ms"] for r in got)
            row = []
            for key in ("launch", "other"):
                c0, c1 = at(readings.get(rank, []), t0, key), at(readings.get(rank, []), t1, key)
                share = (c1 - c0) / 1e9 / (t1 - t0) if c0 is not None and c1 is not None and t1 > t0 else None
                row.append(f"{key} CPU {share:4.2f} of wall = {share * step:6.2f} ms a step" if share is not None
                           else f"{key} ?")
            own = statistics.median(r["step_ms"] - r.get("exposed_comm_ms", 0.0) for r in got)
            wall = 1e3 * (t1 - t0) / n
            print(f"  rank {rank}: step {step:6.2f} own {own:6.2f} wall/step {wall:6.2f}  " + "  ".join(row), flush=True)


def job(args: argparse.Namespace) -> None:
    a, _, b = args.pause.partition(":")
    pause = (int(a), int(b))
    runs = Path(args.runs_dir)
    cmd = [sys.executable, "-m", "ddptop", "--headless", "--interval", "60", "--nproc", str(args.nproc),
           "--warmup", str(args.warmup), "--runs-dir", str(runs), "--", sys.executable, *args.script,
           "--steps", str(args.steps), "--warmup", str(args.warmup), "--slow-pause", args.pause]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=ROOT)
    pids: dict[int, int] = {}
    readings: dict[int, list] = {}
    while proc.poll() is None:
        if len(pids) < args.nproc:
            pids = rank_pids(proc.pid)
        now = time.time()
        for rank, pid in pids.items():
            readings.setdefault(rank, []).append((now, cpu_ns(pid)))
        time.sleep(args.every)
    print(f"job rc={proc.returncode}; {args.script}")
    made = sorted(d for d in runs.iterdir() if d.is_dir()) if runs.is_dir() else []
    if made:
        per_block(made[-1], readings, pause, args.steps, args.warmup)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--launches", type=int, default=0, help="part 1: this many launches of each kernel")
    p.add_argument("--nproc", type=int, default=4)
    p.add_argument("--pause", default="120:240")
    p.add_argument("--steps", type=int, default=370)
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--every", type=float, default=0.2)
    p.add_argument("--runs-dir", default="/tmp/ddptop-host-pace")
    p.add_argument("script", nargs=argparse.REMAINDER, help="-- SCRIPT ARGS (run with this Python)")
    args = p.parse_args()
    args.script = args.script[1:] if args.script[:1] == ["--"] else args.script
    if args.launches:
        launches(args.launches)
    if args.script:
        job(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
