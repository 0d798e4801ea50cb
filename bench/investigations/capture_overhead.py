"""Does a capture window cost anything outside the window? Runs the same ddptop job
with and without `--capture`, alternating, and compares steps/s over the steps
outside the window (each rank's own CUDA-event step times, from steps.jsonl; the
run's figure is the slowest rank's, as ddptop reports it).

  python bench/investigations/capture_overhead.py --nproc 2 --steps 80 --capture 40:3 --rounds 2 [--runs-dir DIR] [-- ddptop args]

Question: does a capture window cost anything outside the window?
Answer (2026-11-22, 2x H200, baseline, NVLink): no, ratio 0.999 (plain 10.692 steps/s, with a
torch.profiler window 10.685). `bash bench/gpu_check.sh capovh` runs it.
Quoted in: docs/BENCHMARKS.md, "Capture windows cost nothing outside them (2x H200)"; docs/GPU.md,
"2026-11-22 (evening)".
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path


def steps_per_s(run_dir: Path, warmup: int, skip: range) -> float:
    """Slowest rank's steps/s over steps >= warmup, leaving out `skip` (the window and
    the step on each side, where the profiler starts and stops)."""
    per_rank: dict[int, list[float]] = {}
    for line in (run_dir / "steps.jsonl").read_text().splitlines():
        rec = json.loads(line)
        if rec["step"] >= warmup and rec["step"] not in skip:
            per_rank.setdefault(rec["rank"], []).append(rec["step_ms"])
    return min(len(v) / (sum(v) / 1000.0) for v in per_rank.values())


def run(args: argparse.Namespace, capture: bool, extra: list[str]) -> Path:
    cmd = [sys.executable, "-m", "ddptop", "--headless", "--json", "--interval", "60", "--nproc", str(args.nproc),
           "--preset", args.preset, "--steps", str(args.steps), "--warmup", str(args.warmup),
           "--runs-dir", str(args.runs_dir), *extra]
    if capture:
        cmd += ["--capture", args.capture, "--profiler", args.profiler]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout)
    summary = json.loads(res.stdout.strip().splitlines()[-1])
    if res.returncode != 0:
        raise SystemExit(f"run failed ({res.returncode}): {summary.get('error')}")
    if capture:
        caps = summary["captures"]
        print(f"  capture: {caps[0]['status']} {caps[0]['steps']} "
              f"{(caps[0].get('summary') or {}).get('timer_vs_trace_mean')}", flush=True)
    return args.runs_dir / summary["run_id"]


def main() -> None:
    argv = sys.argv[1:]
    extra = argv[argv.index("--") + 1:] if "--" in argv else []
    argv = argv[:argv.index("--")] if "--" in argv else argv
    p = argparse.ArgumentParser()
    p.add_argument("--nproc", type=int, default=2)
    p.add_argument("--preset", default="baseline")
    p.add_argument("--steps", type=int, default=80)
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--capture", default="40:3")
    p.add_argument("--profiler", default="torch")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--timeout", type=int, default=300)
    p.add_argument("--runs-dir", type=Path, default=Path("/tmp/ddptop-capture-bench"))
    args = p.parse_args(argv)
    start, count = map(int, args.capture.split(":"))
    skip = range(start - 1, start + count + 1)
    rates: dict[str, list[float]] = {"plain": [], "capture": []}
    for rnd in range(args.rounds):
        for label in ("plain", "capture"):
            rate = steps_per_s(run(args, label == "capture", extra), args.warmup, skip)
            rates[label].append(rate)
            print(f"round {rnd} {label:<8} {rate:.3f} steps/s outside steps {skip.start}-{skip.stop - 1}",
                  flush=True)
    plain, cap = statistics.median(rates["plain"]), statistics.median(rates["capture"])
    print(f"RESULT plain {plain:.3f} capture {cap:.3f} ratio {cap / plain:.3f} "
          f"(spread plain {min(rates['plain']):.3f}-{max(rates['plain']):.3f}, "
          f"capture {min(rates['capture']):.3f}-{max(rates['capture']):.3f})")


if __name__ == "__main__":
    main()
