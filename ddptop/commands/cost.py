"""`ddptop cost [OPTIONS] -- CMD`: how much slower the user's job runs under ddptop than under
plain torchrun, with everything ddptop turns on included (its monitor, torchrun's log capture,
env variables, the NCCL plugin, the rank-side hooks).

Whole runs of `torchrun --standalone --nproc-per-node N --no-python CMD` and of
`ddptop --nproc N --headless -- CMD` alternate in ABBA order on the same GPUs, each rank pinned
to the same CPUs in both arms. Both arms carry the same stamp (ddptop/rank/stamp: a timestamp
per optimizer step, nothing else), so a step is timed alike in both. The statistics are
analysis/cost_pairs'; the runs' stamps, stdout and stderr stay in `<runs-dir>/cost-<time>/`.
Must not import torch.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from ddptop.analysis import cost_pairs
from ddptop.commands.batch import batch_dir, split_command
from ddptop.commands.cost_plan import Plan, RunRecord, cpu_lists
from ddptop.commands.cost_report import render
from ddptop.hw.devices import visible_gpus
from ddptop.model.config import ConfigError, RunConfig, apply_overrides, preset_config
from ddptop.model.usage import USAGE_EXIT, OneLineParser, UsageError
from ddptop.run.launcher import die_with_parent

STAMP_DIR = Path(__file__).resolve().parents[1] / "rank" / "stamp"
PLAIN, DDPTOP = cost_pairs.PLAIN, cost_pairs.DDPTOP
STOP_GRACE_S = 30.0  # torchrun's own wait for its ranks after a signal


def cost_parser() -> OneLineParser:
    p = OneLineParser(
        prog="ddptop cost",
        description="How much slower CMD runs under ddptop than under plain torchrun: alternating whole "
        "runs (ABBA), ranks pinned alike, an A/A check from the adjacent plain runs. "
        "`ddptop cost [OPTIONS] -- python train.py ARGS`, or --preset NAME for the demo.")
    p.add_argument("--nproc", type=int, help="ranks (default: GPUs seen by NVML, else 2)")
    p.add_argument("--pairs", type=int, default=10, help="ABBA pairs of runs (default 10; 5 or more give an A/A)")
    p.add_argument("--warmup", type=int, help="optimizer steps left out at each run's start "
                   "(default: a fifth of the run, at least 5)")
    p.add_argument("--cpus", default="auto", help="each rank's CPUs in both arms: auto (this process's "
                   "CPUs split evenly), none, or lists like '0-7;8-15' (one per local rank)")
    p.add_argument("--timeout", type=float, default=900.0, help="seconds a run may take (default 900)")
    p.add_argument("--preset", help="run the demo trainer with this preset instead of CMD")
    p.add_argument("--steps", type=int, default=60, help="--preset: steps of each demo run (default 60)")
    p.add_argument("--ddptop-args", default="", help="options for the ddptop arm, e.g. '--set comm_timing_every=1'")
    p.add_argument("--runs-dir", type=Path, default=Path("ddptop-runs"), help="records go in RUNS_DIR/cost-<time>/")
    p.add_argument("--json", action="store_true", help="also print cost.json as the last line")
    p.add_argument("--lockstep", action="store_true", help="run both arms at once on the same GPUs and CPUs, "
                   "taking turns at each optimizer step (for launch-bound scripts on noisy hosts; --pairs rounds, "
                   "with a plain-beside-plain A/A round after every second one)")
    return p


def parse(argv: list[str]) -> tuple[Plan, argparse.Namespace]:
    own, cmd = split_command(argv)
    args = cost_parser().parse_args(own)
    if (cmd is None) == (args.preset is None):
        raise UsageError("give the job to measure after -- (ddptop cost -- python train.py) or --preset NAME")
    if args.pairs < 2:
        raise UsageError(f"--pairs must be at least 2, got {args.pairs}")
    if not 1.0 <= args.timeout <= 86400:
        raise UsageError(f"--timeout must be 1-86400 seconds, got {args.timeout:g}")
    if args.warmup is not None and args.warmup < 0:
        raise UsageError(f"--warmup must be 0 or more, got {args.warmup}")
    nproc = args.nproc if args.nproc is not None else (visible_gpus() or 2)
    if nproc < 1:
        raise UsageError(f"--nproc must be at least 1, got {nproc}")
    config = None
    if args.preset is not None:
        if args.steps < 10:
            raise UsageError(f"--steps must be at least 10, got {args.steps}")
        config = preset_config(args.preset, RunConfig(nproc=nproc, steps=args.steps, warmup=0))
        config = apply_overrides(config, [])
        cmd = [sys.executable, "-m", "trainer"]
    assert cmd is not None
    plan = Plan(cmd=cmd, nproc=nproc, pairs=args.pairs, warmup=args.warmup, cpus=cpu_lists(args.cpus, nproc),
                timeout=args.timeout, ddptop_args=args.ddptop_args.split(), config=config, lockstep=args.lockstep)
    return plan, args


def arm_argv(arm: str, plan: Plan, runs_dir: Path) -> list[str]:
    if arm != DDPTOP:  # plain, or the second plain job of a lock-step A/A
        return [sys.executable, "-m", "torch.distributed.run", "--standalone",
                f"--nproc-per-node={plan.nproc}", "--no-python", "--", *plan.cmd]
    return [sys.executable, "-m", "ddptop", "--nproc", str(plan.nproc), "--headless", "--json",
            "--interval", "3600", "--runs-dir", str(runs_dir), *plan.ddptop_args, "--", *plan.cmd]


def arm_env(plan: Plan, stamp: Path, base: dict[str, str]) -> dict[str, str]:
    env = dict(base)
    path = env.get("PYTHONPATH", "")
    env["PYTHONPATH"] = os.pathsep.join([str(STAMP_DIR), *([path] if path else [])])
    env["DDPTOP_STAMP"] = str(stamp)
    env["DDPTOP_STAMP_CPUS"] = ";".join(",".join(map(str, c)) for c in plan.cpus)
    return env


@dataclass
class Running:
    """One run of an arm, started: its process and where its records go."""
    pair: int
    arm: str
    proc: subprocess.Popen[bytes]
    out_dir: Path
    started: float
    files: tuple[Any, Any]


def launch(pair: int, arm: str, plan: Plan, where: Path, env: dict[str, str], tag: str | None = None,
           more_env: dict[str, str] | None = None) -> Running:
    out_dir = where / (tag or f"{pair:02d}-{arm}")
    out_dir.mkdir(mode=0o700)
    argv = arm_argv(arm, plan, out_dir / "runs")
    out, err = open(out_dir / "stdout.log", "wb"), open(out_dir / "stderr.log", "wb")
    # its own session (a terminal's Ctrl-C reaches this process first, which stops the run
    # as torchrun would); SIGTERM to it if this process dies, so no run outlives it
    proc = subprocess.Popen(argv, env={**arm_env(plan, out_dir / "stamp", env), **(more_env or {})}, stdout=out,
                            stderr=err, stdin=subprocess.DEVNULL, start_new_session=True,
                            preexec_fn=die_with_parent if sys.platform == "linux" else None)
    return Running(pair, arm, proc, out_dir, time.monotonic(), (out, err))


def collect(run: Running, rc: int, plan: Plan) -> RunRecord:
    """The run's record once it ended (rc): its stamps, the ranks' stderr, ddptop's own summary."""
    for f in run.files:
        f.close()
    reap(str(run.out_dir / "stamp"))
    wall = time.monotonic() - run.started
    ranks, starts = read_stamps(run.out_dir)
    ddptop_arm = run.arm == DDPTOP
    summary = _last_json(run.out_dir / "stdout.log") if ddptop_arm else None
    stderr = (run.out_dir / "stderr.log").read_text(errors="replace").splitlines()
    if ddptop_arm:
        stderr = [line for f in sorted((run.out_dir / "runs").glob("*/logs/**/stderr.log"))
                  for line in f.read_text(errors="replace").splitlines()]
    record = RunRecord(run.pair, run.arm, rc, wall, ranks, stderr, summary, starts=starts)
    record.step_ms = cost_pairs.run_step_ms(ranks, plan.warmup) if rc == 0 and len(ranks) == plan.nproc else None
    if ddptop_arm:
        record.allreduces, record.every, record.nccl_timing = _ddptop_counts(run.out_dir / "runs")
    return record


