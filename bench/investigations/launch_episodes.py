"""Are a launch loop's slow spells machine-wide, and does a lock-step pair on one core cancel them?

Session 14's 20 rounds of `launch_spread.py` (one H200) showed the slow processes in runs of
consecutive rounds (rounds 10-13: 11 of 16 slow whatever the start) and a process's own reps
changing mid-process: a state of the machine over time, not of a process. This runs, at once and
for `--seconds`: one free-running loop of tiny-kernel bursts per GPU but the first, each pinned to
its own core; and on GPU 0, two processes pinned to one core that take turns burst by burst
(a pipe hands the turn over; the waiting one sleeps in `read`). Every burst is `--launches`
in-place adds on a one-element tensor and one sync, timed as µs a launch. Each second it also
reads each used core's steal time (/proc/stat) and MHz, and each GPU's SM clock (NVML).

    python bench/investigations/launch_episodes.py [--seconds 90] [--launches 2000]

Prints: each loop's median and its slow share (bursts 20% over its median); the correlation of
every pair of loops' per-second medians (near 1: the spells are machine-wide and arms run at the
same time share them; near 0: per core or per GPU); the lock-step pair's paired difference
(second minus first, mean and 95% interval over turns: what an A/A at this grain resolves).

Question: are the slow spells of a pinned launch loop machine-wide or per core/GPU, and how
finely does a lock-step pair on one core resolve a launch's cost?
Answer: per core/GPU (session 14, 4x H200, docs/measurements/2026-11-28-s14-call2): loops on
four cores and GPUs were 21-31% of their bursts 20% slow, their per-second medians correlated
-0.09 to +0.28 with each other, the lock-step pair on one core +0.99; no steal, clocks steady. The
pair's difference read -0.045 [-0.074, -0.015] µs a launch over 2,520 turns: arms that take
turns on one core resolve a launch's cost; arms at once on other cores do not share a spell.
Quoted in: docs/BENCHMARKS.md, "2026-11-28 (session 14)".
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

LOOP = """
import json, os, sys, time
os.sched_setaffinity(0, {int(sys.argv[1])})
import torch
cuda = torch.cuda.is_available()
if cuda:
    torch.cuda.set_device(int(sys.argv[2]))
sync = torch.cuda.synchronize if cuda else (lambda: None)
launches, deadline = int(sys.argv[3]), float(sys.argv[4])
rfd, wfd = int(sys.argv[5]), int(sys.argv[6])
x = torch.zeros(1, device="cuda" if cuda else "cpu")
for _ in range(2000):
    x.add_(1)
sync()
if rfd < 0:
    while time.time() < float(sys.argv[7]):
        time.sleep(0.01)
out = []
while True:
    if rfd >= 0 and not os.read(rfd, 1):
        break
    if time.time() >= deadline:
        if wfd >= 0:
            os.close(wfd)
        break
    t = time.perf_counter()
    for _ in range(launches):
        x.add_(1)
    sync()
    out.append((time.time(), (time.perf_counter() - t) / launches * 1e6))
    if wfd >= 0:
        os.write(wfd, b"t")
