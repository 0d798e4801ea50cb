"""What ddptop's rank-side layer costs a script, measured inside one run (issue 27).

Each workload runs once under ddptop with `--set cost_ab=BLOCK_S`: after warmup its steps
are cut into blocks of ~BLOCK_S seconds, and every group of blocks runs each arm once in a
random order (the same on every rank): `on` (the layer engaged), `off` (bypassed: its
removable hooks removed, only steps counted), `aa` (off again: the A/A check) and `busy`
(off plus a calibrated 0.5% spin: the method must see it). Each arm is compared with `off`
of the same group; the groups' ratios give a median with a bootstrap 95% interval
(ddptop.analysis.cost_ab). Machine drift cancels inside a group; whole-run noise (5-10% on
the lent GPU machines) never enters.

Blocks are one step long by default (BLOCK_S 0.001 is shorter than any step): the scripts'
step times drift slowly (on the lent machines a step's time correlates 0.75-0.9 with the
next's and still ~0.4 with the one 12 steps on), so the closer in time two arms' steps are,
the more of the drift their ratio cancels. Cut one run's steps into blocks of L steps and the
A/A interval widens with L: 0.2-0.6% wide at L = 1, 1.5-3.5% at L = 12 (`bench/investigations/ab_block_length.py`,
docs/BENCHMARKS.md). The switch between arms (hooks removed or put back) happens between two
stamps, in no block's time.

    python bench/overhead_ab.py --workloads demo,gpt,gpt-compile,hf,lightning --nproc 2 \
        --blocks 2000 [--arms on,off,aa,busy] [--self-check demo] [--json-out ab.json]

What it does not see, by design: the launch environment (NCCL_DEBUG, the flight recorder,
TORCH_NCCL_ENABLE_TIMING, the sitecustomize import): bench/investigations/nccl_timing_cost.py measures NCCL's
timing per collective; a comm hook once registered and NCCL's completion hook cannot be
removed, so they run in both arms. Exit codes: 0 every run gave blocks, 1 a run did not, 2 usage.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from ddptop.run.cost_files import read_cost_blocks  # noqa: E402

PY = sys.executable
BIG = "1000000"  # a script's own step count: the cost blocks end the run
WORKLOADS = {
    "demo": [],  # ddptop's own trainer (ViT-L/32 on a GPU, a tiny ViT on CPU), its DataLoader
    "gpt": ["--", PY, "bench/gpt_train.py", "--steps", BIG],
    "gpt-compile": ["--", PY, "bench/gpt_train.py", "--compile", "--steps", BIG],
    "hf": ["--", PY, "bench/hf_train.py", "--steps", BIG],
    "lightning": ["--", PY, "bench/lightning_train.py", "--steps", BIG],
}
MULTICAST_OFF = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}


def run_one(name: str, args: argparse.Namespace, arms: str, runs_dir: str) -> dict:
    cmd = [PY, "-m", "ddptop", "--nproc", str(args.nproc), "--headless", "--json", "--interval", "60",
           "--warmup", str(args.warmup), "--runs-dir", runs_dir,
           "--set", f"cost_ab={args.block_s}", "--set", f"cost_ab_blocks={args.blocks}",
           "--set", f"cost_ab_arms={arms}", "--set", f"cost_ab_busy_pct={args.busy_pct}"]
    cmd += ["--set", "cost_ab_parts=true"] if args.parts else []
    cmd += ["--steps", BIG] if name == "demo" else WORKLOADS[name]
    env = {**os.environ, **{k: os.environ.get(k, v) for k, v in MULTICAST_OFF.items()}, "PYTHONUNBUFFERED": "1"}
    t0 = time.monotonic()
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=args.timeout)
    wall = time.monotonic() - t0
    run_dirs = sorted(Path(runs_dir).glob("*/cost_ab"))
    results = read_cost_blocks(run_dirs[0].parent, args.nproc)[0] if run_dirs else []
    summary = {}
    try:
        summary = json.loads(proc.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        pass
    out = {"workload": name, "arms": arms, "rc": proc.returncode, "wall_s": round(wall, 1),
           "status": summary.get("status"), "model": summary.get("model"), "ranks": len(results),
           "steps_per_block": results[0]["steps_per_block"] if results else None,
           "blocks": len(results[0]["blocks"]) if results else 0, "device": results[0]["device"] if results else None,
           # the run analysed its own blocks at its end (ddptop.run.cost_files): its summary's cost
           "costs": (summary.get("cost") or {}).get("arms") or [], "raw": results}
    if not results:
        out["tail"] = (proc.stdout + proc.stderr)[-3000:]
    return out


def hook_breakdown(results: list[dict]) -> list[tuple[str, float]]:
    """Each hook's host time per engaged step, mean over ranks, largest first."""
    acc: dict[str, list[float]] = {}
    for r in results:
        steps = sum(b["steps"] for b in r.get("blocks", []) if b["arm"] == "on")
        for name, h in ((r.get("hooks") or {}).get("on") or {}).items():
            if steps:
                acc.setdefault(name, []).append(h["ms"] * 1000.0 / steps)
    return sorted(((k, sum(v) / len(v)) for k, v in acc.items()), key=lambda kv: -kv[1])


