"""`ddptop ... --detach`, `ddptop ls` and `ddptop attach`: starting a supervised run
with no viewer, listing live runs, and opening the TUI on one. Command-line glue
over ddptop.remote.live; the TUI is imported only when a viewer opens.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import socket
import sys
import time
from pathlib import Path

from ddptop.hw.terminal import output_width
from ddptop.model.config import RunConfig
from ddptop.model.options import CaptureOptions
from ddptop.model.report import fmt_step_rate, table
from ddptop.model.usage import USAGE_EXIT, OneLineParser, UsageError
from ddptop.remote.live import (
    PACKAGE_ROOT,
    LiveDirError,
    LiveRun,
    ensure_live_dir,
    find_run,
    live_runs,
    start_supervisor,
    supervisor_alive,
    supervisor_spec,
    wait_ready,
)
from ddptop.run.untrusted import read_json_object


def check_live_dir() -> Path:
    """The live directory, or a UsageError before anything starts."""
    try:
        return ensure_live_dir()
    except LiveDirError as exc:
        raise UsageError(str(exc)) from None


def start_detached(config: RunConfig, runs_dir: Path, user_cmd: list[str] | None,
                   capture: CaptureOptions, live: Path) -> int:
    """Start a supervisor that belongs to no terminal, say how to reach it, return."""
    from ddptop.run.session import new_run_id

    run_id = new_run_id(config.preset)
    spec = supervisor_spec(config, runs_dir, run_id, live, detached=True, user_cmd=user_cmd, capture=capture)
    proc = start_supervisor(spec, live)
    try:
        entry = wait_ready(proc, live, run_id)
    except RuntimeError as exc:
        print(f"ddptop: error: {exc}", file=sys.stderr)
        return 1
    print(f"ddptop: run {entry.run_id} started detached ({config.world_size} rank(s), preset "
          f"{config.preset}, supervisor pid {entry.pid})\n"
          f"  records: {entry.run_dir}\n"
          f"  socket:  {entry.socket}\n"
          f"  watch:   ddptop attach {entry.run_id}    (list: ddptop ls)", flush=True)
    return 0


def ls_parser() -> argparse.ArgumentParser:
    p = OneLineParser(prog="ddptop ls", description="live ddptop runs on this machine")
    p.add_argument("--json", action="store_true", help="one JSON list (no tokens)")
    return p


def main_ls(argv: list[str]) -> int:
    try:
        args = ls_parser().parse_args(argv)
        live = check_live_dir()
    except UsageError as exc:
        print(f"ddptop ls: error: {exc}", file=sys.stderr)
        return USAGE_EXIT
    runs = live_runs(live)
    if args.json:
        print(json.dumps([e.public() for e in runs]))
        return 0
    if not runs:
        print("no live ddptop runs (start one with `ddptop ... --detach`)")
        return 0
    print(ls_table(runs, time.time(), output_width()[0]))
    return 0


def ls_table(runs: list[LiveRun], now: float, width: int | None = None) -> str:
    """The live runs, fitted to `width`: the run dir wraps, then pid, mode and preset go."""
    head = ("run", "preset", "ranks", "step", "steps/s", "status", "mode", "viewers", "pid", "up", "run dir")
    rows = [(e.run_id, e.preset, str(e.world_size), str(e.step) if e.step >= 0 else "-",
             fmt_step_rate(e.steps_per_s), e.status, "detached" if e.detached else "owned", str(e.viewers),
             str(e.pid), f"{(now - e.started_at) / 60:.0f}m", e.run_dir) for e in runs]
    return table(head, rows, width, drop=("pid", "mode", "viewers"))


def attach_parser() -> argparse.ArgumentParser:
    p = OneLineParser(prog="ddptop attach", description="open the TUI on a live run (with its history so far)")
    p.add_argument("run_id", nargs="?", help="run id or a unique prefix (default: the latest live run)")
    p.add_argument("--web", action="store_true",
                   help="serve the TUI to a browser on 127.0.0.1 (textual-serve), e.g. through ssh -L")
    p.add_argument("--port", type=int, default=8000, help="--web: the port (default 8000)")
    p.add_argument("--read-only", action="store_true",
                   help="a watcher: cannot stop, restart, detach, capture or change settings "
                        "(with --web: every browser page)")
    return p


def main_attach(argv: list[str]) -> int:
    try:
        args = attach_parser().parse_args(argv)
        live = check_live_dir()
        try:
            entry = find_run(args.run_id, live)
        except LookupError as exc:
            raise UsageError(str(exc)) from None
        if args.web:
            check_port(args.port)
        # TEXTUAL_DRIVER: drawn by another driver than the terminal's (textual-serve's web driver)
        elif not sys.stdout.isatty() and not os.environ.get("TEXTUAL_DRIVER"):
            raise UsageError("attach opens the TUI and needs a terminal (or use --web)")
    except UsageError as exc:
        print(f"ddptop attach: error: {exc}", file=sys.stderr)
        return USAGE_EXIT
    if args.web:
        return serve_web(entry, args.port, read_only=args.read_only)
    from ddptop.tui.closing import run_app
    from ddptop.tui.factory import build_attach_app

    # Who asked for a stop or a restart goes into the run's log and summary.
    viewer = "web" if "web_driver" in os.environ.get("TEXTUAL_DRIVER", "") else "terminal"
    return run_app(build_attach_app(entry, read_only=args.read_only, viewer=viewer))


WEB_HOST = "127.0.0.1"  # never a public interface (= ddptop.remote.web.HOST, which needs textual-serve to import)


def check_port(port: int) -> None:
    if not 0 < port < 65536:
        raise UsageError(f"--port must be in 1-65535, got {port}")
    try:
        import textual_serve  # noqa: F401
    except ImportError:
        raise UsageError("--web needs textual-serve (pip install textual-serve)") from None
    with socket.socket() as probe:
        try:
            probe.bind((WEB_HOST, port))
        except OSError as exc:
            raise UsageError(f"--port {port}: {WEB_HOST}:{port} is not free ({exc.strerror or exc})") from None


def ended_note(entry: LiveRun) -> str:
    """'' while `entry`'s run is live; once it has ended, what a page opened then says."""
    if supervisor_alive(entry.pid):
        return ""
    summary = read_json_object(Path(entry.run_dir) / "summary.json") or {}
    status = summary.get("status") if isinstance(summary.get("status"), str) else "ended"
    return (f"ddptop: run {entry.run_id} has ended ({status}); nothing more to show here.\n"
            f"its records: {entry.run_dir}\n"
            f"this server can be stopped (Ctrl-C where `ddptop attach --web` runs).")


