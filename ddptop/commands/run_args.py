"""ddptop's own command line (`ddptop [options] [-- CMD]`) and the RunConfig it gives: read by the
run itself (ddptop.cli) and by `ddptop cost`, which checks its ddptop arm's options with it before any
run. Must not import torch or textual."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ddptop import __version__
from ddptop.hw.devices import visible_gpus
from ddptop.model.config import RunConfig, apply_overrides, preset_config
from ddptop.model.usage import OneLineParser, UsageError
from ddptop.wire import protocol


def run_parser() -> argparse.ArgumentParser:
    p = OneLineParser(
        prog="ddptop",
        description="top for PyTorch DDP: launch a DDP job through torchrun and watch it per rank. "
        "Subcommands: presets, sweep, tune, nccl LOGFILE..., trace DIR|FILE..., topo, ls, attach [RUN_ID], "
        "cost -- CMD (what ddptop costs CMD against plain torchrun).",
        epilog="Run your own script: ddptop --nproc 2 -- python train.py ARGS "
        "(use ddptop.probe.Probe in it to report steps).",
    )
    p.add_argument("--version", action="version", version=f"ddptop {__version__}")
    p.add_argument("--nproc", type=int, help="ranks on this node (default: GPUs seen by NVML, else 2)")
    p.add_argument("--preset", help="starting settings (see `ddptop presets`; default: baseline, for a "
                   "script: asis, its own DDP arguments)")
    p.add_argument("--steps", type=int, help="optimizer steps per rank (a script: stopped after this many "
                   "steps after warmup; default: it runs to its own end)")
    p.add_argument("--warmup", type=int, help="steps left out of throughput figures")
    p.add_argument("--stop-grace", type=int, metavar="SECONDS",
                   help="after Ctrl-C, seconds the ranks have to finish their handlers (a checkpoint's "
                   "save) before SIGKILL (default 30, as torchrun)")
    p.add_argument("--batch-size", type=int, help="samples per rank per micro-batch")
    p.add_argument("--model", help="auto, vit_l_32, vit_b_32, vit_b_16, tiny_vit")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override any RunConfig field (repeatable), e.g. --set bucket_cap_mb=50")
    p.add_argument("--runs-dir", type=Path, default=Path("ddptop-runs"), help="where runs are recorded")
    p.add_argument("--headless", action="store_true", help="no TUI: status lines and a final table")
    p.add_argument("--json", action="store_true", help="headless: print summary.json as the last line")
    p.add_argument("--interval", type=float, default=3.0, help="headless: seconds between status lines")
    p.add_argument("--capture", action="append", default=[], metavar="STEP:COUNT",
                   help="profile COUNT steps from STEP on every rank (repeatable); on a live headless run "
                   "`kill -USR1 <ddptop pid>` captures 3 steps")
    p.add_argument("--cost", nargs="?", type=int, const=2000, metavar="STEPS",
                   help="measure what ddptop itself costs this run: after warmup, STEPS steps (default 2000) "
                   "alternate between the rank-side layer engaged and bypassed, with an A/A and a 0.5%% "
                   "spin as checks; then the run stops and prints the verdict")
    p.add_argument("--profiler", choices=("auto", "torch", "nsys"), default="auto",
                   help="capture with torch.profiler (auto, torch) or nsys (nsys: every rank then runs "
                   "inside `nsys profile` for the whole run, which slows kernel launches)")
    p.add_argument("--nsys-path", help="nsys binary to use for captures")
    p.add_argument("--detach", action="store_true",
                   help="start the run with no viewer; it survives this terminal (ddptop ls, ddptop attach)")
    m = p.add_argument_group("multi-node (torchrun's c10d rendezvous; node 0 prints the command for the others)")
    m.add_argument("--nnodes", type=int, help="nodes in the run (default 1; under srun: the step's nodes)")
    m.add_argument("--node-rank", type=int, help="this node, 0..nnodes-1; node 0 has the live view "
                   "(under srun: SLURM_NODEID)")
    m.add_argument("--rdzv-endpoint", metavar="HOST:PORT", help="node 0's address as the other nodes reach it")
    m.add_argument("--hub-port", type=int, help="node 0's hub port (default: the rendezvous port + 1)")
    m.add_argument("--hub-host", metavar="ADDR", help="node 0: the address its hub listens on (default: the "
                   "rendezvous endpoint's own address here; 0.0.0.0 or :: for every interface)")
    m.add_argument("--token-file", type=Path, help=f"a file (mode 600) holding the run's shared secret "
                   f"(default: ${protocol.ENV_TOKEN}; node 0 makes one when neither is set)")
    m.add_argument("--token", help="the secret itself: visible to every local user in `ps`; prefer "
                   f"${protocol.ENV_TOKEN} or --token-file")
    return p


def build_config(args: argparse.Namespace, script: bool = False) -> RunConfig:
    base = RunConfig(nproc=args.nproc if args.nproc is not None else _default_nproc(), script=script)
    changes = {
        "steps": args.steps, "warmup": args.warmup, "batch_size": args.batch_size, "model": args.model,
    }
    if script:  # a script's steps are counted after warmup; the trainer's fields mean nothing to it
        changes = {"script_steps": args.steps, "warmup": args.warmup}
    elif args.warmup is None and args.steps is not None:
        # short runs keep most of their steps measured unless told otherwise
        changes["warmup"] = min(base.warmup, max(args.steps, 0) // 4)
    base = base.with_changes(**{k: v for k, v in changes.items() if v is not None})
    if not script and args.steps is None and not getattr(args, "headless", True) and sys.stdout.isatty() \
            and getattr(args, "detach", False) is False and getattr(args, "cost", None) is None \
            and (getattr(args, "nnodes", None) or 1) == 1:  # every node must agree on the steps
        base = base.with_changes(until_stopped=True)  # the demo in a terminal: until stopped
    config = preset_config(args.preset or ("asis" if script else "baseline"), base)
    grace = getattr(args, "stop_grace", None)
    if grace is not None:
        if not 0 <= grace <= 3600:
            raise UsageError(f"--stop-grace must be 0-3600 seconds, got {grace}")
        config = config.with_changes(stop_grace=grace)
    cost = getattr(args, "cost", None)
    if cost is not None:  # one-step blocks (shorter than any step); --set may still change either
        if cost < 1:
            raise UsageError(f"--cost wants a number of steps, 1 or more, got {cost}")
        config = config.with_changes(cost_ab=0.001, cost_ab_blocks=cost)
    return apply_overrides(config, args.overrides)


def _default_nproc() -> int:
    return visible_gpus() or 2
