"""After the TUI: the closing lines of the run this terminal owned (as headless prints
them) and the process's exit code. Reads the app's workbench and the notes the app left.
"""

from __future__ import annotations

from typing import Protocol

from ddptop.hw.terminal import output_width
from ddptop.model.exit_codes import EXIT_CODES
from ddptop.model.report import closing_lines
from ddptop.run.workbench import Workbench


class EndingApp(Protocol):
    """What this module reads of ddptop.tui.app.DdpTopApp."""

    workbench: Workbench
    exit_note: str  # e.g. how to re-attach
    terminal_lost: str  # why the terminal went away ("" while it is there)

    @property
    def return_code(self) -> int | None: ...

    def run(self) -> object: ...


def run_app(app: EndingApp) -> int:
    """Run the TUI; then, as headless does, the closing lines of the run it owned and the
    exit code of how that run ended (0 completed, 1 failed, 130 stopped)."""
    app.run()
    code = exit_code(app)
    if app.terminal_lost:
        return code  # nobody to tell
    if app.exit_note:
        print(f"ddptop: {app.exit_note}")
    session = app.workbench.current
    if session is not None and app.workbench.owns_current() and session.state.finished:
        try:
            print(closing_lines(session.state, session.run_dir, None, *output_width()), flush=True)
        except OSError:  # the terminal went away just now
            pass
    return code


def exit_code(app: EndingApp) -> int:
    if app.return_code:  # Textual's own: 1 for an error inside the app
        return app.return_code
    session = app.workbench.current
    if session is None or not app.workbench.owns_current():
        return 0  # a viewer, or a run detached from here: it goes on
    if not session.state.finished:
        return EXIT_CODES["stopped"]  # left while its stop was on the way (a lost terminal)
    return EXIT_CODES.get(session.state.status, 1)
