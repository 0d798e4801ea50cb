"""Which view shows what: the tabs, the widget each tab focuses, and the router that shows
the current run's snapshot on the visible views (on the app's timer) and notices captures
that ended. Reads state only; never touches sockets or subprocesses.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable

from textual.app import App
from textual.css.query import NoMatches
from textual.widget import Widget
from textual.widgets import TabbedContent

from ddptop.model.state import RunState
from ddptop.run.handle import DetachableRun
from ddptop.run.workbench import Workbench
from ddptop.tui.live import LiveFigures, Snapshot
from ddptop.tui.messages import CaptureEnded
from ddptop.tui.widgets.captures_panel import CapturesPanel
from ddptop.tui.widgets.gpu_panel import GpuPanel
from ddptop.tui.widgets.log_view import LogView
from ddptop.tui.widgets.rank_lanes import RankLanes
from ddptop.tui.widgets.rank_table import RankTable
from ddptop.tui.widgets.run_alerts import RunAlerts
from ddptop.tui.widgets.run_header import RunHeader
from ddptop.tui.widgets.runs_panel import RunsPanel
from ddptop.tui.widgets.step_timeline import TIMELINE_MIN_HEIGHT, StepTimelineView, show_cursor_rank
from ddptop.tui.widgets.throughput_panel import ThroughputPanel
from ddptop.tui.widgets.wiring_panel import WiringPanel

REFRESH_S = 0.5
RUNS_REFRESH_S = 2.0  # the runs table reads the runs directory: less often
TABS = ("ranks", "gpu", "runs", "logs", "wiring", "captures")
TAB_FOCUS: dict[str, type[Widget]] = {
    "ranks": RankTable, "gpu": GpuPanel, "runs": RunsPanel, "logs": LogView,
    "wiring": WiringPanel, "captures": CapturesPanel,
}


class ViewRouter:
    """Shows the workbench's current run on `app`'s views: the header and alerts always,
    the active tab's views, and the log view (it follows even when hidden, so switching
    to it is instant)."""

    def __init__(self, app: App[int], workbench: Workbench,
                 clock: Callable[[], float] = time.time) -> None:
        self.app = app
        self.workbench = workbench
        self.clock = clock  # what "now" is for ages and rates (snapshot tests fix it)
        self.live = LiveFigures()
        self._runs_shown_at = 0.0
        self._capture_status: dict[tuple[str, int], str] = {}  # to notice captures finishing
        self._runs_seen: set[str] = set()  # runs this viewer has refreshed at least once
        self.last: Snapshot | None = None  # what the views show now (the rank detail reads it)
        self.paused = False  # space: the views keep what they show; the run goes on
        self.read_only = False  # a watcher's app: the header says so
        self.stopping: str | None = None  # the run this viewer asked to stop (its header says so)
        self._badges: tuple[str, ...] | None = None  # what the header said last (the footer follows)

    def badges(self) -> tuple[str, ...]:
        """The viewer's state as the header's badges (a finished run adds its own)."""
        session = self.workbench.current
        detached = isinstance(session, DetachableRun) and session.detached and self.workbench.is_live()
        stopping = session is not None and self.stopping == session.run_id and not session.state.finished
        return tuple(name for name, on in (("read-only", self.read_only), ("detached", detached),
                                           ("paused", self.paused), ("stopping", stopping)) if on)

    def _state_changed(self, state: RunState) -> tuple[str, ...]:
        """The badges; when they (or the run's end) change, the footer's keys are asked again."""
        badges = self.badges()
        key = (*badges, str(state.finished), str(self.workbench.is_live()))
        if key != self._badges:
            self._badges = key
            self.app.refresh_bindings()
        return badges

    def refresh(self, force_runs: bool = False) -> None:
        session = self.workbench.current
        if session is None:
            return
        query = self.app.query_one
        try:
            header = query(RunHeader)
        except NoMatches:  # exit() has begun taking the views down; a tick can fall in that gap
            return
        now = self.clock()
        badges = self._state_changed(session.state)
        if self.paused and self.last is not None:
            header.show(self.last, badges)  # the same figures, and the badge that says why
            return
        snap = self.last = self.live.snapshot(session.state, now)
        header.show(snap, badges)
        query(RunAlerts).show(snap)
        self._notice_captures(session.state)
        tab = query(TabbedContent).active
        if tab == "ranks":
            table = query(RankTable)
            tall = self.app.size.height >= TIMELINE_MIN_HEIGHT
            for widget in (query("#timelines", Widget), query(RankLanes)):
                if widget.display != tall:
                    widget.display = tall
            show_cursor_rank(query("#overview-timeline", StepTimelineView), snap, table.cursor_rank, tall,
                             "node" if table.cursor_on_node else "cursor")
            shown = table.cursor_rank if table.cursor_rank in snap.state.ranks else (
                snap.slowest if snap.slowest in snap.state.ranks else snap.heaviest)
            show_cursor_rank(query("#fastest-timeline", StepTimelineView), snap, snap.lightest, tall, "fastest",
                             cursor=shown)
            table.show(snap)
            query(ThroughputPanel).show(snap)
            if tall:
                query(RankLanes).show(snap)
        elif tab == "gpu":
            query(GpuPanel).show(snap)
        elif tab == "runs" and (force_runs or now - self._runs_shown_at >= RUNS_REFRESH_S):
            self._runs_shown_at = now
            query(RunsPanel).show(self.workbench.runs_table())
            # The runs dir is read in a thread: whatever is in it never holds up the views.
            self.app.run_worker(self._read_runs, thread=True, group="runs-dir", exclusive=True,
                                exit_on_error=False)
        elif tab == "wiring":
            query(WiringPanel).show(snap)
        elif tab == "captures":
            query(CapturesPanel).show(snap)
        query(LogView).show(snap)

    def _read_runs(self) -> None:
        self.workbench.read_earlier_runs()
        with contextlib.suppress(RuntimeError):  # the app ended meanwhile
            self.app.call_from_thread(self._show_runs)

    def _show_runs(self) -> None:
        try:
            panel = self.app.query_one(RunsPanel)
        except NoMatches:  # the app is exiting
            return
        panel.show(self.workbench.runs_table())

    def show_tab(self, tab: str) -> None:
        """Switch to `tab` and focus its view (or the first widget in it that takes focus)."""
        self.app.query_one(TabbedContent).active = tab
        widget = self.app.query_one(TAB_FOCUS[tab])
        target = widget if widget.can_focus or isinstance(widget, RankTable) else next(
            (w for w in widget.query("*") if w.can_focus), None)
        if target is not None:
            target.focus()

    def _notice_captures(self, state: RunState) -> None:
        first_sight = state.run_id not in self._runs_seen
        self._runs_seen.add(state.run_id)
        for cap in state.captures.values():
            key = (state.run_id, cap.capture_id)
            before = self._capture_status.get(key)
            self._capture_status[key] = cap.status
            # news only: a capture already over when this viewer first saw the run (an attach,
            # a re-attach) is in the captures tab, not a fresh notification
            if cap.status != before and cap.status in ("done", "failed") and not first_sight:
                detail = cap.error or (f"{len(cap.files)} rank(s), files in {cap.out_dir}"
                                       if cap.status == "done" else "")
                self.app.post_message(CaptureEnded(state.run_id, cap.capture_id, cap.status, detail))
