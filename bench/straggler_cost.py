"""Issue 44's table, re-run: does ddptop name the slow rank and its phase, and is the cost it
says within 25% of what the job really lost? Runs bench/gpt_train.py under ddptop once per
case (a symmetric run first and last, ranks made slow on purpose between), reads each run's
verdict from its summary and the script's own median step (rank 0's `step median`), and prints,
per case, the rank/phase/cost named beside the step-time loss against the symmetric runs.

  python bench/straggler_cost.py --nproc 4 [--steps 150] [--gpt-args "..."] [--cases "name=args;..."]
      [--set comm_timing_every=1] [--runs-dir DIR] [--json-out FILE] [--pause A:B]
  python bench/straggler_cost.py --rescore FILE    (an earlier --json-out's cases, scored again)

The default cases are the issue's, for 4 ranks: a loader sleeping 6 and 40 ms on rank 2, 8 and 30
extra 4096-matmuls in the forward of rank 3 and rank 1; and rank 0 reading `loss.item()` every
step (nanoGPT's logging: a sync that makes rank 0 launch each step late; every other case runs
without it, so that the symmetric runs are symmetric: session 9 found rank 0 named in one). On CPU (2 ranks), for instance:
  python bench/straggler_cost.py --nproc 2 --steps 100 --cases "sym=;slow50=--slow-rank 1 --slow-data-ms 50;sym2="
      --gpt-args "--data random --n-layer 1 --n-embd 32 --block 32 --batch-size 4 --vocab 256"
Symmetric runs of one call differ by 2-4 ms a step on 4x H200 (a rank's host late in most of
them, which rank changing run to run; session 11), so a loss read against other runs is often
unresolved. --pause A:B reads it in the same run instead: each injected case runs with its
slowness paused for timed steps A..B-1 (gpt_train.py --slow-pause), and its loss is its slow
steps' median less its paused steps' (rank 0's CUDA events), its two slow blocks' medians the
check for drift. With 360 timed steps, --pause 120:240: ddptop's run verdict is held on the
slow blocks' checks (two thirds), and its last finding comes from a window of slow steps.
(docs/GPU.md, "The straggler's cost to the job on 4 GPUs (issue 44, must-show 1)", quotes its output.)
"""

from __future__ import annotations

import argparse
import json
import re
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from ddptop.model.paired import Paired  # noqa: E402  (the rule's own pairing and host-late test)
from ddptop.model.straggler_work import host_late  # noqa: E402

CASES = ("sym=;load6=--slow-rank 2 --slow-data-ms 6;load40=--slow-rank 2 --slow-data-ms 40;"
         "mm8=--slow-rank 3 --slow-matmuls 8;mm30=--slow-rank 1 --slow-matmuls 30;item0=--item-every-step;sym2=")
# the shape: a small transformer whose GPU work sets the step (its table: forward 9.6 ms of
# a 31.0 ms step). nanoGPT's char config (--n-embd 384 --n-head 6 --batch-size 32) is launch-bound
# on an H200 (forward 1.3 ms of GPU work in a 19.4 ms step; session 8, docs/GPU.md): extra GPU work
# is free there and the ranks' hosts take turns being last, so it cannot check a cost against
# the symmetric runs. 768 wide, batch 64: ~7x its GPU work (an estimate; each case prints its phases)
GPT_ARGS = "--n-layer 6 --n-head 12 --n-embd 768 --block 256 --batch-size 64 --vocab 65 --no-item-every-step"


def own_ms(run_dir: Path) -> float | None:
    """The script's own median step after its warmup (rank 0's `step median` line; CUDA events
    on a GPU): the median, so a neighbour's spikes in one run do not move the baseline."""
    for path in run_dir.glob("logs/**/attempt_0/0/stdout.log"):
        found = re.search(r"step median ([0-9.]+) ms", path.read_text(errors="replace"))
        if found:
            return float(found.group(1))
    return None


def paused_ms(run_dir: Path) -> dict | None:
    """The same run's truth (gpt_train.py --slow-pause): rank 0's median step with the slowness
    on and paused, and each block's median (slow, paused, slow)."""
    for path in run_dir.glob("logs/**/attempt_0/0/stdout.log"):
        text = path.read_text(errors="replace")
        found = re.search(r"slow steps median ([0-9.]+) ms, paused ([0-9.]+) ms; blocks ([0-9., ]+)", text)
        if found:
            last = re.search(r"last \d+ steps median ([0-9.]+) ms", text)
            return {"slow": float(found.group(1)), "paused": float(found.group(2)),
                    "blocks": [float(b) for b in found.group(3).split(",") if b.strip()],
                    "last": float(last.group(1)) if last else None}
    return None


