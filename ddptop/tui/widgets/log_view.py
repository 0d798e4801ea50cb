"""LogView: every rank's output (and torchrun/ddptop's own, as rank -1), filterable
by rank, NCCL lines highlighted. Follows the live RunState's bounded log deques."""

from __future__ import annotations

import collections
import re
from typing import Any

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.widgets import Label, RichLog, Select

from ddptop.tui.live import Snapshot
from ddptop.tui.render import NCCL_STYLE

KEEP = 5000  # lines this view keeps to re-filter (RunState keeps 2000 per rank)
ALL = "all"


_NCCL = re.compile(r"\bNCCL (?:INFO|WARN|TRACE|ABORT|version)\b")


def is_nccl(line: str) -> bool:
    """NCCL's own debug lines (not, say, a torch warning naming a TORCH_NCCL_ variable)."""
    return _NCCL.search(line) is not None


def rank_label(rank: int) -> str:
    return "ddptop" if rank < 0 else f"r{rank}"


def format_line(rank: int, line: str) -> Text:
    text = Text(f"{rank_label(rank):>6} │ ", style="dim")
    text.append(line, style=NCCL_STYLE if is_nccl(line) else "")
    return text


class LogView(Vertical):
    BINDINGS = [Binding("f", "cycle_filter", "Filter rank")]

    def compose(self) -> ComposeResult:
        with Horizontal(id="log-bar"):
            yield Label("rank ", id="log-label")
            yield Select([("all ranks", ALL)], value=ALL, allow_blank=False, compact=True,
                         id="log-filter")
            yield Label("  NCCL lines highlighted; f cycles the filter", id="log-hint")
        yield RichLog(id="log", max_lines=KEEP, wrap=False, markup=False, highlight=False)

    def on_mount(self) -> None:
        self._run_id = ""
        self._seen: dict[int, tuple[int, Any]] = {}  # rank -> (count read, last line object)
        self._lines: collections.deque[tuple[int, str]] = collections.deque(maxlen=KEEP)
        self._ranks: tuple[int, ...] = ()

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
        wanted = self.filter
        for rank, lines in state.logs.items():
            for line in self._new_lines(rank, lines):
                self._lines.append((rank, line))
                if wanted == ALL or wanted == rank:
                    log.write(format_line(rank, line))

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
        wanted = self.filter
        for rank, line in self._lines:
            if wanted == ALL or wanted == rank:
                log.write(format_line(rank, line))

    def action_cycle_filter(self) -> None:
        options: list[Any] = [ALL, *self._ranks]
        select = self.query_one("#log-filter", Select)
        current = select.value
        select.value = options[(options.index(current) + 1) % len(options)] if current in options else ALL
