"""CaptureDiffScreen: `D` in the captures tab: pick two captures of this session's runs (bf16
against baseline, before and after a settings change) and see what got faster or slower
between them, per rank, kernel class and kernel: the lines `ddptop trace A B --diff` prints
(ddptop.analysis.trace_diff), worked out in a child process (ddptop.run.trace_job) so the
live views keep refreshing meanwhile."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable
from typing import Any

from rich.text import Text
from textual import work
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import Screen
from textual.widgets import Footer, SelectionList, Static
from textual.widgets.selection_list import Selection

from ddptop.analysis.trace_diff import describe_diff
from ddptop.run.trace_files import TraceError
from ddptop.run.trace_job import diff_in_child

Differ = Callable[[str, str], Awaitable[dict[str, Any]]]
HINT = "space picks a capture; with two picked, the earlier is compared with the later (escape: back)"


def comparable(runs: Iterable[tuple[str, Iterable[Any]]]) -> list[tuple[str, Any]]:
    """(run id, capture) of every torch.profiler capture that finished, oldest first."""
    return [(run_id, cap) for run_id, caps in runs for cap in sorted(caps, key=lambda c: c.capture_id)
            if cap.status == "done" and cap.profiler == "torch"]


def session_captures(app: App[Any]) -> list[tuple[str, Any]]:
    """The captures of every run this app has shown (its Workbench's sessions)."""
    sessions = getattr(getattr(app, "workbench", None), "sessions", [])
    return comparable((s.run_id, s.state.captures.values()) for s in sessions)


def diff_lines(d: dict[str, Any], before: str, after: str) -> list[Text]:
    head = Text.assemble(("before ", "dim"), before, ("   after ", "dim"), after)
    body = [Text(line, style="bold" if line.startswith("rank ") else "#3a9e5f" if "faster" in line[:9]
                 else "#d7503c" if "slower" in line[:9] else "") for line in describe_diff(d)]
    return [head, Text(), *(body or [Text("no rank is in both captures", style="dim")])]


class CaptureDiffScreen(Screen[None]):
    BINDINGS = [Binding("escape", "app.pop_screen", "Back"), Binding("q", "app.pop_screen", "Back", show=False)]

    def __init__(self, captures: list[tuple[str, Any]], differ: Differ = diff_in_child) -> None:
        super().__init__()
        self.captures = captures
        self._differ = differ
        self.lines: list[Text] = []  # what the diff pane shows (tests read it)

    def compose(self) -> ComposeResult:
        yield Static(Text(HINT, style="dim"), id="diff-hint")
        yield SelectionList[int](*(Selection(f"{run_id}  #{cap.capture_id}  steps {cap.steps}  {cap.out_dir}", i)
                                   for i, (run_id, cap) in enumerate(self.captures)), id="diff-choices")
        with VerticalScroll():
            yield Static(id="diff-body")
        yield Footer(show_command_palette=False)

    def on_mount(self) -> None:
        if len(self.captures) < 2:
            self._show([Text(f"{len(self.captures)} finished torch.profiler capture(s) in this session: "
                             "two are needed (c captures the next steps)", style="#c79100")])
        self.query_one(SelectionList).focus()

    def _show(self, lines: list[Text]) -> None:
        self.lines = lines
        self.query_one("#diff-body", Static).update(Text("\n").join(lines))

    def on_selection_list_selected_changed(self, event: SelectionList.SelectedChanged) -> None:
        picked = sorted(event.selection_list.selected)
        if len(picked) == 2:
            a, b = (self.captures[i][1].out_dir for i in picked)
            self._show([Text(f"comparing {a} with {b}…", style="dim italic")])
            self.compare(a, b)
        elif len(picked) > 2:
            self._show([Text("pick two captures (space again unpicks one)", style="#c79100")])

    @work(group="capture-diff", exclusive=True, exit_on_error=False)
    async def compare(self, before: str, after: str) -> None:
        try:
            d = await self._differ(before, after)
        except TraceError as exc:
            self._show([Text(f"cannot compare: {exc}", style="#d7503c")])
            return
        self._show(diff_lines(d, before, after))
