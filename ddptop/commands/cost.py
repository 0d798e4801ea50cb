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
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

from ddptop.analysis import cost_pairs
from ddptop.commands.batch import batch_dir, split_command
from ddptop.commands.cost_plan import Plan, RunRecord, cpu_lists
from ddptop.commands.cost_report import render
from ddptop.commands.cost_runs import run_one
from ddptop.hw.devices import visible_gpus
from ddptop.model.config import ConfigError, RunConfig, apply_overrides, preset_config
from ddptop.model.usage import USAGE_EXIT, OneLineParser, UsageError


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
    p.add_argument("--hooks-run", action=argparse.BooleanOptionalAction, default=True,
                   help="after the pairs, one more run under ddptop with --cost: the rank-side hooks' share on this "
                   "script (engaged vs bypassed), which the bill's prediction then uses (default on)")
    p.add_argument("--pin-main", action="store_true", help="with --lockstep: each rank's main thread on the first "
                   "of its CPUs in both jobs from its first step (a core's slow spells then fall on both)")
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
    if args.pin_main and not args.lockstep:
        raise UsageError("--pin-main is for --lockstep (both jobs' main threads on one core)")
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
    arm = arm_config(args.ddptop_args.split(), nproc, script=args.preset is None)
    plan = Plan(cmd=cmd, nproc=nproc, pairs=args.pairs, warmup=args.warmup, cpus=cpu_lists(args.cpus, nproc),
                timeout=args.timeout, ddptop_args=args.ddptop_args.split(), config=config, lockstep=args.lockstep,
                pin_main=args.pin_main, phase_every=arm.phase_every)
    return plan, args


def arm_config(ddptop_args: list[str], nproc: int, script: bool) -> RunConfig:
    """The ddptop arm's config from its --ddptop-args, read by ddptop's own parser: a mistake in
    them is a usage error now, not a failed run after the first plain one."""
    from ddptop.commands.run_args import build_config, run_parser

    if "--" in ddptop_args or any(a.split("=")[0] == "--nproc" for a in ddptop_args):
        raise UsageError("--ddptop-args: the ranks and the job are cost's own (--nproc, -- CMD)")
    try:
        return build_config(run_parser().parse_args([*ddptop_args, "--nproc", str(nproc)]), script=script)
    except (UsageError, ConfigError) as exc:
        raise UsageError(f"--ddptop-args: {exc}") from None


def _interrupt(signum: int, _frame: Any) -> None:
    raise KeyboardInterrupt(signal.Signals(signum).name)


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
    hooks = None
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
        if args.hooks_run:
            from ddptop.commands.cost_hooks import measure

            hooks = measure(records, plan, where, env, lambda line: print(line, flush=True))
    except KeyboardInterrupt:
        print("ddptop cost: interrupted; what was measured so far:", flush=True)
        code = 130
    data = render(records, plan, where, aa, hooks)
    (where / "cost.json").write_text(json.dumps(data["json"], indent=1))
    print(data["text"], flush=True)
    if args.json:
        print(json.dumps(data["json"]), flush=True)
    return code or (0 if data["json"]["result"] is not None else 1)
