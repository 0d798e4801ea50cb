"""The app's keys, what each viewer state allows, and the command palette's entries: one
table of actions, so keys, footer, palette and help never disagree (issue 31). Pure
Textual bindings; no run, no sockets.

A key whose action the viewer's state refuses (a watcher, a finished run) is hidden from
the footer and the palette; pressing it still says why (the hidden `refuse` binding on the
same key, which Textual tries once the first one is refused)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Protocol

from textual.app import SystemCommand
from textual.binding import Binding, BindingType

from ddptop.tui.views import TABS

READ_ONLY = "read-only view"  # what a watcher's app says to any key that would change the run
# what each action that changes the run would do, as a refusal says it
CHANGES_RUN = {"stop_run": "stop the run", "rerun": "start a run", "settings": "change settings",
               "detach": "detach the run", "capture": "capture"}
CAPTURE_STEPS = 3

BINDINGS: list[BindingType] = [
    Binding("q", "request_quit", "Quit"),
    Binding("f10", "request_quit", "Quit", show=False),
    # Textual's own ctrl+c only says "press ctrl+q to quit"; here it is `q`. Not a
    # priority binding: a focused input or a text selection still copies first.
    Binding("ctrl+c", "request_quit", "Quit", show=False),
    Binding("s", "settings", "Settings"),
    Binding("f2", "settings", "Settings", show=False),  # htop's Setup
    Binding("x", "stop_run", "Stop run"),
    Binding("f9", "stop_run", "Stop run", show=False),  # htop's Kill: the whole run, asking first
    Binding("R", "rerun", "Run again", show=False),  # footer: priority keys only (80x24)
    Binding("c", "capture", "Capture", tooltip=f"Profile the next {CAPTURE_STEPS} steps on every rank"),
    Binding("d", "detach", "Detach", show=False),
    # the same keys when the state refuses them: hidden, they say why
    *(Binding(key, f"refuse('{action}')", show=False)
      for key, action in (("s", "settings"), ("f2", "settings"), ("x", "stop_run"), ("f9", "stop_run"),
                          ("R", "rerun"), ("c", "capture"), ("d", "detach"))),
    *(Binding(str(i + 1), f"show_tab('{tab}')", tab.capitalize(), show=False) for i, tab in enumerate(TABS)),
    Binding("t", "toggle_dark", "Theme", show=False),
    Binding("space", "pause", "Pause display", show=False),
    Binding("plus", "refresh_every(0.5)", "Refresh faster", show=False),
    Binding("minus", "refresh_every(2)", "Refresh slower", show=False),
    Binding("slash", "search", "Search", show=False),
    Binding("f3", "search", "Search", show=False),
    Binding("f6", "sort", "Sort ranks (next column)", show=False),
    Binding("P", "sort_by('p50')", "Sort ranks by p50 ms", show=False),  # htop's P (CPU%): the step time
    Binding("f4", "search", "", show=False),  # htop's filter: the logs' search (help: EVERYWHERE_EXTRA)
    # keys an htop/nvitop user presses first that mean nothing here: each says where its
    # feature is (POINTERS); the ranks tab's own keys come first where it binds them
    *(Binding(key, f"point_to('{key}')", show=False) for key in ("f5", "M", "T", "H", "u", "l", "e", "b", "f", "k", "n", "N")),
    Binding("h", "help", "Help", show=False),
    Binding("f1", "help", "Help", show=False),
    Binding("question_mark", "help", "Help"),
]
# Actions that only make sense on the main screen (not under settings/help/confirm).
MAIN_ONLY = {"settings", "stop_run", "rerun", "show_tab", "help", "request_quit", "capture", "detach",
             "refuse", "search", "sort", "sort_by", "sort_step", "point_to"}
# What an htop/nvitop key that ddptop does not bind says: where that feature is here.
POINTERS = {
    "f5": "F5 (tree): a multi-node run groups its ranks under their node (n opens one, N switches); ⏎ opens a rank",
    "M": "M (memory): a rank's memory is in its detail (⏎) and on the GPU tab (2)",
    "T": "T (time): the rank table sorts by p50 ms or own ms (P, F6, < >); ⏎ shows a rank's step timeline",
    "H": "H (threads): one row per rank, no threads; ⏎ opens a rank with its processes",
    "u": "u (user): every rank is this run's; f on the logs tab (4) shows one rank's lines",
    "l": "l (open files): a rank's output is on the logs tab (4), its records in the run directory (runs tab, 3)",
    "e": "e (environment): ⏎ opens the rank's facts, s the run's settings; e exports on the runs tab (3)",
    "b": "b: sets the reference run on the runs tab (3)",
    "f": "f (follow): the logs tab (4) follows one rank with f; ⏎ opens this one",
    "k": "k (kill): x stops the whole run (a DDP job cannot lose one rank); on the logs tab k filters by kind",
    "N": "n/N: open a node / node rows on a multi-node run (this one is one node); n/N step through search matches on the logs tab (4)",
    "n": "n/N: open a node / node rows on a multi-node run (this one is one node); n/N step through search matches on the logs tab (4)",
}
SORT_TOAST = "ranks sorted by"  # the sort toast's start: a newer sort replaces it


@dataclass(frozen=True)
class ViewerState:
    """What this viewer may do now."""

    read_only: bool
    live: bool  # the run may still have processes
    can_detach: bool  # live, and held by a supervisor this process can leave


def refusal(action: str, state: ViewerState) -> str:
    """Why `action` cannot be done in `state` ('' when it can)."""
    if action not in CHANGES_RUN:
        return ""
    if state.read_only:
        return f"{READ_ONLY}: cannot {CHANGES_RUN[action]}"
    if action == "stop_run" and not state.live:
        return "no live run to stop"
    if action == "capture" and not state.live:
        return "no live run to capture"
    if action == "detach" and not state.can_detach:
        return "nothing to detach: no live run, or it runs inside this process"
    return ""


class PaletteActions(Protocol):
    """The actions of ddptop.tui.app.DdpTopApp the palette offers."""

    def viewer_state(self) -> ViewerState: ...
    def action_help(self) -> None: ...
    def action_request_quit(self) -> None: ...
    def action_sort(self) -> None: ...
    def action_search(self) -> None: ...
    def action_pause(self) -> None: ...
    def action_settings(self) -> None: ...
    def action_stop_run(self) -> None: ...
    def action_rerun(self) -> None: ...
    def action_capture(self) -> None: ...
    def action_detach(self) -> None: ...
    def action_invert_sort(self) -> None: ...
    def action_filter_logs(self) -> None: ...
    def export_runs(self) -> None: ...
    def action_toggle_dark(self) -> None: ...  # "Theme", as help names `t`
    def action_show_tab(self, tab: str) -> None: ...


def run_commands(app: PaletteActions) -> Iterator[SystemCommand]:
    """ddptop's actions by name, as the keys do them (quit asks as `q` does); only those the
    viewer's state allows."""
    state = app.viewer_state()
    entries: list[tuple[str, str, Callable[[], object], str]] = [
        ("Help", "Every key of this tab, and what the figures mean (? h F1)", app.action_help, ""),
        ("Quit", "Leave ddptop (asks first while a run of yours is live; q F10)", app.action_request_quit, ""),
        ("Sort ranks", "Sort the rank table by the next column (F6, < >)", app.action_sort, ""),
        ("Invert sort", "Reverse the rank table's order (i)", app.action_invert_sort, ""),
        ("Search logs", "Search the logs tab (/ F3)", app.action_search, ""),
        ("Filter logs by rank", "Show one rank's log lines (f on the logs tab)", app.action_filter_logs, ""),
        ("Pause display", "Freeze or resume what the views show; the run goes on (space)", app.action_pause, ""),
        ("Capture", f"Profile the next {CAPTURE_STEPS} steps on every rank (c)", app.action_capture, "capture"),
        ("Detach", "Leave the run going without this terminal (d; ddptop attach)", app.action_detach, "detach"),
        ("Stop run", "Stop the current run, keep ddptop open (x; asks first)", app.action_stop_run, "stop_run"),
        ("Run again", "Start a new run with the same settings (R; asks first)", app.action_rerun, "rerun"),
        ("Settings", "Change the run's knobs and restart (s)", app.action_settings, "settings"),
        ("Export runs", "Write the runs table as Markdown into the runs directory", app.export_runs, ""),
        ("Theme", "Switch between light and dark themes (t)", app.action_toggle_dark, ""),
    ]
    for title, help_text, call, action in entries:
        if not (action and refusal(action, state)) and not (title == "Export runs" and state.read_only):
            yield SystemCommand(title, help_text, call)
    for tab in TABS:
        yield SystemCommand(f"Show {tab}", f"Switch to the {tab} view ({TABS.index(tab) + 1})",
                            lambda tab=tab: app.action_show_tab(tab))
