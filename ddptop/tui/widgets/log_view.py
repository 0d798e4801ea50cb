"""LogView: every rank's output (and torchrun/ddptop's own, as rank -1), filterable
by rank and by kind (NCCL, warnings, errors), NCCL lines highlighted, searchable (`/`, then
`n`/`N` between matches, as in less). Follows the live RunState's bounded log deques. Long
lines wrap under their text (rewrapped when the width changes): nothing runs off the right."""

from __future__ import annotations

import collections
import re
from typing import Any

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.widgets import Input, Label, RichLog, Select

from ddptop.model.text import printable
from ddptop.tui.live import Snapshot
from ddptop.tui.render import NCCL_STYLE, wrap_text

KEEP = 5000  # lines this view keeps to re-filter (RunState keeps 2000 per rank)
ALL = "all"
MATCH_STYLE = "bold black on #d7af00"
CURRENT_STYLE = "bold black on #ff8700"
# What the kind filter keeps (k cycles it): NCCL's own lines, warnings, errors.
_WARN = re.compile(r"\bWARN(?:ING)?\b|Warning\b", re.IGNORECASE)
_ERROR = re.compile(r"\b(?:ERROR|Error|Exception|Traceback|FAILED|ABORT)\b|Error:")
KINDS = {ALL: "all lines", "nccl": "NCCL", "warn": "warnings", "error": "errors"}
HINT = "  / search, n/N next/previous"  # f and k are in the footer
PREFIX = 9  # "    r1 │ ": where a wrapped line's next rows start


_NCCL = re.compile(r"\bNCCL (?:INFO|WARN|TRACE|ABORT|version)\b")


def is_nccl(line: str) -> bool:
    """NCCL's own debug lines (not, say, a torch warning naming a TORCH_NCCL_ variable)."""
    return _NCCL.search(line) is not None


def rank_label(rank: int) -> str:
    return "ddptop" if rank < 0 else f"r{rank}"


def line_kind_matches(kind: str, line: str) -> bool:
    if kind == "nccl":
        return is_nccl(line)
    if kind == "warn":
        return _WARN.search(line) is not None
    if kind == "error":
        return _ERROR.search(line) is not None
    return True


def format_line(rank: int, line: str, search: str = "", current: bool = False) -> Text:
    """One log line; each case-insensitive occurrence of `search` highlighted (the line the
    search is on, brighter). The line is shown as text: its escapes printable, its markup not
    parsed."""
    line = printable(line)
    text = Text()
    text.append(f"{rank_label(rank):>6} │ ", style="dim")  # the prefix only: the line itself reads plain
    start = len(text)
    text.append(line, style=NCCL_STYLE if is_nccl(line) else "")
    if search:
        lowered, needle = line.lower(), search.lower()
        at = lowered.find(needle)
        while at >= 0:
            text.stylize(CURRENT_STYLE if current else MATCH_STYLE, start + at, start + at + len(needle))
            at = lowered.find(needle, at + len(needle))
    return text


