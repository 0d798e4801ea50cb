"""The one factory of the TUI for the CLI, the tests and the screenshot script: a DdpTopApp
on a new run (through a supervisor, or in this process) or on a live run to attach to."""

from __future__ import annotations

from pathlib import Path

from ddptop.model.config import RunConfig
from ddptop.model.options import CaptureOptions
from ddptop.remote.live import LiveRun
from ddptop.remote.viewer import RemoteSession, supervised
from ddptop.run.handle import DetachableRun
from ddptop.run.session import Session
from ddptop.run.workbench import Workbench
from ddptop.tui.app import DdpTopApp
from ddptop.tui.closing import run_app
from ddptop.tui.views import REFRESH_S


def build_app(config: RunConfig, runs_dir: Path, user_cmd: list[str] | None = None,
              in_process: bool = False, capture: CaptureOptions | None = None,
              autostart: bool = True, refresh_s: float = REFRESH_S) -> DdpTopApp:
    """The one factory for the CLI, the tests and the screenshot script. Runs go through
    a supervisor (so they can be detached) unless `in_process`; each run takes `capture`
    (--capture windows, --profiler)."""
    bench = Workbench(config, Path(runs_dir), user_cmd, session_factory=(
        (lambda c, d, u: Session(c, d, user_cmd=u, capture=capture)) if in_process
        else supervised(capture=capture)))
    return DdpTopApp(bench, autostart=autostart, refresh_s=refresh_s)


def build_attach_app(entry: LiveRun, read_only: bool = False, viewer: str = "terminal",
                     autostart: bool = True, refresh_s: float = REFRESH_S) -> DdpTopApp:
    """A viewer of the live run `entry` (a watcher when `read_only`); runs started from it
    (settings, run again) are detached when that run was. `viewer` names it in the reasons
    of the stops and restarts it asks for."""
    session: DetachableRun = RemoteSession.attach(entry)
    bench = Workbench(session.config, Path(entry.runs_dir), entry.user_cmd,
                      session_factory=supervised(detached=entry.detached))
    bench.attach(session)
    return DdpTopApp(bench, read_only=read_only, viewer=viewer, autostart=autostart, refresh_s=refresh_s)


def run_tui(config: RunConfig, runs_dir: Path, user_cmd: list[str] | None = None,
            capture: CaptureOptions | None = None) -> int:
    return run_app(build_app(config, runs_dir, user_cmd, capture=capture))
