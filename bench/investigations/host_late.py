"""Why one rank's host is late: each rank's threads read beside a run under ddptop.

On 4x H200 (session 11) nearly every symmetric run of bench/gpt_train.py had one rank whose GPU
sat idle at each step's start waiting for its host (its data phase +0.3-0.7 ms against the
others' 0.01, its forward +2-4 ms), which rank changing run to run, with no run-queue wait and its
main thread on a CPU 95% of the time. This runs the script under ddptop and, every
`--every` seconds, reads each rank's threads (/proc/<pid>/task/*/stat: CPU time, the CPU it last
ran on), each CPU's clock (/proc/cpuinfo) and its SMT siblings (sysfs topology); then, per rank:
its data phase's excess over the others (steps.jsonl: the late host's sign), its main thread's
CPU share, how many CPUs it moved between, the clock of the CPU it ran on, and the share of
readings where another busy thread of the job ran on that CPU's SMT sibling.

    python bench/investigations/host_late.py --nproc 4 [--runs 3] [--every 0.5] -- bench/gpt_train.py ARGS...

Question: is a late rank's host slower on its CPU (a lower clock, a busy SMT sibling such as its
own NCCL proxy thread, moving between CPUs), or is its main thread off the CPU?
Answer: nothing on the host tells the late rank apart (4x H200, session 13,
docs/measurements/2026-11-28-s13-call2): in 4 symmetric runs the late host was rank 0, 1, 3 or
none; every CPU read 2100 MHz, no CPU has an SMT sibling, and every main thread was on its CPU
0.93-0.99 of the time. The job is launch-bound: its slowest host sets the step, and which host is
slowest changes run to run and within a run (host_pace.py).
Quoted in: docs/GPU.md, "2026-11-28 (session 13)".
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import psutil

from ddptop.model.paired import Paired
from ddptop.model.straggler_work import HOST_LATE_MS

ROOT = Path(__file__).resolve().parents[2]
TICK = os.sysconf("SC_CLK_TCK")


def thread_stat(pid: int, tid: int) -> tuple[str, float, int] | None:
    """(name, CPU seconds, the CPU it last ran on) of one thread, None once it is gone."""
    try:
        raw = Path(f"/proc/{pid}/task/{tid}/stat").read_text()
    except OSError:
        return None
    name = raw[raw.index("(") + 1:raw.rindex(")")]
    f = raw[raw.rindex(")") + 2:].split()
    return name, (int(f[11]) + int(f[12])) / TICK, int(f[36])  # utime, stime; processor (field 39)


def rank_pids(root: int) -> dict[int, int]:
    """rank -> pid of the job's rank processes under `root`: torchrun's children, by the RANK
    in their environment (a DataLoader worker, a rank's child, is not one)."""
    found: dict[int, int] = {}
    try:
        procs = psutil.Process(root).children(recursive=True)
    except psutil.Error:
        return found
    for proc in procs:
        try:
            if "torch.distributed.run" not in " ".join(proc.parent().cmdline()):
                continue
            rank = proc.environ().get("RANK")
            if rank is not None:
                found[int(rank)] = proc.pid
        except (psutil.Error, ValueError, AttributeError):
            continue
    return found


def clocks() -> dict[int, float]:
    """CPU -> its clock in MHz, where /proc/cpuinfo gives it (not on every VM)."""
    out, cpu = {}, None
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "processor":
            cpu = int(value)
        elif key.strip() == "cpu MHz" and cpu is not None:
            out[cpu] = float(value)
    return out


def siblings() -> dict[int, set[int]]:
    out = {}
    for path in Path("/sys/devices/system/cpu").glob("cpu[0-9]*/topology/thread_siblings_list"):
        cpu = int(path.parent.parent.name[3:])
        mine: set[int] = set()
        for part in path.read_text().strip().split(","):
            a, _, b = part.partition("-")
            mine.update(range(int(a), int(b or a) + 1))
        out[cpu] = mine - {cpu}
    return out


def sample(pids: dict[int, int]) -> dict[int, dict[int, tuple[str, float, int]]]:
    """rank -> tid -> (name, CPU s, CPU)."""
    out: dict[int, dict[int, tuple[str, float, int]]] = {}
    for rank, pid in pids.items():
        try:
            tids = [int(t) for t in os.listdir(f"/proc/{pid}/task")]
        except OSError:
            continue
        out[rank] = {tid: st for tid in tids if (st := thread_stat(pid, tid)) is not None}
    return out


def summarize(readings: list[tuple[float, dict, dict[int, float]]], pids: dict[int, int],
              sib: dict[int, set[int]]) -> dict[int, dict]:
    """Per rank, from consecutive readings: its main thread's CPU share, the CPUs it ran on,
    their mean clock, and the share of intervals a busy thread of the job sat on a sibling."""
    out = {}
    for rank, pid in pids.items():
        share, cpus, mhz, shared = [], set(), [], 0
        intervals = 0
        for (t0, a, _), (t1, b, clock) in zip(readings, readings[1:]):
            if pid not in a.get(rank, {}) or pid not in b.get(rank, {}):
                continue
            intervals += 1
            share.append((b[rank][pid][1] - a[rank][pid][1]) / (t1 - t0))
            cpu = b[rank][pid][2]
            cpus.add(cpu)
            if cpu in clock:
                mhz.append(clock[cpu])
            busy = {st[2] for r, threads in b.items() for tid, st in threads.items()
                    if not (r == rank and tid == pid) and tid in a.get(r, {}) and st[1] > a[r][tid][1]}
            shared += bool(busy & sib.get(cpu, set()))
        out[rank] = {"main_cpu_share": round(statistics.median(share), 3) if share else None,
                     "cpus_visited": len(cpus), "mhz": round(statistics.mean(mhz)) if mhz else None,
                     "sibling_busy_share": round(shared / intervals, 2) if intervals else None}
    return out


def step_records(run_dir: Path, warmup: int = 0) -> dict[int, dict[int, dict]]:
    """rank -> step -> its step record (steps.jsonl), from step `warmup` on."""
    recs: dict[int, dict[int, dict]] = {}
    for line in (run_dir / "steps.jsonl").read_text().splitlines():
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if "step_ms" in rec and rec.get("step", -1) >= warmup:
            recs.setdefault(rec["rank"], {})[rec["step"]] = rec
    return recs


def data_excess(run_dir: Path, warmup: int) -> dict[int, float]:
    """rank -> its data phase's median excess over the others' median, per step (steps.jsonl),
    paired as the straggler rule pairs them (ddptop.model.paired.Paired)."""
    diffs = Paired(step_records(run_dir, warmup), lambda rec: rec.get("data_ms", 0.0)).diffs
    return {r: round(statistics.median(d.values()), 3) for r, d in sorted(diffs.items()) if d}


def one_run(args: argparse.Namespace, i: int, sib: dict[int, set[int]]) -> dict:
    runs = Path(args.runs_dir) / f"run{i}"
    cmd = [sys.executable, "-m", "ddptop", "--headless", "--interval", "60", "--nproc", str(args.nproc),
           "--warmup", str(args.warmup), "--runs-dir", str(runs), "--", sys.executable, *args.script]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=ROOT)
    pids: dict[int, int] = {}
    readings = []
    while proc.poll() is None:
        if len(pids) < args.nproc:
            pids = rank_pids(proc.pid)
        readings.append((time.monotonic(), sample(pids), clocks()))
        time.sleep(args.every)
    made = sorted(d for d in runs.iterdir() if d.is_dir()) if runs.is_dir() else []
    excess = data_excess(made[-1], args.warmup) if made else {}
    return {"run": i, "rc": proc.returncode, "data_excess_ms": excess, "ranks": summarize(readings, pids, sib)}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--nproc", type=int, default=4)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--every", type=float, default=0.5)
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--runs-dir", default="/tmp/ddptop-host-late")
    p.add_argument("--json-out")
    p.add_argument("script", nargs=argparse.REMAINDER, help="-- SCRIPT ARGS (run with this Python)")
    args = p.parse_args()
    args.script = args.script[1:] if args.script[:1] == ["--"] else args.script
    sib = siblings()
    print(f"SMT siblings: {'none' if not any(sib.values()) else sorted((c, sorted(s)) for c, s in sib.items())[:4]} ...")
    results = []
    for i in range(args.runs):
        res = one_run(args, i, sib)
        results.append(res)
        excess = res["data_excess_ms"]
        late = max(excess, key=excess.get) if excess and max(excess.values()) >= HOST_LATE_MS else None
        print(f"run {i} rc={res['rc']} data excess per rank (ms): {excess} -> late host: "
              f"{'none' if late is None else f'rank {late}'}")
        for rank, row in sorted(res["ranks"].items()):
            print(f"  rank {rank}{' (late)' if rank == late else ''}: {row}")
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
