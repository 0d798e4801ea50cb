"""Issue 47's scaling table: steps/s at N = 1, 2, 4... ranks for each preset (or a script), each
configuration run --repeat times in interleaved rounds, and the scaling efficiency each reaches:
samples/s at N over N x samples/s of one rank running the same per-rank batch (weak scaling, the
article's measure: its 8-GPU run kept 92% of one GPU's steps/s over NVLink and under 1/6 over
PCIe/shared memory).

  python bench/scaling.py --nprocs 1,2,4 --presets baseline,bf16-overlap [--steps 30] [--repeat 3]
      [--set KEY=VALUE] [--runs-dir DIR] [--json-out FILE] [-- python train.py ARGS]

Each run is `ddptop --headless --json --nproc N ...`; the one-rank reference is the demo's
`single` preset (no DDP) for the demo, and the script itself at --nproc 1 for a script. On the
2-core CPU VM (gloo, tiny ViT) for instance:
  python bench/scaling.py --nprocs 1,2 --presets baseline --steps 12 --warmup 3 --repeat 2 --set workers=0
(docs/GPU.md, "The preset ladder at N = 4", names the GPU call that runs it.)
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from ddptop.analysis.across_runs import across_interval, rounds  # noqa: E402

ARTICLE_8GPU = {"NVLink": 0.92, "PCIe/SHM": 1 / 6}  # steps/s at 8 GPUs over 1 GPU (DESIGN.md: "only 8% slower", ">6x slower")


def configs(nprocs: list[int], presets: list[str], script: list[str]) -> list[tuple[int, str]]:
    """(nproc, preset) per configuration; one rank runs `single` for the demo (the reference),
    a script runs as it is at every N."""
    if script:
        return [(n, "asis") for n in nprocs]
    out = [(1, "single")] if 1 in nprocs else []
    return out + [(n, p) for n in nprocs if n > 1 for p in presets]


def run_one(args: argparse.Namespace, nproc: int, preset: str, tag: str) -> dict:
    sets = [x for s in args.set for x in ("--set", s)]
    cmd = [sys.executable, "-m", "ddptop", "--headless", "--json", "--interval", "60", "--nproc", str(nproc),
           "--steps", str(args.steps), "--warmup", str(args.warmup), "--runs-dir", str(Path(args.runs_dir) / tag), *sets]
    cmd += ["--", *args.script] if args.script else ["--preset", preset]
    t0 = time.monotonic()
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout)
    try:
        s = json.loads(res.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return {"nproc": nproc, "preset": preset, "rc": res.returncode, "error": (res.stderr or res.stdout)[-400:]}
    return {"nproc": nproc, "preset": preset, "rc": res.returncode, "status": s.get("status"),
            "steps_per_s": s.get("steps_per_s"), "samples_per_s": s.get("samples_per_s"),
            "ci": s.get("steps_per_s_ci"), "wall_s": round(time.monotonic() - t0, 1)}


def table(results: list[dict], cfgs: list[tuple[int, str]]) -> list[dict]:
    """One row per configuration: median steps/s and samples/s over its runs, the steps/s
    interval across runs, and the efficiency against the one-rank reference's samples/s."""
    rows = []
    for nproc, preset in cfgs:
        runs = [r for r in results if (r["nproc"], r["preset"]) == (nproc, preset) and r.get("steps_per_s")]
        rates = [r["steps_per_s"] for r in runs]
        samples = [r["samples_per_s"] for r in runs if r.get("samples_per_s")]
        rows.append({"nproc": nproc, "preset": preset, "runs": len(runs),
                     "steps_per_s": statistics.median(rates) if rates else None,
                     "samples_per_s": statistics.median(samples) if samples else None,
                     "ci": across_interval(rates, [tuple(r["ci"]) if r.get("ci") else None for r in runs])})
    one = next((r["samples_per_s"] for r in rows if r["nproc"] == 1 and r["samples_per_s"]), None)
    for r in rows:
        r["efficiency"] = round(r["samples_per_s"] / (r["nproc"] * one), 3) if one and r["samples_per_s"] else None
    return rows


def render(rows: list[dict]) -> str:
    out = [f"{'N':>3}  {'preset':<14} {'runs':>4}  {'steps/s':>8}  {'95% CI across runs':<18} {'samples/s':>10}  efficiency",]
    for r in rows:
        ci = f"{r['ci'][0]:.2f}-{r['ci'][1]:.2f}" if r["ci"] else "n/a (one run)"
        sps = f"{r['steps_per_s']:.2f}" if r["steps_per_s"] is not None else "failed"
        smp = f"{r['samples_per_s']:.1f}" if r["samples_per_s"] is not None else "-"
        eff = f"{100 * r['efficiency']:.0f}%" if r["efficiency"] is not None else "-"
        out.append(f"{r['nproc']:>3}  {r['preset']:<14} {r['runs']:>4}  {sps:>8}  {ci:<18} {smp:>10}  {eff}")
    out.append("efficiency: samples/s at N / (N x samples/s of one rank); the article's 8-GPU ViT-L kept "
               + ", ".join(f"{k} {100 * v:.0f}%" for k, v in ARTICLE_8GPU.items()) + " of one GPU's steps/s")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    script = argv[argv.index("--") + 1:] if "--" in argv else []
    mine = argv[:argv.index("--")] if "--" in argv else argv
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--nprocs", default="1,2,4")
    p.add_argument("--presets", default="baseline,bf16-overlap")
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--warmup", type=int, default=8)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--set", action="append", default=[])
    p.add_argument("--runs-dir", default="/tmp/ddptop-scaling")
    p.add_argument("--timeout", type=float, default=300)
    p.add_argument("--json-out", default=None)
    args = p.parse_args(mine)
    args.script = script
    cfgs = configs([int(n) for n in args.nprocs.split(",")], args.presets.split(","), script)
    results = []
    for round_, i in rounds(len(cfgs), args.repeat):
        nproc, preset = cfgs[i]
        r = run_one(args, nproc, preset, f"n{nproc}-{preset}-r{round_}")
        results.append({"round": round_, **r})
        print(f"round {round_} N={nproc} {preset}: {r.get('status') or 'rc=' + str(r['rc'])} {r.get('steps_per_s')} steps/s",
              flush=True)
    rows = table(results, cfgs)
    print(render(rows))
    if args.json_out:
        Path(args.json_out).write_text(json.dumps({"rows": rows, "runs": results}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