def show(row: dict) -> None:
    print(f"== {row['workload']} ({row['model']}): {row['status']}, rc {row['rc']}, {row['ranks']} ranks x "
          f"{row['blocks']} blocks of {row['steps_per_block']} steps, {row['wall_s']} s")
    for c in row["costs"]:
        r, ms, cpu = c["ratio"], c["ms_per_step"], c["cpu_us_per_step"]
        print(f"   {c['arm']:<4} vs off: {ms['median'] * 1000:+8.1f} us/step/rank [{ms['lo'] * 1000:+.1f}, "
              f"{ms['hi'] * 1000:+.1f}] of {c['step_ms']:.2f} ms | ratio {r['median']:.4f} "
              f"[{r['lo']:.4f}, {r['hi']:.4f}] n={r['n']} | CPU {cpu['median']:+.0f} us/step | {c['verdict']}")
        t, h, gc = c.get("typical_ratio"), c.get("hook_us_per_step"), c.get("gc") or {}
        if t:
            print(f"        typical step (block medians): ratio {t['median']:.4f} [{t['lo']:.4f}, {t['hi']:.4f}]")
        if h:
            print(f"        host time in the layer's hooks: {h['median']:+.1f} us/step [{h['lo']:+.1f}, {h['hi']:+.1f}]"
                  f" | gc collections per 1000 steps {gc.get('arm', 0):.1f} vs off {gc.get('off', 0):.1f}"
                  f" ({gc.get('arm_ms_per_step', 0) * 1000:.1f} vs {gc.get('off_ms_per_step', 0) * 1000:.1f} us/step)")
    hooks = hook_breakdown(row.get("raw") or [])
    if hooks:
        print("        where the engaged layer's host time goes (us/step, mean of ranks): "
              + ", ".join(f"{name} {us:.1f}" for name, us in hooks[:8]))
    for r in (row.get("raw") or [])[:1]:
        on = (r.get("hooks") or {}).get("on") or {}
        slow = {k: h["slow"] for k, h in on.items() if h.get("slow")}
        print(f"        rank {r['rank']}: CUDA events made {r.get('events_created')}; calls over 20 us: "
              + (", ".join(f"{k} {n} of {on[k]['calls']}" for k, n in sorted(slow.items(), key=lambda kv: -kv[1])[:6])
                 or "none"))
    if row.get("tail"):
        print(row["tail"])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workloads", default="demo")
    p.add_argument("--nproc", type=int, default=2)
    p.add_argument("--block-s", type=float, default=0.001,
                   help="seconds a block; the default, shorter than any step, makes every block one step")
    p.add_argument("--blocks", type=int, default=200, help="blocks per run (all arms together)")
    p.add_argument("--arms", default="on,off,aa,busy")
    p.add_argument("--self-check", default="", help="workloads also run with arms off,aa,busy")
    p.add_argument("--busy-pct", type=float, default=0.5)
    p.add_argument("--parts", action="store_true", help="also time the hooks' parts (a diagnosis: it costs the on arm)")
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--timeout", type=float, default=600)
    p.add_argument("--json-out")
    args = p.parse_args(argv)
    names = [w for w in args.workloads.split(",") if w]
    checks = [w for w in args.self_check.split(",") if w]
    unknown = [w for w in names + checks if w not in WORKLOADS]
    if unknown:
        print(f"overhead_ab: unknown workload(s) {', '.join(unknown)} (valid: {', '.join(WORKLOADS)})", file=sys.stderr)
        return 2
    rows = []
    with tempfile.TemporaryDirectory(prefix="ddptop-ab-") as tmp:
        plan = [(w, "off,aa,busy") for w in checks] + [(w, args.arms) for w in names]
        for i, (name, arms) in enumerate(plan):
            try:
                row = run_one(name, args, arms, f"{tmp}/{i}")
            except subprocess.TimeoutExpired:
                row = {"workload": name, "arms": arms, "rc": 124, "costs": [], "status": "timeout"}
            rows.append(row)
            show(row | {k: row.get(k) for k in ("model", "ranks", "blocks", "steps_per_block", "wall_s")})
            if args.json_out:
                Path(args.json_out).write_text(json.dumps(rows, indent=1))
    return 0 if all(r.get("costs") for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