def run_one(pair: int, arm: str, plan: Plan, where: Path, env: dict[str, str]) -> RunRecord:
    run = launch(pair, arm, plan, where, env)
    rc = -1
    try:
        rc = _wait(run.proc, plan.timeout)
    finally:
        record = collect(run, rc, plan)
    return record


def _ddptop_counts(runs: Path) -> tuple[float | None, int, bool]:
    """All-reduces a step (the mean of rank 0's `buckets`: none where nothing timed them),
    comm_timing_every and nccl_timing, from the ddptop arm's own records."""
    counts: list[float] = []
    every, nccl_timing = 10, False
    for run in runs.glob("*/"):
        try:
            config = json.loads((run / "config.json").read_text())
            every = int(config.get("comm_timing_every", every))
            nccl_timing = bool(config.get("comm_timing", True) and config.get("nccl_timing", nccl_timing))
            with open(run / "steps.jsonl") as f:
                for line in f:
                    rec = json.loads(line)
                    if rec.get("rank") == 0 and isinstance(rec.get("buckets"), (int, float)):
                        counts.append(float(rec["buckets"]))
        except (OSError, ValueError, TypeError, AttributeError):
            continue
    return (sum(counts) / len(counts) if counts else None), every, nccl_timing


def _wait(proc: subprocess.Popen[bytes], timeout: float) -> int:
    """The run's exit code; past `timeout`, or on Ctrl-C, its group gets SIGINT, then SIGKILL
    after torchrun's own grace."""
    try:
        return proc.wait(timeout)
    except subprocess.TimeoutExpired:
        _end(proc)
        return -1
    except KeyboardInterrupt:
        _end(proc)
        raise


