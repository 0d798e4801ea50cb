"""The command palette's entries for ddptop's own actions, after Textual's own: each
calls the same action as its key."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Protocol

from textual.app import SystemCommand

from ddptop.tui.views import TABS


class PaletteActions(Protocol):
    """The actions of ddptop.tui.app.DdpTopApp the palette offers."""

    def action_settings(self) -> None: ...
    def action_stop_run(self) -> None: ...
    def action_rerun(self) -> None: ...
    def action_capture(self) -> None: ...
    def action_detach(self) -> None: ...
    def export_runs(self) -> None: ...
    def action_toggle_dark(self) -> None: ...
    def action_show_tab(self, tab: str) -> None: ...


def run_commands(app: PaletteActions, capture_steps: int) -> Iterator[SystemCommand]:
    yield SystemCommand("Settings", "Change the run's knobs and restart", app.action_settings)
    yield SystemCommand("Stop run", "Stop the current run (keep ddptop open)", app.action_stop_run)
    yield SystemCommand("Run again", "Start a new run with the same settings", app.action_rerun)
    yield SystemCommand("Capture", f"Profile the next {capture_steps} steps on every rank",
                        app.action_capture)
    yield SystemCommand("Detach", "Leave the run going without this terminal (ddptop attach)",
                        app.action_detach)
    yield SystemCommand("Export runs", "Write the runs table as Markdown into the runs directory",
                        app.export_runs)
    yield SystemCommand("Toggle light/dark", "Switch between light and dark themes",
                        app.action_toggle_dark)
    for tab in TABS:
        yield SystemCommand(f"Show {tab}", f"Switch to the {tab} view",
                            lambda tab=tab: app.action_show_tab(tab))
