"""RunHandle: what a front end (the Workbench, the TUI, a script) holds of one run, wherever
the run lives: in this process (`ddptop.run.session.Session`), in a supervisor process
(`ddptop.remote.viewer.RemoteSession`), or nowhere, scripted (`ddptop.tui.synthetic.StaticSession`).
A run that lives in a supervisor can outlive its front end: that is `DetachableRun`.
Typing only: no I/O, no UI.
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol, runtime_checkable

from ddptop.analysis.capture import Capture
from ddptop.model.config import RunConfig
from ddptop.model.state import RunState

__all__ = ["DetachableRun", "RestartRefused", "RunHandle", "SharedRun", "owns"]


class RunHandle(Protocol):
    """Read `state` (updated in place while the run goes), await `run()` once, ask."""

    @property
    def state(self) -> RunState: ...

    @property
    def config(self) -> RunConfig: ...

    @property
    def run_id(self) -> str: ...

    @property
    def run_dir(self) -> Path: ...

    @property
    def done(self) -> bool:
        """True once `run()` has returned (no process of the run is left)."""
        ...

    async def run(self) -> RunState:
        """Run to the end (or follow the run to its end) and return the final state."""
        ...

    def request_stop(self, reason: str = "stopped by user") -> None:
        """Ask every rank to stop at an agreed step; returns at once."""
        ...

    async def request_capture(self, count: int = 3) -> Capture:
        """Profile the next `count` steps on every rank; RuntimeError when it cannot."""
        ...


@runtime_checkable
class DetachableRun(RunHandle, Protocol):
    """A run held by a supervisor process: it can go on without this front end."""

    @property
    def owner(self) -> bool:
        """This front end's connection decides the run's life (until it is detached)."""
        ...

    @property
    def detached(self) -> bool: ...

    async def detach(self) -> None:
        """Let the run go on without this front end."""
        ...


@runtime_checkable
class SurvivesViewer(Protocol):
    """A run whose front end can say that it failed (not a quit), so that the run goes on."""

    def viewer_failed(self, reason: str) -> None:
        """This front end is ending through a fault of its own: the run goes on, detached."""
        ...


@runtime_checkable
class SharedRun(Protocol):
    """A run that several viewers may drive: its supervisor grants one restart at a time."""

    async def claim_restart(self, reason: str) -> str:
        """Ask for this run's restart: '' when granted (the run stops, and this front end
        starts the next), else why not ("a restart is already under way, from ...")."""
        ...


class RestartRefused(RuntimeError):
    """Another viewer's restart of the same run is under way: this one starts no run."""


def owns(handle: RunHandle) -> bool:
    """True when the run ends with this front end: an in-process (or scripted) run, or a
    supervised one this front end owns and has not detached."""
    if isinstance(handle, DetachableRun):
        return handle.owner and not handle.detached
    return True
