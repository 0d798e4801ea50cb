"""Where a rank's main thread spends its time in ddptop's frames: py-spy on rank 0 of a live run.

    python bench/investigations/rank_spy.py [--nproc 1] [--ddptop-args '--set phase_every=4'] [--wait 25]
        [--duration 15] [--rate 1000] [--native] [--py-spy PATH] [--out DIR] -- python train.py ARGS

Starts `ddptop --headless` on the script, waits `--wait` seconds (start-up, warmup), records rank 0's
threads with py-spy (`record --format raw --threads`, non-blocking: the rank is never paused) for
`--duration` seconds (with `--native`, blocking: py-spy reads native stacks only from a paused
process, so the rank runs slower while it is read), then stops the run (SIGINT, as Ctrl-C). From the raw stacks: the main thread's
samples, the share with a ddptop frame in them, the ddptop entry points (the outermost ddptop frame of
each sample) and the leaf frames inside them (with `--native`, a CUDA driver call shows there). A
share times the step time is the host time ddptop's hooks hold a step, the in-run A/B's figure
read another way (no engaged/bypassed switch). py-spy is not a dependency: give its binary.

Question: on a GPU host, which of the rank-side layer's calls hold the main thread, and how much of
it does `--set phase_every=K` take away (the in-run A/B put the char GPT's hooks at +0.7 ms a step at
one rank, a CUDA-event stamp at ~20 us of host time, against 2-3 us for the CUDA call alone)?
Answer: not yet run on a GPU (session 16 planned it). On the 2-core CPU VM the tiny CPU GPT read
2.11% of the main thread in ddptop frames at K = 1 and 0.79% at K = 4 (session 15, docs/BENCHMARKS.md).
Quoted in: docs/BENCHMARKS.md, "2026-11-28 (session 15), 1x H200 (16 CPUs), torch 2.11.0+cu130, NCCL 2.28.9, and the 2-core CPU VM".
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path


def rank0_pid(ddptop_pid: int) -> int | None:
    """The process under ddptop's run with LOCAL_RANK=0 and ddptop's token in its environment."""
    import psutil

    for proc in psutil.Process(ddptop_pid).children(recursive=True):
        try:
            env = proc.environ()
        except (psutil.Error, OSError):
            continue
        if env.get("LOCAL_RANK") == "0" and any(k.startswith("DDPTOP_") for k in env) and "torchrun" not in " ".join(proc.cmdline()):
            return proc.pid
    return None


WRAPPERS = {"Instrument._call", "armed_after.<locals>.run"}  # a hook's guard and the stop's: the hook is below


def summarize(raw: Path) -> dict[str, object]:
    main = ours = 0
    entries: collections.Counter[str] = collections.Counter()
    leaves: collections.Counter[str] = collections.Counter()
    threads: collections.Counter[str] = collections.Counter()
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack:
            continue
        n, frames = int(count), stack.split(";")
        threads[frames[0].split(":")[-1].strip()] += n
        if "MainThread" not in frames[0]:
            continue
        main += n
        at = [i for i, f in enumerate(frames) if "ddptop/" in f and "(" in f]
        if at:
            ours += n
            names = [frames[i].split(" (")[0] for i in at]
            entries[next((f for f in names if f not in WRAPPERS), names[0])] += n
            leaves[frames[-1][:90]] += n
    pct = (lambda v: round(100.0 * v / main, 2)) if main else (lambda v: None)
    return {"main_samples": main, "ddptop_pct": pct(ours), "threads": dict(threads.most_common(8)),
            "entries_pct": {k: pct(v) for k, v in entries.most_common(10)},
            "leaves_pct": {k: pct(v) for k, v in leaves.most_common(12)}}


def main() -> int:
    argv = sys.argv[1:]
    cut = argv.index("--") if "--" in argv else len(argv)
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--nproc", type=int, default=1)
    p.add_argument("--ddptop-args", default="")
    p.add_argument("--wait", type=float, default=25.0)
    p.add_argument("--duration", type=float, default=15.0)
    p.add_argument("--rate", type=int, default=1000)
    p.add_argument("--native", action="store_true")
    p.add_argument("--py-spy", default=shutil.which("py-spy") or "py-spy")
    p.add_argument("--out", type=Path, default=Path("spy-out"))
    p.add_argument("--tag", default="run")
    args = p.parse_args(argv[:cut])
    script = argv[cut + 1:]
    if not script:
        p.error("give the job after --")
    args.out.mkdir(parents=True, exist_ok=True)
    runs = args.out / f"runs_{args.tag}"
    cmd = [sys.executable, "-m", "ddptop", "--headless", "--json", "--interval", "3600", "--nproc", str(args.nproc),
           "--runs-dir", str(runs), *args.ddptop_args.split(), "--", *script]
    log = (args.out / f"ddptop_{args.tag}.log").open("w")
    run = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    result: dict[str, object] = {"tag": args.tag, "cmd": cmd}
    try:
        time.sleep(args.wait)
        pid = rank0_pid(run.pid)
        if pid is None:
            result["error"] = "no rank 0 found (run ended?)"
        else:
            raw = args.out / f"spy_{args.tag}.txt"
            spy = [args.py_spy, "record", "-p", str(pid), "-r", str(args.rate), "-d", str(round(args.duration)), "-f", "raw",
                   "-o", str(raw), "--threads", *(["--native"] if args.native else ["--nonblocking"])]  # py-spy: native stacks pause the rank
            done = subprocess.run(spy, capture_output=True, text=True, timeout=args.duration + 60)
            result["py_spy_rc"] = done.returncode
            if done.returncode != 0 or not raw.exists():
                result["error"] = done.stderr[-600:]
            else:
                result.update(summarize(raw))
    finally:
        if run.poll() is None:
            os.killpg(run.pid, signal.SIGINT)
        try:
            run.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(run.pid, signal.SIGKILL)
            run.wait()
        log.close()
    tail = (args.out / f"ddptop_{args.tag}.log").read_text().splitlines()
    summary = next((json.loads(t) for t in reversed(tail) if t.startswith("{")), None) if tail else None
    if summary:
        result["step_ms_p50"] = summary.get("step_ms_p50")
        result["steps_per_s"] = summary.get("steps_per_s")
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