def viewer_argv(args: list[str]) -> list[str]:
    """`ddptop attach ARGS` as a web page's viewer runs it: this ddptop, whatever the folder
    the server was started in holds. `python -m ddptop` put that folder first on sys.path,
    where an unrelated `ddptop/` (the parent of a clone holds one) became the package: the
    viewer died on `cannot import name '__version__'` and the page stayed blank (issue 46).
    So the viewer puts this ddptop's root first itself, and gets it on PYTHONPATH as the
    supervisor does (ddptop.remote.web.ViewerService)."""
    boot = ("import sys; sys.path.insert(0, sys.argv.pop(1)); from ddptop.cli import main; "
            "sys.argv[0] = 'ddptop'; sys.exit(main())")
    return [sys.executable, "-c", boot, str(PACKAGE_ROOT), "attach", *args]


def serve_web(entry: LiveRun, port: int, read_only: bool = False) -> int:
    """Serve `ddptop attach RUN_ID` to browsers that hold this server's secret: each page
    load runs one viewer of the run (never its owner: closing a tab leaves the run alone).
    Until Ctrl-C."""
    from ddptop.remote.web import WebServer, new_token

    # The token is made here and stays in this process: never in a viewer's argv.
    flags = ["--read-only"] if read_only else []
    # exec: the viewer is the shell's process itself, which the server ends with its page
    command = "exec " + shlex.join(viewer_argv([*flags, entry.run_id]))
    server = WebServer(command, port, new_token(), title=f"ddptop {entry.run_id}",
                       ended=lambda: ended_note(entry))
    mode = "read-only: no page can stop, restart or change the run" if read_only else \
        "every page can stop and restart the run; --read-only for watchers"
    print(f"ddptop: serving run {entry.run_id} at {server.url}\n"
          f"  (Ctrl-C stops serving, not the run; {mode})\n"
          f"  from your machine: ssh -L {port}:{WEB_HOST}:{port} {socket.gethostname()}, then open that URL;\n"
          f"  it holds this server's secret: give it only to whom may "
          f"{'watch' if read_only else 'drive'} the run", flush=True)
    server.serve()
    return 0
