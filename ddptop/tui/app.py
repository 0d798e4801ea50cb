"""The ddptop Textual app: wiring, bindings and routing only.

Gets a Workbench (its data source) in the constructor; runs each run (a RunHandle) in a
worker, refreshes the visible views from its state on a timer (ddptop.tui.views), and turns
keys into intents (stop, apply settings, capture, detach, quit). Never imports torch;
never touches sockets or subprocesses (the Session, or the RemoteSession that follows a
supervisor process, does).
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import time
from collections.abc import Callable, Iterable

from textual import on, work
from textual.app import ComposeResult, SystemCommand
from textual.containers import Horizontal
from textual.driver import Driver
from textual.notifications import SeverityLevel
from textual.screen import Screen
from textual.widgets import Footer, TabbedContent, TabPane
from textual.worker import Worker, WorkerState

from ddptop.model.config import RunConfig
from ddptop.model.state import RunState
from ddptop.run.handle import RunHandle
from ddptop.run.workbench import Workbench
from ddptop.tui.closing import exit_code, run_app
from ddptop.tui.keys import (
    BINDINGS,
    CAPTURE_STEPS,
    MAIN_ONLY,
    READ_ONLY,
    ViewerState,
    refusal,
    run_commands,
)
from ddptop.tui.messages import CaptureEnded, RunEnded, RunStarted, SettingsApplied, StopRequested
from ddptop.tui.screens.choice_screen import ChoiceScreen
from ddptop.tui.screens.confirm_screen import ConfirmScreen
from ddptop.tui.screens.help_screen import HelpScreen
from ddptop.tui.screens.rank_detail import RankDetailScreen
from ddptop.tui.screens.settings_screen import SettingsScreen
from ddptop.tui.terminal import EXIT_SIGNALS, ExitSignals, TerminalLost, driver_for, silence_output
from ddptop.tui.view_actions import ViewActions
from ddptop.tui.views import REFRESH_S, ViewRouter
from ddptop.tui.widgets.captures_panel import CapturesPanel
from ddptop.tui.widgets.gpu_panel import GpuPanel
from ddptop.tui.widgets.log_view import LogView
from ddptop.tui.widgets.rank_lanes import RankLanes
from ddptop.tui.widgets.rank_table import RankTable
from ddptop.tui.widgets.run_alerts import RunAlerts
from ddptop.tui.widgets.run_header import RunHeader
from ddptop.tui.widgets.runs_panel import RunsPanel
from ddptop.tui.widgets.step_timeline import StepTimelineView
from ddptop.tui.widgets.throughput_panel import ThroughputPanel
from ddptop.tui.widgets.wiring_panel import WiringPanel

__all__ = ["DdpTopApp", "exit_code", "run_app"]

RUN_END_SEVERITY: dict[str, SeverityLevel] = {"completed": "information", "stopped": "warning"}


class DdpTopApp(ViewActions):
    CSS_PATH = "app.tcss"
    TITLE = "ddptop"
    BINDINGS = BINDINGS  # ddptop.tui.keys: one table for keys, footer, palette and help

    def __init__(self, workbench: Workbench, autostart: bool = True,
                 refresh_s: float = REFRESH_S, read_only: bool = False, viewer: str = "",
                 clock: Callable[[], float] = time.time) -> None:
        super().__init__()
        self.workbench = workbench
        # A watcher: no stop, restart, settings, capture, detach or export from this app.
        self.read_only = read_only
        # What kind of viewer this is ("terminal", "web"; "" for the run's own TUI): the
        # reasons of its stops and restarts say it, in the run's log and summary.
        self.viewer = viewer
        self.autostart = autostart
        self.refresh_s = refresh_s
        self.views = ViewRouter(self, workbench, clock)  # clock: a fixed one for snapshots
        self.views.read_only = read_only
        self.exit_note = ""  # printed by run_tui once the terminal is back (e.g. how to re-attach)
        self.terminal_lost = ""  # why the terminal (or the page's server) went away, once it has
        self._signals: ExitSignals | None = None
        self._quitting = False  # a signal or `q` is already stopping the run to quit

    def get_driver_class(self) -> type[Driver]:
        return driver_for(super().get_driver_class())

    def compose(self) -> ComposeResult:
        yield RunHeader(id="run-header")
        yield RunAlerts(id="run-alerts")
        with TabbedContent(initial="ranks", id="tabs"):
            with TabPane("1 Ranks", id="ranks"):
                yield RankTable(id="rank-table")
                yield ThroughputPanel(id="throughput")
                with Horizontal(id="timelines"):  # a tall terminal: the cursor's rank beside the fastest
                    yield StepTimelineView(id="overview-timeline")
                    yield StepTimelineView(id="fastest-timeline")
                yield RankLanes(cursor=False, id="rank-lanes")
            with TabPane("2 GPU", id="gpu"):
                yield GpuPanel(id="gpu-panel")
            with TabPane("3 Runs", id="runs"):
                yield RunsPanel(id="runs-panel")
            with TabPane("4 Logs", id="logs"):
                yield LogView(id="log-view")
            with TabPane("5 Wiring", id="wiring"):
                yield WiringPanel(id="wiring-panel")
            with TabPane("6 Captures", id="captures"):
                yield CapturesPanel(id="captures-panel")
        yield Footer(show_command_palette=False)  # ctrl+p still opens it; ? lists every key

    def on_mount(self) -> None:
        # A closed SSH session or a `kill` stops a run this terminal owns cleanly, as `q`
        # would; a detached run (or someone else's) just loses this viewer. Plain Python
        # handlers, with a deadline: they work even while the loop is stuck.
        # Under a test's headless driver: no SIGINT (the test runner's) and no deadline.
        headless = self.is_headless
        signals = ExitSignals(asyncio.get_running_loop(), self._on_signal,
                              (signal.SIGTERM, signal.SIGHUP) if headless else EXIT_SIGNALS,
                              deadline=not headless)
        self._signals = signals if signals.install() else None
        self._ticks = self.set_interval(self.refresh_s, self.refresh_views)
        if self.autostart:  # the run attached to, or a new one
            self.start_run(self.workbench.current or self.workbench.new_session())
        self.query_one(RankTable).focus()
        if self.read_only:
            self.notify(f"{READ_ONLY}: watching only (q leaves, the run goes on)", timeout=8)

    def _handle_exception(self, error: Exception) -> None:
        # Textual's one door for an exception that ends the app. A viewer's own failure is not
        # the user's quit: a run it owns goes on (detached) and the closing lines say how to
        # come back; only a lost terminal or a quit stops it.
        with contextlib.suppress(Exception):
            self.exit_note = self.workbench.viewer_failed(f"{type(error).__name__}: {error}"[:200]) or self.exit_note
        super()._handle_exception(error)

    def on_unmount(self) -> None:
        if self._signals is not None:  # a lost terminal's deadline holds until the process ends
            self._signals.uninstall(keep_deadline=bool(self.terminal_lost))

    def _on_signal(self, signum: int) -> None:
        if signum == signal.SIGHUP:
            self.post_message(TerminalLost("SIGHUP"))
        else:
            self._signalled()

    def _signalled(self) -> None:
        """SIGTERM, SIGINT, ctrl+q: a run this TUI owns stops cleanly first (a second one
        leaves at once: the supervisor still stops an owned run whose viewer is gone)."""
        if self._quitting or self.read_only or not self._owns_live_run():
            self.exit(0)
        else:
            self._quitting = True
            self.stop_and_exit()

    def _owns_live_run(self) -> bool:
        return self.workbench.is_live() and self.workbench.owns_current()

    def on_terminal_lost(self, event: TerminalLost) -> None:
        """Nothing can be shown or typed any more (SSH drop, closed tab): an owned run is
        stopped cleanly, a viewer just ends. Nothing waits on the terminal from here on."""
        if self.terminal_lost:
            return
        self.terminal_lost = event.reason
        if not self.is_headless:
            silence_output()
        if self._signals is not None:
            self._signals.arm(30.0, 129)  # whatever happens below, this process ends
        if self.read_only or not self._owns_live_run():
            self.exit(0)
            return
        # Seen to its end (the supervisor would stop it without us, but then nobody would
        # reap it): the same clean stop as `q`, with nobody watching.
        self._quitting = True
        self.stop_and_exit(self._by(f"its terminal closed ({event.reason})"))

    # --- runs -------------------------------------------------------------------------
    def start_run(self, session: RunHandle) -> None:
        self.run_worker(self.workbench.run(session), name=session.run_id, group="run",
                        exit_on_error=False)
        self.post_message(RunStarted(session.run_id))

    def on_worker_state_changed(self, event: Worker.StateChanged) -> None:
        worker = event.worker
        if event.state not in (WorkerState.SUCCESS, WorkerState.ERROR):
            return
        if worker.group != "run":
            if event.state == WorkerState.ERROR:  # capture, control: say why, keep going
                self.notify(f"{worker.name or worker.group}: {worker.error}", severity="error",
                            timeout=10, markup=False)
            return
        final = worker.result
        if event.state == WorkerState.ERROR or not isinstance(final, RunState):
            self.post_message(RunEnded(worker.name, "error", str(worker.error)))
        else:
            self.post_message(RunEnded(worker.name, final.status, final.error))

    def on_run_ended(self, event: RunEnded) -> None:
        severity = RUN_END_SEVERITY.get(event.status, "error")
        detail = f": {event.error}" if event.error else ""
        self.notify(f"run {event.run_id} {event.status}{detail}", severity=severity, markup=False,
                    timeout=30 if severity == "error" else 6)  # the error quotes a rank: not markup
        self.refresh_views(force_runs=True)

    def on_run_started(self, event: RunStarted) -> None:
        self.refresh_views(force_runs=True)

    @on(SettingsApplied)
    def _settings_applied(self, event: SettingsApplied) -> None:
        if not self._refused("change settings"):
            self.restart(event.config)

    @on(StopRequested)
    def _stop_requested(self, event: StopRequested) -> None:
        if self.workbench.is_live() and not self._refused("stop the run"):
            self.workbench.request_stop(self._by(event.reason))
            current = self.workbench.current
            self.views.stopping = current.run_id if current is not None else None
            self.views.refresh()  # the header says `stopping` now, not at the next tick
            self.notify("stopping the run at the next agreed step…")

    @on(CaptureEnded)
    def _capture_ended(self, event: CaptureEnded) -> None:
        ok = event.status == "done"
        self.notify(f"capture {event.capture_id} {event.status}" + (f": {event.detail}" if event.detail
                                                                      else ""),
                    severity="information" if ok else "error", timeout=8 if ok else 20, markup=False)

    @work(group="capture", exit_on_error=False, name="capture")
    async def capture(self, count: int = CAPTURE_STEPS) -> None:
        cap = await self.workbench.capture(count)
        self.notify(f"capture {cap.capture_id}: steps {cap.steps} on every rank ({cap.profiler})")
        self.refresh_views()

    @work(group="control", exclusive=True, exit_on_error=False)
    async def restart(self, config: RunConfig | None = None, reason: str = "settings changed") -> None:
        if self.workbench.is_live():
            self.notify("stopping the current run…")
        self.start_run(await self.workbench.restart(config, self._by(reason)))

    @work(group="control", exclusive=True, exit_on_error=False)
    async def stop_and_exit(self, reason: str = "") -> None:
        if self.workbench.is_live() and not self.read_only:
            self.notify("stopping the run, then quitting…")
            await self.workbench.stop(reason or self._by("quit"))
        self.exit(0)

    @work(group="control", exclusive=True, exit_on_error=False, name="detach")
    async def detach_and_exit(self) -> None:
        self.exit_note = await self.workbench.detach()
        self.exit(0)

    # --- views ------------------------------------------------------------------------
    def on_tabbed_content_tab_activated(self, event: TabbedContent.TabActivated) -> None:
        self.refresh_views(force_runs=True)

    @on(RunsPanel.ExportRequested)
    def export_runs(self) -> None:
        if self._refused("export the runs table"):
            return
        try:
            path = self.workbench.export_runs()
        except OSError as exc:
            self.notify(f"export failed: {exc}", severity="error")
            return
        self.notify(f"runs table written to {path}")

    @on(RunsPanel.ReferenceChosen)
    def _reference(self, event: RunsPanel.ReferenceChosen) -> None:
        self.workbench.baseline_id = event.run_id
        self.refresh_views(force_runs=True)

    @on(RankTable.RankChosen)
    def _open_rank(self, event: RankTable.RankChosen) -> None:
        self.push_screen(RankDetailScreen(event.rank, lambda: self.views.last))

    # --- actions ----------------------------------------------------------------------
    def _refused(self, what: str) -> bool:
        """True (and says so) when this app is a watcher's and `what` would change the run."""
        if self.read_only:
            self.notify(f"{READ_ONLY}: cannot {what}", severity="warning")
        return self.read_only

    def _by(self, reason: str) -> str:
        return f"{reason}, from a {self.viewer} viewer" if self.viewer else reason

    def viewer_state(self) -> ViewerState:
        return ViewerState(self.read_only, self.workbench.is_live(), self.workbench.can_detach())

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        """Under a dialog: none of the main screen's keys. Otherwise the keys the viewer's
        state refuses are hidden (their `refuse` twin says why when pressed)."""
        if action in MAIN_ONLY and self.screen is not self.screen_stack[0]:
            return False
        if action == "refuse":
            return bool(refusal(str(parameters[0]), self.viewer_state()))
        return not refusal(action, self.viewer_state())

    def action_refuse(self, action: str) -> None:
        self.notify(refusal(action, self.viewer_state()) or f"cannot {action} now", severity="warning")

    def action_settings(self) -> None:
        if self._refused("change settings"):
            return

        def applied(config: RunConfig | None) -> None:
            if config is None:
                return
            if self.workbench.is_live():  # ctrl+s ends the live run: ask first, as x and n do
                self._confirm("Stop the live run and start one with these settings?",
                              lambda: self.post_message(SettingsApplied(config)))
            else:
                self.post_message(SettingsApplied(config))

        # built once and kept (installed), filled anew on each opening: building its ~250
        # widgets took 0.6-2.6 s a time (issue 46)
        config = self.workbench.config
        name = f"settings-{'script' if config.script else 'trainer'}"
        if not self.is_screen_installed(name):
            self.install_screen(SettingsScreen(config), name)
        else:
            self.get_screen(name).reset(config)  # type: ignore[attr-defined]
        self.push_screen(name, applied)

    def _confirm(self, question: str, then: Callable[[], object]) -> None:
        """Ask a yes/no `question`; `then()` on yes."""
        def answered(yes: bool | None) -> None:
            if yes:
                then()

        self.push_screen(ConfirmScreen(question), answered)

    def action_stop_run(self) -> None:
        if self._refused("stop the run"):
            return
        if not self.workbench.is_live():
            self.notify("no live run to stop", severity="warning")
            return
        self._confirm("Stop the live run? (ddptop stays open)", lambda: self.post_message(StopRequested()))

    def action_rerun(self) -> None:
        if self._refused("start a run"):
            return
        if not self.workbench.is_live():  # nothing to lose: start at once
            self.restart(None, "run again")
            return
        self._confirm("A run is live. Stop it and start it again?", lambda: self.restart(None, "run again"))

    def action_capture(self) -> None:
        if not self._refused("capture"):
            self.capture(CAPTURE_STEPS)

    def action_detach(self) -> None:
        if self._refused("detach the run"):
            return
        if self.workbench.can_detach():
            self.detach_and_exit()
        else:
            self.notify("nothing to detach: no live run, or it runs inside this process", severity="warning")

    def action_help(self) -> None:
        self.push_screen(HelpScreen(self.query_one(TabbedContent).active, self.BINDINGS))

    def action_request_quit(self) -> None:
        if not self.workbench.is_live() or self.read_only:  # a watcher just leaves
            self.exit(0)
            return
        if not self.workbench.owns_current():  # detached, or another terminal's run
            def chosen(choice: str | None) -> None:
                if choice == "detach":
                    self.detach_and_exit()
                elif choice == "stop":
                    self.stop_and_exit()

            self.push_screen(ChoiceScreen("Detach (run keeps going) or stop the run?",
                                          [("d", "Detach", "detach"), ("s", "Stop run", "stop")]), chosen)
            return
        self._confirm("A run is live. Stop it and quit ddptop?", self.stop_and_exit)

    async def action_quit(self) -> None:
        # ctrl+q and the palette's Quit: no question, but still a clean stop of a run this
        # terminal owns; a detached run (or another terminal's) just loses this viewer.
        self._signalled()

    def get_system_commands(self, screen: Screen) -> Iterable[SystemCommand]:
        # ours only: Textual's Keys/Maximize/Screenshot/Quit would be a second help and a
        # quit that does not ask
        yield from run_commands(self)
