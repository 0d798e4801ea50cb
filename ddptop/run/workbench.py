"""Workbench: the runs of one interactive ddptop session, for any front end.

It creates a session per config (through its factory: an in-process `Session`,
or a `ddptop.remote.viewer.RemoteSession` whose run lives in a supervisor process; both
are `ddptop.run.handle.RunHandle`s, and a supervised one is a `DetachableRun`),
remembers every run it started or attached to, knows the current one, and
stops/restarts/detaches runs cleanly. UI-free (no Textual) and torch-free: the
TUI gets one in its constructor and only calls these methods.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

from ddptop.analysis.capture import Capture
from ddptop.model.config import RunConfig
from ddptop.model.state import RunState
from ddptop.run import runs
from ddptop.run.handle import (
    DetachableRun,
    RestartRefused,
    RunHandle,
    SharedRun,
    SurvivesViewer,
    owns,
)
from ddptop.run.session import Session

# (config, runs directory, the user's command or None) -> a run not started yet
SessionFactory = Callable[[RunConfig, Path, "list[str] | None"], RunHandle]

STOP_TIMEOUT_S = 30.0  # a clean stop; after it the run task is cancelled (which kills the tree)


def _default_factory(config: RunConfig, runs_dir: Path, user_cmd: list[str] | None) -> RunHandle:
    return Session(config, runs_dir, user_cmd=user_cmd)


class Workbench:
    """Owns the sessions of one interactive ddptop process.

    The front end calls `new_session()` and awaits `run(session)` somewhere
    (a Textual worker), reads `current.state`, and calls `stop()`/`restart()`.
    """

    def __init__(
        self,
        config: RunConfig,
        runs_dir: Path,
        user_cmd: list[str] | None = None,
        session_factory: SessionFactory = _default_factory,
    ) -> None:
        self.config = config  # the config of the current (or next) run
        self.runs_dir = Path(runs_dir)
        self.user_cmd = user_cmd
        self.sessions: list[RunHandle] = []
        self.baseline_id: str | None = None  # chosen reference run for speedups (None: automatic)
        self._factory = session_factory
        self._ended: dict[str, asyncio.Event] = {}
        self._errors: dict[str, str] = {}
        self._earlier: list[runs.RunRow] = []  # the runs dir as last read (read_earlier_runs)

    # --- runs -------------------------------------------------------------------------
    @property
    def current(self) -> RunHandle | None:
        return self.sessions[-1] if self.sessions else None

    def new_session(self, config: RunConfig | None = None) -> RunHandle:
        """Create (not start) the next run; it becomes `current`."""
        if config is not None:
            self.config = config
        session = self._factory(self.config, self.runs_dir, self.user_cmd)
        self.sessions.append(session)
        self._ended[session.run_id] = asyncio.Event()
        return session

    def attach(self, session: RunHandle) -> RunHandle:
        """Make an existing run (e.g. a RemoteSession of a live supervisor) the current one."""
        self.config = session.config
        self.sessions.append(session)
        self._ended[session.run_id] = asyncio.Event()
        return session

    async def run(self, session: RunHandle) -> RunState:
        """Run `session` to its end. Marks it ended even if it never got going (a
        run directory that cannot be created raises before the session's own
        bookkeeping), so `stop()` never waits for a run that is not there."""
        try:
            return await session.run()
        except Exception as exc:
            self._errors[session.run_id] = f"{type(exc).__name__}: {exc}"
            raise
        finally:
            self._ended.setdefault(session.run_id, asyncio.Event()).set()

    def is_live(self, session: RunHandle | None = None) -> bool:
        """True while the run may still have processes (started or about to start)."""
        session = session or self.current
        if session is None:
            return False
        ended = self._ended.get(session.run_id)
        return not (session.done or (ended is not None and ended.is_set()))

    def owns_current(self) -> bool:
        """True when the current run ends with this front end (an in-process run, or a
        supervised one this viewer owns); False for a detached run or another's run."""
        session = self.current
        return session is not None and owns(session)

    def can_detach(self) -> bool:
        """True while the current run is live and can outlive this process (supervised)."""
        return self.is_live() and isinstance(self.current, DetachableRun)

    async def detach(self) -> str:
        """Let the current run go on without this front end; returns how to come back.
        RuntimeError when the run cannot outlive this process (in-process, or ended)."""
        session = self.current
        if not (isinstance(session, DetachableRun) and self.is_live(session)):
            raise RuntimeError("no live supervised run to detach")
        await session.detach()
        return f"run {session.run_id} goes on detached; watch it again with: ddptop attach {session.run_id}"

    def viewer_failed(self, why: str) -> str:
        """This front end is ending through a fault of its own (an exception), not a quit: a
        supervised run it owns goes on, detached. Returns what to tell the user ('' when no
        run of ours is live)."""
        session = self.current
        if session is None or not self.is_live(session) or not owns(session):
            return ""
        if isinstance(session, SurvivesViewer):
            session.viewer_failed(why)
            return (f"the viewer failed ({why}); run {session.run_id} goes on detached: "
                    f"ddptop attach {session.run_id}")
        return f"the viewer failed ({why}); its in-process run {session.run_id} ends with it"

    def error(self, session: RunHandle) -> str:
        """Why `session` failed to run at all ('' if it ran)."""
        return self._errors.get(session.run_id, "")

    def request_stop(self, reason: str = "stopped by user") -> None:
        """Ask the current run to stop at an agreed step; returns at once."""
        if self.current is not None and self.is_live():
            self.current.request_stop(reason)

    async def stop(self, reason: str = "stopped by user", timeout: float = STOP_TIMEOUT_S) -> bool:
        """Stop the current run and wait until it has ended (no process left).
        Returns False if it did not end within `timeout`."""
        session = self.current
        if session is None or not self.is_live(session):
            return True
        session.request_stop(reason)
        ended = self._ended[session.run_id]
        try:
            await asyncio.wait_for(ended.wait(), timeout)
        except asyncio.TimeoutError:
            return False
        return True

    async def restart(self, config: RunConfig | None = None, reason: str = "settings changed") -> RunHandle:
        """Stop the current run cleanly, then create the next one with `config`
        (default: the same config again). The caller starts it with `run()`. A run other
        viewers share is restarted by one of them only: RestartRefused for the others."""
        session = self.current
        if isinstance(session, SharedRun) and self.is_live(session):
            refusal = await session.claim_restart(reason)
            if refusal:
                raise RestartRefused(refusal)
        await self.stop(reason)
        return self.new_session(config)

    async def capture(self, count: int = 3) -> Capture:
        """Profile the next `count` steps on every rank of the current run (the session
        picks a step no rank has reached). RuntimeError when no run is live to capture."""
        session = self.current
        if session is None or not self.is_live(session):
            raise RuntimeError("no live run to capture")
        return await session.request_capture(count)

    # --- comparison -------------------------------------------------------------------
    def read_earlier_runs(self) -> None:
        """Read the runs directory again. It blocks on the disk (others may have filled the
        dir): a front end calls it off its drawing loop; the tables use what it read last."""
        self._earlier = runs.load_runs(self.runs_dir)

    def run_rows(self) -> list[runs.RunRow]:
        """This session's runs (live ones from their state) and earlier ones, as the runs
        directory read last (`read_earlier_runs`); no I/O."""
        mine = [runs.row_from_summary(s.state.summary(), run_dir=s.run_dir, this_session=True)
                for s in self.sessions]
        return runs.merge_rows(mine, self._earlier)

    def runs_table(self) -> runs.RunsTable:
        return runs.build_table(self.run_rows(), self.baseline_id)

    def export_runs(self) -> Path:
        """Write the runs table as Markdown into the runs directory (read again first);
        returns the file."""
        self.read_earlier_runs()
        return runs.export_markdown(self.runs_table(), self.runs_dir)