def stop(proc: subprocess.Popen[bytes]) -> None:
    """Ends a run's process group as a Ctrl-C would: SIGINT, SIGKILL after torchrun's own grace."""
    _end(proc)


def _end(proc: subprocess.Popen[bytes]) -> None:
    for sig, wait in ((signal.SIGINT, STOP_GRACE_S), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(proc.pid, sig)
            proc.wait(wait)
            return
        except ProcessLookupError:
            return
        except subprocess.TimeoutExpired:
            continue


def reap(stamp: str) -> list[int]:
    """Ends what is left of one run: any process of this user whose environment carries the
    run's DDPTOP_STAMP (a rank torchrun left behind when it died first, in either arm), with
    what it started, as the keeper ends a run (SIGTERM, SIGKILL after 5 s). Returns their pids."""
    import psutil

    from ddptop.run.keeper import end_all, start_ticks

    told: dict[int, int] = {}
    for p in psutil.process_iter(["uids"]):
        try:
            if p.info["uids"] and p.info["uids"].real == os.getuid() and p.environ().get("DDPTOP_STAMP") == stamp:
                started = start_ticks(p.pid)
                if started is not None:
                    told[p.pid] = started
        except psutil.Error:
            continue
    if told:
        end_all(told, wait_s=5.0)
    return list(told)


def _interrupt(signum: int, _frame: Any) -> None:
    raise KeyboardInterrupt(signal.Signals(signum).name)


def read_stamps(out_dir: Path) -> tuple[dict[int, list[float]], dict[int, list[float]]]:
    """Each rank's step ends and (`--lockstep`) the times its turns came back."""
    ranks: dict[int, list[float]] = {}
    starts: dict[int, list[float]] = {}
    for f in out_dir.glob("stamp.rank*.json"):
        try:
            data = json.loads(f.read_text())
            rank = int(data["rank"])
            ranks[rank] = [float(x) for x in data["stamps"]]
            starts[rank] = [float(x) for x in data.get("starts", [])]
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            continue
    return ranks, starts


def _last_json(path: Path) -> dict[str, Any] | None:
    for line in reversed(path.read_text(errors="replace").splitlines()):
        if line.startswith("{"):
            try:
                return json.loads(line)
            except ValueError:
                return None
    return None


def main_cost(argv: list[str]) -> int:
    for sig in (signal.SIGTERM, signal.SIGHUP):  # the terminal or a kill: end the run in hand, report
        signal.signal(sig, _interrupt)
    try:
        return _main_cost(argv)
    except KeyboardInterrupt:  # before any run started: nothing to end or report
        return 130


def _main_cost(argv: list[str]) -> int:
    try:
        plan, args = parse(argv)
        from ddptop.run.recorder import check_writable

        problem = check_writable(args.runs_dir)
        if problem:
            raise UsageError(problem)
    except (UsageError, ConfigError) as exc:
        print(f"ddptop: error: {exc}", file=sys.stderr)
        return USAGE_EXIT
    where = batch_dir(args.runs_dir, "cost")
    env = dict(os.environ)
    if plan.config is not None:  # the demo reads its config from this file in both arms
        (where / "config.json").write_text(plan.config.to_json())
        plan = replace(plan, cmd=[*plan.cmd, "--config", str(where / "config.json")])
    how = "lock-step rounds (both arms at once, in turns)" if plan.lockstep else "ABBA pairs of whole runs"
    print(f"ddptop cost: {plan.pairs} {how}, {plan.nproc} rank(s), `{' '.join(plan.cmd)}`; "
          f"records in {where}", flush=True)
    records: list[RunRecord] = []
    aa: list[tuple[float, float]] = []
    code = 0
    try:
        if plan.lockstep:
            from ddptop.commands.cost_lockstep import run_all

            run_all(plan, where, env, lambda line: print(line, flush=True), records, aa)
        for pair, arm in [] if plan.lockstep else cost_pairs.schedule(plan.pairs):
            record = run_one(pair, arm, plan, where, env)
            records.append(record)
            shown = "no steps stamped" if record.step_ms is None else f"{record.step_ms:.3f} ms/step"
            print(f"  pair {pair + 1:>2} {arm:<6} rc={record.rc} {shown}  ({record.wall_s:.1f} s)", flush=True)
    except KeyboardInterrupt:
        print("ddptop cost: interrupted; what was measured so far:", flush=True)
        code = 130
    data = render(records, plan, where, aa)
    (where / "cost.json").write_text(json.dumps(data["json"], indent=1))
    print(data["text"], flush=True)
    if args.json:
        print(json.dumps(data["json"]), flush=True)
    return code or (0 if data["json"]["result"] is not None else 1)