def measured_records(run_dir: Path, warmup: int) -> dict[int, list[dict]]:
    """step -> every rank's record of it, for the steps after warmup (steps.jsonl)."""
    by_step: dict[int, list[dict]] = {}
    path = run_dir / "steps.jsonl"
    if not path.is_file():
        return by_step
    for line in path.read_text(errors="replace").splitlines():
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if "step_ms" in rec and rec.get("step", -1) >= warmup:
            by_step.setdefault(rec["step"], []).append(rec)
    return by_step


def fastest_share(by_step: dict[int, list[dict]]) -> float | None:
    """The fastest rank's own work (step less its exposed wait) as a share of the step, median
    over the measured steps: near 1 where the GPUs' work sets the step; well under 1 in a
    launch-bound job, whose GPUs wait for their hosts (there the ranks' hosts take turns being
    last, and a GPU-side delay can cost nothing)."""
    shares = [min(r["step_ms"] - r.get("exposed_comm_ms", 0.0) for r in recs) / max(r["step_ms"] for r in recs)
              for recs in by_step.values() if len(recs) > 1 and max(r["step_ms"] for r in recs) > 0]
    return round(statistics.median(shares), 2) if shares else None


def host_gaps(by_step: dict[int, list[dict]]) -> dict[int, float]:
    """Each rank's median host time between its forward's return and backward (host_gap_ms):
    where a loader called there (nanoGPT's prefetch) spends its delay."""
    gaps: dict[int, list[float]] = {}
    for recs in by_step.values():
        for r in recs:
            if "host_gap_ms" in r:
                gaps.setdefault(r["rank"], []).append(r["host_gap_ms"])
    return {rank: round(statistics.median(v), 2) for rank, v in sorted(gaps.items())}


def late_hosts(by_step: dict[int, list[dict]]) -> dict[int, float]:
    """rank -> its data phase's median excess over the others', for the ranks whose host the
    rule calls late (straggler_work.host_late, on the same per-step pairs): a symmetric run with
    one is not symmetric (session 11: a late host cost its job 2-4 ms a step)."""
    windows: dict[int, dict[int, dict]] = {}
    for step, recs in by_step.items():
        for r in recs:
            windows.setdefault(r["rank"], {})[step] = r
    data = Paired(windows, lambda rec: rec.get("data_ms"))
    out = {}
    for rank, diffs in sorted(data.diffs.items()):
        if diffs:
            excess = statistics.median(diffs.values())
            if host_late("forward", excess, statistics.median(data.others[rank].values())):
                out[rank] = round(excess, 3)
    return out


def this_run(runs: Path, before: set[Path]) -> Path:
    """The run directory this run made under `runs` (a runs dir kept from an earlier call of
    the same case names holds older ones: session 11 read their steps as this run's)."""
    made = sorted(d for d in runs.iterdir() if d.is_dir() and d not in before) if runs.is_dir() else []
    if len(made) != 1:
        raise SystemExit(f"straggler_cost: expected one new run directory under {runs}, found {len(made)}")
    return made[0]


