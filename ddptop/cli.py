"""Command line: parses into a RunConfig (or a subcommand) and hands it to a
runner. Every usage mistake is one line on stderr and exit code 2, before
anything starts. Must not import torch or textual at module level.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import math
import os
import secrets
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from ddptop.commands.run_args import build_config, run_parser
from ddptop.hw.devices import visible_gpus
from ddptop.model.config import ConfigError, RunConfig
from ddptop.model.options import CaptureOptions, NodeOptions, parse_endpoint
from ddptop.model.usage import USAGE_EXIT, UsageError
from ddptop.wire import protocol

if TYPE_CHECKING:
    from ddptop.run.slurm import SlurmStep

SUBCOMMANDS = ("presets", "nccl", "topo", "sweep", "tune", "ls", "attach", "trace", "cost")




def node_options(args: argparse.Namespace, environ: dict[str, str] | None = None) -> NodeOptions:
    """--nnodes/--node-rank/--rdzv-endpoint/--hub-port/--token, checked (UsageError)."""
    env = os.environ if environ is None else environ
    n = 1 if args.nnodes is None else args.nnodes
    r = 0 if args.node_rank is None else args.node_rank
    if n < 1:
        raise UsageError(f"--nnodes must be at least 1, got {n}")
    if not 0 <= r < n:
        raise UsageError(f"--node-rank must be in 0..{n - 1} for --nnodes {n}, got {r}")
    if n == 1:
        given = [flag for flag, value in (("--rdzv-endpoint", args.rdzv_endpoint), ("--hub-port", args.hub_port),
                                          ("--hub-host", args.hub_host), ("--token", args.token),
                                          ("--token-file", args.token_file))
                 if value is not None]
        if given:
            raise UsageError(f"{given[0]} is for multi-node runs (--nnodes 2 or more)")
        return NodeOptions()
    if not args.rdzv_endpoint:
        raise UsageError(f"--nnodes {n} needs --rdzv-endpoint HOST:PORT (node 0's address)")
    try:
        host, port = parse_endpoint(args.rdzv_endpoint)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    hub_port = args.hub_port if args.hub_port is not None else port + 1
    if args.hub_host is not None and r > 0:
        raise UsageError("--hub-host is where node 0's hub listens: give it on node 0 only")
    if args.hub_host is not None and not args.hub_host.strip():
        raise UsageError("--hub-host needs an address (0.0.0.0 or :: for every interface)")
    if not 0 < hub_port < 65536 or hub_port == port:
        raise UsageError(f"--hub-port must be in 1-65535 and not the rendezvous port, got {hub_port}")
    token = args.token if args.token is not None else env.get(protocol.ENV_TOKEN, "")
    if args.token_file is not None:
        token = read_token_file(args.token_file)
    if not token:
        if r > 0:
            raise UsageError(f"--node-rank {r} needs the run's --token (node 0 prints it with the join command)")
        token = secrets.token_hex(16)
    if len(token) > 200 or not token.isprintable() or any(c.isspace() for c in token):
        raise UsageError("--token must be 1-200 printable characters without spaces")
    if args.token is not None:
        print(f"ddptop: warning: --token is in this process's command line, which every local user can "
              f"read (ps); use {protocol.ENV_TOKEN}=... or --token-file", file=sys.stderr)
    return NodeOptions(nnodes=n, node_rank=r, rdzv_host=host, rdzv_port=port, hub_port=hub_port, token=token,
                       hub_host=(args.hub_host or "").strip().strip("[]"))


def read_token_file(path: Path) -> str:
    """The token from a file only its owner can read (else UsageError)."""
    try:
        st = path.stat()
        text = path.read_text().strip()
    except OSError as exc:
        raise UsageError(f"--token-file {path}: {exc.strerror or exc}") from None
    if st.st_mode & 0o077:
        raise UsageError(f"--token-file {path} can be read by other users (mode {st.st_mode & 0o777:o}): "
                         f"chmod 600 {path}")
    return text


def slurm_step(args: argparse.Namespace, env: dict[str, str]) -> SlurmStep | None:
    """Under `srun` on several nodes: what the command line left out, from SLURM_* (UsageError)."""
    from ddptop.run.slurm import apply_slurm

    try:
        return apply_slurm(args, env)
    except ValueError as exc:
        raise UsageError(str(exc)) from None


def check_node(node: NodeOptions, config: RunConfig, args: argparse.Namespace) -> NodeOptions:
    """`node`, checked; on node 0 with where its hub listens resolved (hub_host)."""
    if not node.multi:
        return node
    if not config.ddp:
        raise UsageError(f"preset {config.preset!r} is one process without DDP: it cannot span nodes")
    if node.node_rank > 0:
        if args.json:
            raise UsageError("--json: the summary is on node 0; other nodes only run their ranks")
        return node
    from ddptop.run.multinode import hub_bind_host, port_free

    try:
        bind = hub_bind_host(node)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    for flag, port in (("rendezvous", node.rdzv_port), ("hub", node.hub_port)):
        if not port_free(bind, port):
            raise UsageError(f"the {flag} port {port} is already in use on this machine")
    return dataclasses.replace(node, hub_host=bind)


def check_runs_dir(runs_dir: Path) -> None:
    """The runs dir can be written (made if missing): a UsageError if not."""
    from ddptop.run.recorder import check_writable

    problem = check_writable(runs_dir)
    if problem:
        raise UsageError(problem)


def check_runnable(config: RunConfig, args: argparse.Namespace) -> None:
    from ddptop.analysis.capture import parse_capture_spec
    from ddptop.run.nsys import find_nsys

    if args.json and not args.headless and sys.stdout.isatty():
        raise UsageError("--json needs --headless (the TUI owns the terminal)")
    for spec in args.capture:
        try:
            parse_capture_spec(spec, 2**31 if config.until_stopped else config.steps)
        except ValueError as exc:
            raise UsageError(str(exc)) from None
    if args.profiler == "nsys" and not find_nsys(args.nsys_path):
        raise UsageError("--profiler nsys: no nsys on PATH, in /opt/nvidia/nsight-systems*, CUDA or "
                         "Nsight Compute's host/target-linux-x64 (or not executable at --nsys-path)")
    if config.backend != "gloo" and config.ddp:
        gpus = visible_gpus()
        if gpus and config.nproc > gpus:
            raise UsageError(
                f"--nproc {config.nproc} is more than the {gpus} visible GPU(s); "
                "use fewer ranks or --set backend=gloo"
            )


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        if argv and argv[0] in SUBCOMMANDS:
            return run_subcommand(argv[0], argv[1:])
        user_cmd: list[str] | None = None
        if "--" in argv:
            cut = argv.index("--")
            argv, user_cmd = argv[:cut], argv[cut + 1 :]
            if not user_cmd:
                raise UsageError("nothing to run after --")
        args = run_parser().parse_args(argv)
        if not (math.isfinite(args.interval) and 0.1 <= args.interval <= 3600):
            raise UsageError(f"--interval must be 0.1-3600 seconds, got {args.interval:g}")
        config = build_config(args, script=bool(user_cmd))
        check_runnable(config, args)
        env = dict(os.environ)
        slurm = slurm_step(args, env)
        node = check_node(node_options(args, env), config, args)
        live = check_detach(args, node) if args.detach else None
        check_runs_dir(args.runs_dir)  # last: it creates the runs dir, so no usage error may follow
    except (UsageError, ConfigError) as exc:
        print(f"ddptop: error: {exc}", file=sys.stderr)
        return USAGE_EXIT
    if live is not None:
        from ddptop.commands.attach import start_detached

        return start_detached(config, args.runs_dir, user_cmd, capture_options(args, config), live)
    run_id = slurm.run_id(config.preset) if slurm else None
    if slurm:  # the others join by themselves: no join command, and no token in the job's output file
        from ddptop.run.slurm import describe

        print(describe(slurm, node.node_rank, env), flush=True)
    if node.multi and node.node_rank > 0:
        from ddptop.run.multinode import run_worker_node

        return asyncio.run(run_worker_node(config, node, args.runs_dir, user_cmd, interval=args.interval,
                                           run_id=run_id))
    if node.multi and not slurm:
        from ddptop.run.multinode import join_instructions

        print(join_instructions(config, node, user_cmd), flush=True)
    headless = args.headless or not sys.stdout.isatty()
    if headless:
        return run_headless_main(config, args, user_cmd, node, run_id)
    if node.multi:
        return run_node0_tui(config, args.runs_dir, user_cmd, node, capture_options(args, config), run_id)
    from ddptop.tui.factory import run_tui

    return run_tui(config, args.runs_dir, user_cmd, capture_options(args, config))


def check_detach(args: argparse.Namespace, node: NodeOptions) -> Path:
    """--detach: what it cannot be combined with, and a usable live directory."""
    from ddptop.commands.attach import check_live_dir

    for flag, given in (("--headless", args.headless), ("--json", args.json)):
        if given:
            raise UsageError(f"--detach runs without a terminal: {flag} does not apply (ddptop attach shows it)")
    if node.multi:
        raise UsageError("--detach is for single-node runs")
    return check_live_dir()


def run_node0_tui(config: RunConfig, runs_dir: Path, user_cmd: list[str] | None, node: NodeOptions,
                  capture: CaptureOptions | None = None, run_id: str | None = None) -> int:
    """Node 0's TUI runs its session in this process: the hub every node reports to lives
    and ends with it, like a plain run that belongs to its terminal."""
    from ddptop.run.session import Session
    from ddptop.run.workbench import Workbench
    from ddptop.tui.app import DdpTopApp

    ids = iter([run_id] if run_id else [])  # a Slurm run id names the first run only: a restart is another
    app = DdpTopApp(Workbench(config, runs_dir, user_cmd, lambda c, d, u: Session(
        c, d, user_cmd=u, node=node, capture=capture, run_id=next(ids, None))))
    result = app.run()
    return app.return_code or int(result or 0)


def run_headless_main(config: RunConfig, args: argparse.Namespace, user_cmd: list[str] | None,
                      node: NodeOptions | None = None, run_id: str | None = None) -> int:
    from ddptop.commands.headless import run_headless
    from ddptop.run.session import Session

    session = Session(config, args.runs_dir, user_cmd=user_cmd, capture=capture_options(args, config), node=node,
                      run_id=run_id)
    return asyncio.run(run_headless(session, interval=args.interval, as_json=args.json))


def capture_options(args: argparse.Namespace, config: RunConfig) -> CaptureOptions:
    from ddptop.analysis.capture import parse_capture_spec
    from ddptop.run.nsys import find_nsys

    # nsys only when asked for: it wraps every rank from its start (its CUDA and NVTX interception
    # is on whatever the capture range), which slows every kernel launch of the run (issue 42)
    nsys = find_nsys(args.nsys_path) if args.profiler == "nsys" and config.backend != "gloo" else None
    profiler = "nsys" if args.profiler == "nsys" else "torch"
    return CaptureOptions(
        windows=[parse_capture_spec(s, 2**31 if config.until_stopped else config.steps) for s in args.capture],
        profiler=profiler, nsys=nsys if profiler == "nsys" else None,
    )


def run_subcommand(name: str, argv: list[str]) -> int:
    if name == "presets":
        from ddptop.model.report import presets_table

        if argv:
            raise UsageError(f"presets takes no arguments, got {' '.join(argv)!r}")

        from ddptop.hw.terminal import output_width

        print(presets_table(output_width()[0]))
        return 0
    if name == "nccl":
        from ddptop.commands.nccl import main_nccl

        return main_nccl(argv)
    if name == "topo":
        from ddptop.commands.topo import main_topo

        return main_topo(argv)
    if name == "sweep":
        from ddptop.commands.sweep import main_sweep

        return main_sweep(argv)
    if name in ("ls", "attach"):
        from ddptop.commands.attach import main_attach, main_ls

        return (main_ls if name == "ls" else main_attach)(argv)
    if name == "trace":
        from ddptop.commands.trace import main_trace

        return main_trace(argv)
    if name == "tune":
        from ddptop.commands.tune import main_tune

        return main_tune(argv)
    if name == "cost":
        from ddptop.commands.cost import main_cost

        return main_cost(argv)
    raise UsageError(f"unknown subcommand {name}")


if __name__ == "__main__":
    sys.exit(main())
