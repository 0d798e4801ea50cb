"""What ddptop's instrumentation costs a training script: the same script's own throughput
(its own clock, synchronised at the end of warmup and at the end) run plainly under torchrun
and under ddptop, alternating plain/ddptop, pair after pair. The ratio ddptop/plain of each
pair is the cost; ddptop's own steps/s is reported beside it as a cross-check.

Workloads: `vit` (ddptop's trainer: ViT-L/32 on GPU, a tiny ViT on CPU, data made on the
device), `gpt` (bench/gpt_train.py), `seed` (the reference recipe, copied to .ref/; GPU only).
On a GPU machine (all its GPUs; carry .ref/ along for `seed`, it is not in the working tree):

    python bench/investigations/overhead_pairs.py --workload vit --nproc 8 [--preset baseline] [--set KEY=VALUE]
    python bench/investigations/overhead_pairs.py --workload gpt --nproc 8 --script-args "--compile"
    python bench/investigations/overhead_pairs.py --workload seed --nproc 8 --script-args "--static --view"
    ... [--pairs 3] [--steps 100] [--warmup 10] [--timeout 300] [--json-out pairs.json]

Exit codes: 0 every run completed, 1 a run failed (the table says which), 2 bad usage or
`seed` without a GPU. Of ddptop it imports only the config; ddptop and torchrun are children.

Question: what does ddptop cost a script, as whole runs plain vs under ddptop, pair by pair?
Answer (2026-11-23 to 2026-11-25, 1x H100, ViT-L/32): 0.928-0.942 before the loss-copy fix; after
the GPU comm path change, median 0.990 over 13 pairs (0.964-1.000) and 0.995 over 4 shuffled ones:
whole-run pairs resolve ~1%, not 0.5%. Measured since inside one run (bench/overhead_ab.py) and by
`ddptop cost` (ABBA whole runs). `bash bench/gpu_check.sh ovhpairs` / `ovhsplit` still run it.
Quoted in: docs/BENCHMARKS.md, "the default, 13 more pairs", "where the last 3.5% went, and the
fix", "the same script, plain vs under ddptop"; docs/GPU.md, "users' scripts, unchanged".
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import shlex
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
from ddptop.model.config import ConfigError, RunConfig, apply_overrides, preset_config  # noqa: E402

OWN_CLOCK = re.compile(r"\[trainer\] rank 0 completed after step \d+; own clock: ([\d.]+) steps/s")
SEED_RESULT = re.compile(r"RESULT (\{.*\})")
ERROR_LINE = re.compile(r"\w*(Error|Exception): |: error: ")  # a traceback's last line, argparse's
# NVLink multicast off (the lent GPU machines need it), unless the caller set these already
MULTICAST_OFF = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
                 "NVSHMEM_DISABLE_NVLS": "1"}


@dataclass
class Run:
    pair: int
    mode: str  # plain | ddptop | a --variant's name (ddptop with more environment)
    steps_per_s: float | None = None  # the script's own clock
    ddptop_steps_per_s: float | None = None  # ddptop's figure (its slowest rank); ddptop runs only
    error: str = ""
    wall_s: float = 0.0
    run_dir: str = ""


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workload", choices=("vit", "gpt", "seed"), default="vit")
    p.add_argument("--nproc", type=int, default=2)
    p.add_argument("--pairs", type=int, default=3)
    p.add_argument("--steps", type=int, default=100, help="measured steps, after warmup")
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--preset", default="baseline", help="vit: the DDP settings")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="ddptop's --set (vit: the plain run's config too)")
    p.add_argument("--script-args", default="", help="gpt/seed: extra script arguments, one string")
    p.add_argument("--seed-script", type=Path, default=ROOT / ".ref" / "seed_repro.py")
    p.add_argument("--timeout", type=float, default=300.0, help="seconds per run")
    p.add_argument("--shuffle", type=int, default=None, metavar="SEED",
                   help="run the modes of each pair in a random order (this seed): what runs after "
                        "what moved the ratio by more than the variants did (docs/BENCHMARKS.md)")
    p.add_argument("--pause", type=float, default=0.0, help="seconds of quiet before each run")
    p.add_argument("--runs-dir", type=Path,
                   default=Path(tempfile.gettempdir()) / "ddptop-overhead-pairs")
    p.add_argument("--json-out", type=Path)
    p.add_argument("--ddptop-env", action="append", default=[], metavar="KEY=VALUE",
                   help="environment for the ddptop runs only, to split the cost: DDPTOP_BOOT=0 runs "
                   "under ddptop with the rank-side instrument off")
    p.add_argument("--variant", action="append", default=[], metavar="NAME:KEY=VALUE[,KEY=VALUE]",
                   help="one more ddptop run per pair with this environment added, to split the cost "
                   "in one alternation, e.g. noinst:DDPTOP_BOOT=0, nofr:TORCH_NCCL_TRACE_BUFFER_SIZE=0; set.KEY=VALUE "
                   "is a ddptop setting instead (nocomm:set.comm_timing=false)")
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--script-args" in argv[:-1]:  # its value starts with "-": argparse would take it for an option
        i = argv.index("--script-args")
        argv[i : i + 2] = [f"--script-args={argv[i + 1]}"]
    return p.parse_args(argv)


def child_env() -> dict[str, str]:
    env = {**MULTICAST_OFF, **os.environ, "PYTHONUNBUFFERED": "1"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [env.get("PYTHONPATH")])])
    return env


def commands(args: argparse.Namespace, work: Path, out: Path) -> tuple[list[str], list[str]]:
    """(plain torchrun argv, ddptop argv) for one run of the workload."""
    py, total, warmup = sys.executable, args.steps + args.warmup, str(args.warmup)
    plain = [py, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={args.nproc}"]
    ddptop = [py, "-m", "ddptop", "--headless", "--json", "--nproc", str(args.nproc),
              "--steps", str(total), "--warmup", warmup, "--runs-dir", str(args.runs_dir)]
    ddptop += [arg for kv in args.overrides for arg in ("--set", kv)]
    extra = shlex.split(args.script_args)
    if args.workload == "vit":
        return ([*plain, "-m", "trainer", "--config", str(work / "config.json")],
                [*ddptop, "--preset", args.preset, "--set", "data=device"])
    if args.workload == "gpt":
        script = [str(ROOT / "bench" / "gpt_train.py"), "--steps", str(total), "--warmup", warmup,
                  *extra, "--out", str(out)]
    else:  # the recipe's --steps are the measured ones
        script = [str(args.seed_script), "--steps", str(args.steps), "--warmup", warmup, *extra]
    return plain + script, [*ddptop, "--", py, *script]


def own_rate(workload: str, text: str, out: Path) -> float:
    """The script's own steps/s from rank 0's output (gpt: its --out file); ValueError if none."""
    if workload == "gpt":
        if not out.exists():
            raise ValueError("no --out file")
        return float(json.loads(out.read_text())["steps_per_s"])
    found = (OWN_CLOCK if workload == "vit" else SEED_RESULT).search(text)
    if not found:
        raise ValueError(f"no {'own clock' if workload == 'vit' else 'RESULT'} line from rank 0")
    return float(found.group(1) if workload == "vit" else json.loads(found.group(1))["steps_per_s"])


def run_child(argv: list[str], env: dict[str, str], timeout: float) -> tuple[int | None, str, str]:
    """(exit code, None on timeout; stdout; stderr). On timeout: SIGTERM (torchrun and ddptop
    both stop their ranks on it), then SIGKILL whatever of the tree is left."""
    proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdin=subprocess.DEVNULL, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        out, err = proc.communicate(timeout=timeout)
        return proc.returncode, out, err
    except subprocess.TimeoutExpired:
        try:  # ranks live in sessions of their own: find them while torchrun still knows them
            tree = psutil.Process(proc.pid).children(recursive=True)
        except psutil.Error:
            tree = []
        proc.send_signal(signal.SIGTERM)
        try:
            out, err = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
        for p in tree:
            try:
                p.kill()
            except psutil.Error:
                pass
        return None, out, err


def cause(stderr: str) -> str:
    """The first error line a rank printed (torchrun's own failure box comes after it)."""
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    errors = [line for line in lines if ERROR_LINE.search(line) and "ChildFailedError" not in line]
    return (errors[0] if errors else lines[-1] if lines else "no output")[:200]


def measure(args: argparse.Namespace, work: Path, pair: int, mode: str) -> Run:
    run = Run(pair, mode)
    out = work / f"pair{pair}-{mode}.json"
    out.unlink(missing_ok=True)
    argv = commands(args, work, out)[mode != "plain"]
    # a variant's set.KEY=VALUE entries are ddptop settings (--set KEY=VALUE), the rest environment
    variant = args.variants.get(mode, [])
    sets = [arg for kv in variant if kv.startswith("set.") for arg in ("--set", kv[4:])]
    if sets:
        at = argv.index("--") if "--" in argv else len(argv)
        argv = [*argv[:at], *sets, *argv[at:]]
    t0 = time.monotonic()
    env = child_env()
    if mode != "plain":
        env.update(kv.split("=", 1) for kv in args.ddptop_env if "=" in kv)
        env.update(kv.split("=", 1) for kv in variant if "=" in kv and not kv.startswith("set."))
    rc, stdout, stderr = run_child(argv, env, args.timeout)
    run.wall_s = round(time.monotonic() - t0, 1)
    if rc is None:
        run.error = f"timed out after {args.timeout:g} s"
        return run
    text, note = stdout, cause(stderr)
    try:
        if mode != "plain":
            summary = json.loads(stdout.strip().splitlines()[-1])
            run.run_dir = str(args.runs_dir / summary["run_id"])
            run.ddptop_steps_per_s = summary.get("steps_per_s")
            note = f"ddptop says {summary.get('error')!r}"
            if rc != 0 or summary.get("status") != "completed":
                run.error = f"exit {rc}, status {summary.get('status')}; {note}"
                return run
            logs = sorted(Path(run.run_dir).glob("logs/*/attempt_0/0/stdout.log"))
            text = logs[-1].read_text() if logs else ""
        elif rc != 0:
            run.error = f"exit {rc}: {note}"
            return run
        run.steps_per_s = own_rate(args.workload, text, out)
    except (ValueError, KeyError, IndexError, OSError) as exc:  # bad JSON is a ValueError
        run.error = f"exit {rc}: {exc or type(exc).__name__}; {note}"
    return run


def fmt(value: float | None) -> str:
    return f"{value:.3f}" if value is not None else "-"


def report(runs: list[Run], modes: list[str]) -> dict:
    """Prints the Markdown table (one ratio to its pair's plain run per ddptop mode);
    returns the ratios with their median and min, per mode ("ddptop"'s at the top level)."""
    heads = [m for m in modes if m != "plain"]
    print("\n| pair | plain steps/s | " + " | ".join(f"{m} steps/s | ratio" for m in heads)
          + " | ddptop-measured steps/s |")
    print("|---|---|" + "---|---|" * len(heads) + "---|")
    ratios: dict[str, list[float]] = {m: [] for m in heads}
    n = len(modes)
    for i in range(0, len(runs), n):
        group = {run.mode: run for run in runs[i:i + n]}  # in the order they ran (--shuffle)
        plain = group["plain"]
        cells = [f"failed ({plain.error[:60]})" if plain.error else fmt(plain.steps_per_s)]
        for m in heads:
            run = group.get(m)
            ratio = (run.steps_per_s / plain.steps_per_s if run and plain.steps_per_s and run.steps_per_s
                     else None)
            ratios[m] += [ratio] if ratio is not None else []
            cells += [f"failed ({run.error[:60]})" if run and run.error else fmt(run and run.steps_per_s),
                      fmt(ratio)]
        ddp = group.get("ddptop")
        print(f"| {plain.pair} | {' | '.join(cells)} | {fmt(ddp.ddptop_steps_per_s if ddp else None)} |")
    stats: dict = {}
    for m in heads:
        r = ratios[m]
        one = {"ratios": r, "median_ratio": statistics.median(r) if r else None, "min_ratio": min(r) if r else None}
        print(f"ratio {m}/plain over {len(r)} of {len(runs) // n} pairs: "
              f"median {fmt(one['median_ratio'])}, min {fmt(one['min_ratio'])}")
        if m == "ddptop":
            stats.update(one)
        else:
            stats.setdefault("variants", {})[m] = one
    return stats


def usage_error(message: str) -> int:
    print(f"overhead_pairs: {message}", file=sys.stderr)
    return 2


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    args.runs_dir = args.runs_dir.resolve()
    args.variants = {}
    for spec in args.variant:
        name, _, envs = spec.partition(":")
        if not name or name in ("plain", "ddptop") or not envs:
            return usage_error(f"--variant {spec!r}: expected NAME:KEY=VALUE[,KEY=VALUE]")
        args.variants[name] = envs.split(",")
    if min(args.pairs, args.steps, args.nproc) < 1 or args.warmup < 0:
        return usage_error("--pairs, --steps and --nproc must be at least 1, --warmup 0 or more")
    if args.workload == "seed":
        import torch

        if not torch.cuda.is_available():
            return usage_error("the seed recipe needs a GPU (it calls torch.cuda); there is none here")
        args.seed_script = args.seed_script.resolve()
        if not args.seed_script.exists():
            return usage_error(f"no seed script at {args.seed_script} (copy "
                               "../shared/bench/seed_repro.py there, or pass --seed-script)")
    args.runs_dir.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="bench-", dir=args.runs_dir))  # configs, --out files
    if args.workload == "vit":
        base = RunConfig(nproc=args.nproc, steps=args.steps + args.warmup, warmup=args.warmup,
                         data="device")
        try:
            config = apply_overrides(preset_config(args.preset, base), args.overrides)
        except ConfigError as exc:
            return usage_error(str(exc))
        (work / "config.json").write_text(config.to_json())
    print(f"overhead_pairs: {args.workload}, {args.nproc} ranks, {args.pairs} pairs of "
          f"{args.steps} steps after {args.warmup} warmup; files in {work}", flush=True)
    runs = []
    modes = ["plain", "ddptop", *args.variants]
    order = random.Random(args.shuffle)
    for pair in range(1, args.pairs + 1):
        for mode in order.sample(modes, len(modes)) if args.shuffle is not None else modes:
            time.sleep(args.pause)
            run = measure(args, work, pair, mode)
            runs.append(run)
            own = f", ddptop's own {fmt(run.ddptop_steps_per_s)}, {run.run_dir}" if run.run_dir else ""
            result = f"FAILED: {run.error}" if run.error else f"{fmt(run.steps_per_s)} steps/s{own}"
            print(f"pair {pair} {mode:<6} {result} ({run.wall_s:.1f} s)", flush=True)
    stats = report(runs, modes)
    if args.json_out:
        settings = {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}
        doc = {"settings": settings, "runs": [asdict(r) for r in runs], **stats}
        args.json_out.write_text(json.dumps(doc, indent=2) + "\n")
    return 1 if any(r.error for r in runs) else 0


if __name__ == "__main__":
    sys.exit(main())