def run_case(args: argparse.Namespace, name: str, extra: str) -> dict:
    runs = Path(args.runs_dir) / name
    sets = [x for s in args.set for x in ("--set", s)]
    if args.pause and "--slow-rank" in extra:
        extra += f" --slow-pause {args.pause}"
    cmd = [sys.executable, "-m", "ddptop", "--headless", "--json", "--interval", "30", "--nproc", str(args.nproc),
           "--warmup", str(args.warmup), "--runs-dir", str(runs), *sets, "--", sys.executable,
           str(ROOT / "bench" / "gpt_train.py"), *shlex.split(args.gpt_args), "--steps", str(args.steps),
           "--warmup", str(args.warmup), *shlex.split(extra)]
    t0 = time.monotonic()
    before = set(runs.iterdir()) if runs.is_dir() else set()
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout)
    try:
        summary = json.loads(res.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        print(f"== {name}: rc={res.returncode}, no summary\n{res.stdout[-1500:]}{res.stderr[-1500:]}", flush=True)
        return {"case": name, "args": extra, "rc": res.returncode}
    run_dir = this_run(runs, before)
    by_step = measured_records(run_dir, args.warmup)
    check = summary.get("straggler_check") or {}
    lines = [ln for ln in res.stdout.splitlines()
             if ("straggler" in ln or "contended" in ln) and not ln.startswith(("{", "advice"))][-2:]
    slow = re.search(r"--slow-rank (\d+)", extra)
    # the loss read on rank 0 every step (gpt_train.py's `master`): rank 0 made late by its sync
    expected = int(slow.group(1)) if slow else 0 if re.search(r"--item-every-step\b", extra) else None
    return {"case": name, "args": extra, "rc": res.returncode, "wall_s": round(time.monotonic() - t0, 1),
            "own_ms": own_ms(run_dir), "paused": paused_ms(run_dir), "step_ms_p50": summary.get("step_ms_p50"),
            "fastest_share": fastest_share(by_step), "host_gap_ms": host_gaps(by_step),
            "late_host": late_hosts(by_step),
            "expected_rank": expected, "straggler": summary.get("straggler"),
            "text": check.get("text"), "now": check.get("now"), "held": check.get("held"),
            "latest": check.get("latest"), "host_cpu": summary.get("host_cpu"), "lines": lines,
            "ranks": [{k: r.get(k) for k in ("rank", "step_ms_p50", "phases_ms", "comm_ms_p50", "exposed_comm_ms_p50",
                                             "comm_timed_steps")} for r in summary.get("ranks", [])]}


def plan(cases: str, interleave: bool) -> list[str]:
    """The runs in order: the cases, or (interleaved) a symmetric run before each case that is
    not one and after the last, named sym1, sym2, ..."""
    specs = [c.strip() for c in cases.split(";") if c.strip()]
    if not interleave:
        return specs
    injected = [s for s in specs if not s.startswith("sym")]
    out = []
    for i, spec in enumerate(injected):
        out += [f"sym{i + 1}=", spec]
    return [*out, f"sym{len(injected) + 1}="]


def neighbours(results: list[dict], i: int) -> list[float]:
    """The symmetric runs right before and after case i (interleaved runs), their own ms."""
    if results[i]["case"].startswith("sym"):
        return []
    near = [results[j] for j in (i - 1, i + 1) if 0 <= j < len(results)]
    return [c["own_ms"] for c in near if c["case"].startswith("sym") and c.get("own_ms") is not None]


def verdict_row(case: dict, base: float | None, near: list[float] | None = None, fastest: float | None = None,
                near_words: str = "symmetric runs beside it") -> str:
    """One case scored: the rank and phase named against the injection's, the cost against
    the step time lost (against `base`: the symmetric runs beside it, `near`, where
    interleaved). Where those two symmetric runs differ by more than a quarter of the loss
    (or by more than the rule's floor, for a loss under it) the truth is unresolved: the rank
    and phase are scored, the cost and "should anyone be named" are not. `fastest`: the
    quickest symmetric run of the call, the job with no rank late (shown beside). With --pause,
    `base` is the run's own paused steps and `near` its two slow blocks (`near_words`): blocks
    that differ by more than a quarter of the loss say the run drifted."""
    s = case.get("straggler") or {}
    own = case.get("own_ms")
    lost = own - base if own is not None and base is not None else None
    cost = s.get("cost_ms")
    named = f"rank {s['rank']} {s['phase']} {cost:.1f} ms [{s['ci95_ms'][0]:.1f}-{s['ci95_ms'][1]:.1f}]" if s else "none"
    floor = max(2.0, 0.03 * base) if base is not None else 2.0  # the rule's floors (2 ms, 3% of the step)
    spread = abs(near[0] - near[1]) if near and len(near) == 2 else None
    unresolved = bool(spread is not None and lost is not None
                      and spread > (0.25 * abs(lost) if abs(lost) >= floor else floor))
    # a loss under the rule's floors is no straggler, whatever was injected (unless unresolved)
    small = lost is not None and lost < floor and not unresolved
    expected = None if small else case.get("expected_rank")
    # where the delay is: a loader's sleep lies between the forward's return and backward
    # (nanoGPT's prefetch), extra matmuls in the model's forward
    phase = (None if expected is None or "--slow-rank" not in case["args"] else
             "host between forward and backward" if "--slow-data-ms" in case["args"] else "forward")
    right = (s.get("rank") if s else None) == expected and (phase is None or s.get("phase") == phase)
    within = abs(cost - lost) <= 0.25 * abs(lost) if cost is not None and lost and not small else None
    if unresolved and near:
        score = f", truth unresolved ({near_words}: {near[0]:.2f} / {near[1]:.2f} ms)"
        verdict = ("none named" if not s else "right rank and phase" if right
                   else "named, none injected" if expected is None else "WRONG rank or phase")
    else:
        score = ('' if within is None else ', cost within 25%' if within else ', cost OFF by more than 25%')
        verdict = "right" if right else "WRONG"
    beside = f"  (vs the fastest symmetric run: {own - fastest:+.2f})" if own is not None and fastest is not None else ""
    share = case.get("fastest_share")
    return (f"{case['case']:<8} {own if own is not None else float('nan'):8.2f} "
            f"{lost if lost is not None else float('nan'):+8.2f} {share if share is not None else float('nan'):6.2f}  "
            f"{named:<40} {'none' if expected is None else f'rank {expected}' + (f' {phase}' if phase else '')} expected: "
            f"{verdict}{score}{beside}")


def window_row(case: dict, paused: dict) -> str:
    """The named cost against the loss in its own window: the run verdict's finding is its
    rank's last, over the run's last 50 steps, and a loss that grows through the run (a loader
    whose sleep overshoots more) is larger there than over both slow blocks."""
    lost, cost = paused["last"] - paused["paused"], case["straggler"]["cost_ms"]
    within = abs(cost - lost) <= 0.25 * abs(lost) if lost else False
    return (f"{'':<8} its window (the last 50 steps): {paused['last']:.2f} ms, lost {lost:+.2f}; "
            f"cost {cost:.1f}: {'within 25%' if within else 'OFF by more than 25%'}")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--nproc", type=int, default=4)
    p.add_argument("--steps", type=int, default=150)
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--gpt-args", default=GPT_ARGS)
    p.add_argument("--cases", default=CASES, help="name=gpt_train args;...  (names starting with sym: the baseline)")
    p.add_argument("--set", action="append", default=[], help="a ddptop --set for every run")
    p.add_argument("--runs-dir", default="/tmp/ddptop-straggler-cost")
    p.add_argument("--timeout", type=float, default=300)
    p.add_argument("--json-out", default=None)
    p.add_argument("--interleave", action=argparse.BooleanOptionalAction, default=True,
                   help="a symmetric run before each case and after the last; each case's loss is taken "
                        "against the two beside it (two symmetric runs of one call differed by 4 ms a step)")
    p.add_argument("--cpus-per-rank", type=int, default=0, help="pin each rank to its own CPUs (gpt_train.py)")
    p.add_argument("--pause", metavar="A:B", default=None,
                   help="each injected case pauses its slowness for timed steps A..B-1 (gpt_train.py "
                        "--slow-pause): its loss is read in the same run, slow steps against paused ones")
    p.add_argument("--rescore", metavar="JSON", help="score the cases of an earlier --json-out again; run nothing")
    args = p.parse_args()
    if args.cpus_per_rank:
        args.gpt_args += f" --cpus-per-rank {args.cpus_per_rank}"
    results = json.loads(Path(args.rescore).read_text())["cases"] if args.rescore else []
    for spec in [] if args.rescore else plan(args.cases, args.interleave):
        name, _, extra = spec.partition("=")
        case = run_case(args, name, extra)
        results.append(case)
        print(f"== {name} ({extra or 'symmetric'}): own {case.get('own_ms')} ms/step, verdict: {case.get('text')}; "
              f"host gap after forward (ms, per rank): {case.get('host_gap_ms')}; late host (rank: data excess ms): "
              f"{case.get('late_host')}", flush=True)
        for line in case.get("lines", []):
            print("   " + line[-300:], flush=True)
    syms = [c["own_ms"] for c in results if c["case"].startswith("sym") and c.get("own_ms") is not None]
    base = statistics.mean(syms) if syms else None
    print(f"\nsymmetric runs: {syms} ms/step (baseline {base})")
    print(f"{'case':<8} {'own ms':>8} {'lost ms':>8} {'GPU':>6}  named (cost, 95% CI)  "
          "(GPU: the fastest rank's own work / the step; well under 1: launch-bound; lost: against the "
          "symmetric runs beside the case where they were interleaved)")
    for i, case in enumerate(results):
        near = neighbours(results, i)
        paused = case.get("paused")
        if paused:  # the truth in the same run: its slow steps against its paused ones
            slow = [paused["blocks"][0], paused["blocks"][-1]]
            print(verdict_row({**case, "own_ms": paused["slow"]}, paused["paused"], slow, None, "slow blocks of the run"))
            if paused.get("last") is not None and case.get("straggler"):
                print(window_row(case, paused))
        else:
            print(verdict_row(case, statistics.mean(near) if near else base, near, min(syms) if syms else None))
    if args.json_out and not args.rescore:
        Path(args.json_out).write_text(json.dumps({"baseline_ms": base, "cases": results}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