print(json.dumps(out))
"""


def _cores(n: int) -> list[int]:
    cpus = sorted(os.sched_getaffinity(0))
    step = max(1, len(cpus) // (n + 1))
    return [cpus[(2 + i * step) % len(cpus)] for i in range(n)]


def _spawn(core: int, gpu: int, args: argparse.Namespace, deadline: float, start: float,
           rfd: int = -1, wfd: int = -1) -> subprocess.Popen[str]:
    fds = tuple(fd for fd in (rfd, wfd) if fd >= 0)
    return subprocess.Popen([sys.executable, "-c", LOOP, str(core), str(gpu), str(args.launches), str(deadline),
                             str(rfd), str(wfd), str(start)], stdout=subprocess.PIPE, text=True, pass_fds=fds)


def _sample(cores: list[int], seconds: float) -> list[dict[str, object]]:
    """Each second: steal jiffies and MHz per core, SM clock per GPU."""
    try:
        import pynvml

        pynvml.nvmlInit()
        gpus = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
    except Exception:  # noqa: BLE001 - no NVML: the host samples alone
        pynvml, gpus = None, []
    rows: list[dict[str, object]] = []
    end = time.time() + seconds
    while time.time() < end:
        stat = {ln.split()[0]: int(ln.split()[8]) for ln in open("/proc/stat") if ln.startswith("cpu") and ln[3] != " "}
        mhz = [float(ln.split(":")[1]) for ln in open("/proc/cpuinfo") if ln.startswith("cpu MHz")]
        rows.append({"t": time.time(), "steal": [stat.get(f"cpu{c}", 0) for c in cores],
                     "mhz": [mhz[c] if c < len(mhz) else None for c in cores],
                     "sm": [pynvml.nvmlDeviceGetClockInfo(g, pynvml.NVML_CLOCK_SM) for g in gpus] if pynvml else []})
        time.sleep(1.0)
    return rows


def _per_second(series: list[tuple[float, float]]) -> dict[int, float]:
    bins: dict[int, list[float]] = {}
    for t, us in series:
        bins.setdefault(int(t), []).append(us)
    return {s: statistics.median(v) for s, v in bins.items()}


def _corr(a: dict[int, float], b: dict[int, float]) -> float | None:
    keys = sorted(set(a) & set(b))
    if len(keys) < 5:
        return None
    return statistics.correlation([a[k] for k in keys], [b[k] for k in keys])


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seconds", type=float, default=90.0)
    p.add_argument("--launches", type=int, default=2000)
    p.add_argument("--warmup", type=float, default=15.0, help="seconds for every process to import torch")
    args = p.parse_args()
    import torch

    ngpu = max(1, torch.cuda.device_count())
    cores = _cores(ngpu)
    start = time.time() + args.warmup  # every process imported torch and warmed up
    deadline = start + args.seconds
    a_r, b_w = os.pipe()  # b hands the turn to a
    b_r, a_w = os.pipe()  # a hands the turn to b
    procs = {"lockstep a": _spawn(cores[0], 0, args, deadline, start, a_r, a_w),
             "lockstep b": _spawn(cores[0], 0, args, deadline, start, b_r, b_w)}
    for fd in (a_r, a_w, b_r):  # the parent keeps b_w only to hand a its first turn
        os.close(fd)
    for g in range(1, ngpu):
        procs[f"free gpu{g} cpu{cores[g]}"] = _spawn(cores[g], g, args, deadline, start)
    while time.time() < start:
        time.sleep(0.05)
    os.write(b_w, b"t")  # a's first turn
    os.close(b_w)
    samples = _sample(cores, args.seconds)
    series = {name: json.loads(proc.communicate(timeout=120)[0] or "[]") for name, proc in procs.items()}
    _report(series, samples, cores)
    return 0


def _report(series: dict[str, list[list[float]]], samples: list[dict[str, object]], cores: list[int]) -> None:
    seconds = {name: _per_second([(t, us) for t, us in s]) for name, s in series.items() if s}
    for name, s in series.items():
        us = [u for _, u in s]
        if not us:
            print(f"{name}: no bursts")
            continue
        med = statistics.median(us)
        slow = sum(u > 1.2 * med for u in us) / len(us)
        print(f"{name:<22} {len(us):>5} bursts, median {med:.3f} us a launch, slow share {slow:.1%}")
    names = list(seconds)
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            r = _corr(seconds[a], seconds[b])
            print(f"corr per second  {a} ~ {b}: {'n/a' if r is None else f'{r:+.2f}'}")
    a, b = series.get("lockstep a", []), series.get("lockstep b", [])
    diffs = [ub - ua for (_, ua), (_, ub) in zip(a, b)]
    if len(diffs) >= 10:
        m, sd = statistics.fmean(diffs), statistics.stdev(diffs)
        half = 1.96 * sd / len(diffs) ** 0.5
        print(f"lockstep b - a: {m:+.4f} us a launch [{m - half:+.4f}, {m + half:+.4f}] over {len(diffs)} turns "
              f"(sd of one turn {sd:.3f})")
    if samples:
        first, last = samples[0]["steal"], samples[-1]["steal"]
        print(f"cores {cores}: steal over the run {[z - y for y, z in zip(first, last)]} jiffies")  # type: ignore[call-overload]
    print("per second (t, medians of each loop, MHz of each core, SM MHz of each GPU):")
    for row in samples:
        sec = int(row["t"])  # type: ignore[call-overload]
        meds = [f"{seconds[n].get(sec, float('nan')):.2f}" for n in names]
        print(f"  {sec % 1000:>3} {' '.join(meds)}  mhz {row['mhz']}  sm {row['sm']}")


if __name__ == "__main__":
    sys.exit(main())