class LogView(Vertical):
    BINDINGS = [
        Binding("f", "cycle_filter", "Rank", tooltip="Filter rank"),
        Binding("k", "cycle_kind", "Kind", tooltip="Filter by kind: NCCL, warnings, errors"),
        Binding("slash", "search", "Search", tooltip="Search the logs (n/N: next/previous match)"),
        Binding("n", "search_next(1)", "Next match", show=False),
        Binding("N", "search_next(-1)", "Previous match", show=False),
        Binding("escape", "clear_search", "Clear search", show=False),
    ]

    def compose(self) -> ComposeResult:
        with Horizontal(id="log-bar"):
            yield Label("rank ", id="log-label")
            yield Select([("all ranks", ALL)], value=ALL, allow_blank=False, compact=True,
                         id="log-filter")
            yield Select([(label, kind) for kind, label in KINDS.items()], value=ALL,
                         allow_blank=False, compact=True, id="log-kind")
            yield Input(placeholder="search", id="log-search", compact=True)
            yield Label(HINT, id="log-hint")
        # min_width=1: a short line is not padded to 78 cells (a sideways scrollbar at 80)
        yield RichLog(id="log", max_lines=KEEP, wrap=False, markup=False, highlight=False, min_width=1)

    def on_mount(self) -> None:
        self._run_id = ""
        self._seen: dict[int, tuple[int, Any]] = {}  # rank -> (count read, last line object)
        self._lines: collections.deque[tuple[int, str]] = collections.deque(maxlen=KEEP)
        self._shown: list[tuple[int, str]] = []  # what the log shows now, in order
        self._rows: list[int] = []  # how many rows each line of _shown took (wrapped)
        self._width = 0  # the width lines are wrapped to (0: not known yet, not wrapped)
        self._ranks: tuple[int, ...] = ()
        self.search = ""
        self.match_index = -1  # which of the matches the search is on
        self.query_one("#log-search", Input).display = False
        self._rewrite()

    def _wanted(self, rank: int, line: str) -> bool:
        wanted, kind = self.filter, self.query_one("#log-kind", Select).value
        return (wanted == ALL or wanted == rank) and line_kind_matches(str(kind), line)

    @property
    def matches(self) -> list[int]:
        """Indexes (in the shown lines) of the lines the search finds."""
        needle = self.search.lower()
        return [i for i, (_, line) in enumerate(self._shown) if needle and needle in line.lower()]

    @property
    def filter(self) -> Any:
        return self.query_one("#log-filter", Select).value

    def show(self, snap: Snapshot) -> None:
        state = snap.state
        if state.run_id != self._run_id:
            self._run_id = state.run_id
            self._seen.clear()
            self._lines.clear()
            self.query_one("#log", RichLog).clear()
        ranks = tuple(sorted(set(state.ranks) | set(state.logs) | {-1}))
        if ranks != self._ranks:
            self._ranks = ranks
            select = self.query_one("#log-filter", Select)
            current = select.value
            with self.prevent(Select.Changed):
                select.set_options([("all ranks", ALL)] + [(rank_label(r), r) for r in ranks])
                select.value = current if current in ranks or current == ALL else ALL
        log = self.query_one("#log", RichLog)
        for rank, lines in state.logs.items():
            for line in self._new_lines(rank, lines):
                self._lines.append((rank, line))
                if self._wanted(rank, line):
                    if not self._shown:
                        log.clear()  # the "nothing yet" line
                    self._shown.append((rank, line))
                    self._write(log, format_line(rank, line, self.search))
        del self._shown[:-KEEP]
        del self._rows[:-KEEP]

    def _write(self, log: RichLog, text: Text) -> None:
        rows = wrap_text(text, self._width, hang=PREFIX)
        log.write(Text("\n").join(rows) if len(rows) > 1 else text)
        self._rows.append(len(rows))

    def on_resize(self) -> None:
        width = self.size.width - 2  # 2: the log's scrollbar, there or not (no sideways one)
        if width != self._width and width > PREFIX:
            self._width = width
            self._rewrite()

    def _new_lines(self, rank: int, lines: collections.deque[str]) -> list[str]:
        """Lines appended since the last call. The deque drops old lines when full,
        so past that point we find our place by the identity of the last line read."""
        count, last = self._seen.get(rank, (0, None))
        n = len(lines)
        if n == 0:
            return []
        if n == lines.maxlen and last is not None:
            new: list[str] = []
            for line in reversed(lines):
                if line is last:
                    break
                new.append(line)
            new.reverse()
        else:
            new = list(lines)[count:]
        self._seen[rank] = (n, lines[-1])
        return new

    def on_select_changed(self, event: Select.Changed) -> None:
        self._rewrite()

    def _rewrite(self) -> None:
        log = self.query_one("#log", RichLog)
        log.clear()
        self._shown = [(rank, line) for rank, line in self._lines if self._wanted(rank, line)]
        self._rows = []
        matches = self.matches
        current = matches[self.match_index] if 0 <= self.match_index < len(matches) else -1
        for i, (rank, line) in enumerate(self._shown):
            self._write(log, format_line(rank, line, self.search, current=i == current))
        if not self._shown:  # say why the view is empty instead of leaving it blank
            who = "any rank" if self.filter == ALL else f"{rank_label(int(self.filter))}"
            kind = self.query_one("#log-kind", Select).value
            what = "lines" if kind == ALL else f"{KINDS[str(kind)]} lines"
            log.write(Text(f"(no {what} from {who} yet)", style="dim italic"))

    # --- search -------------------------------------------------------------------------
    def action_search(self) -> None:
        box = self.query_one("#log-search", Input)
        box.display = True
        box.focus()

    def on_input_submitted(self, event: Input.Submitted) -> None:
        self.search = event.value.strip()
        self.match_index = -1
        self.query_one("#log", RichLog).focus()
        event.input.display = bool(self.search)
        self.action_search_next(1)

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        # Without a search, n and escape fall through to the app (n: run again).
        if action in ("search_next", "clear_search"):
            return bool(self.search)
        return True

    def action_search_next(self, delta: int) -> None:
        matches = self.matches
        hint = self.query_one("#log-hint", Label)
        if not matches:
            self.match_index = -1
            self._rewrite()
            hint.update(f"  no match for '{self.search}'" if self.search else "")
            return
        self.match_index = (self.match_index + delta) % len(matches) if self.match_index >= 0 else (
            0 if delta > 0 else len(matches) - 1)
        self._rewrite()
        log = self.query_one("#log", RichLog)
        # the match's first row: rows before it, less those the log has dropped from its top
        row = sum(self._rows[:matches[self.match_index]]) - (sum(self._rows) - len(log.lines))
        log.scroll_to(y=max(0, row - log.size.height // 2), animate=False)
        hint.update(f"  '{self.search}': match {self.match_index + 1} of {len(matches)} (n/N)")

    def action_clear_search(self) -> None:
        self.search, self.match_index = "", -1
        box = self.query_one("#log-search", Input)
        box.value, box.display = "", False
        self.query_one("#log-hint", Label).update(HINT)
        self._rewrite()

    def action_cycle_kind(self) -> None:
        select = self.query_one("#log-kind", Select)
        kinds = list(KINDS)
        select.value = kinds[(kinds.index(str(select.value)) + 1) % len(kinds)]

    def action_cycle_filter(self) -> None:
        options: list[Any] = [ALL, *self._ranks]
        select = self.query_one("#log-filter", Select)
        current = select.value
        select.value = options[(options.index(current) + 1) % len(options)] if current in options else ALL
