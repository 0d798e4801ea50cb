"""RankTable: one row per rank over its last 50 steps: where it runs, step, p50/p95, own
work (what the straggler verdict rests on), phase bar, its share of the job's samples/s and
status; the straggler is marked (only while the verdict names it). A narrow terminal drops
samples/s, then p95, then host/device, never cuts one. Scrolls for many ranks. A
multi-node run groups the rows by node, each group under a header line.

Rows are drawn through LinesView (line API), not DataTable: DataTable re-renders
every visible cell whenever any cell changes, which alone took ~45 ms per refresh
with 64 ranks; here a refresh costs what the changed rows cost."""

from __future__ import annotations

from collections.abc import Callable

from rich.text import Text
from textual import events
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.message import Message
from textual.widget import Widget
from textual.widgets import Static

from ddptop.model.figures import RECENT_LABEL, eval_ms_per_step_run, phase_shares_last50
from ddptop.model.report import fmt
from ddptop.model.state import RunState
from ddptop.tui.live import Snapshot, rank_location
from ddptop.tui.render import SLOW_STYLE, STATUS_STYLES, fit_columns, legend, phase_bar, truncate
from ddptop.tui.widgets.lines_view import LinesView
from ddptop.tui.widgets.step_timeline import TIMELINE_ROWS

# key, label, width (None: the phase bar takes what is left), right-aligned; each width
# leaves a cell for the sort arrow after the label
COLUMNS = (
    ("rank", "rank", 5, False),
    ("where", "host/device", 12, False),
    ("step", "step", 6, True),
    ("p50", "p50 ms", 7, True),
    ("p95", "p95 ms", 7, True),
    ("own", "own ms", 7, True),
    ("phases", "phases", None, False),
    ("samples", "samples/s", 10, True),
    ("status", "status", 9, False),
)
DROP = ("samples", "p95", "where")  # what a narrow terminal leaves out, first first
ARROWS = {True: "↓", False: "↑"}  # the sorted column's direction (▲ marks the straggler)
LABELS = {k: lbl for k, lbl, _, _ in COLUMNS}
GAP = "  "
# What each column sorts by, and whether its first press puts the largest first (htop's `<`/`>`
# pick the column, `i` inverts): timings, steps and rates largest first, the rest ascending.
# The phase bar sorts by the share of the step spent waiting on communication.
DESCENDING_FIRST = {"step", "p50", "p95", "own", "phases", "samples"}
MIN_BAR, MAX_BAR = 8, 160  # the bar takes the width the other columns leave (issue 21: it stayed 40 at 200 columns)
CHROME = 3  # border top and bottom + the header line
MAX_SHARE = 0.75  # of the tab's height; past that the rows scroll
LANES_MIN = 4  # the rank lanes' rows under the timelines (app.tcss RankLanes)
CHARTS_MIN = 5  # rows the charts under the table keep (ThroughputPanel's min-height)
NODE_STYLE = "bold #5fafd7"
TITLE = f"ranks · figures over each rank's {RECENT_LABEL} steps"


def node_groups(state: RunState) -> list[tuple[Text, list[int]]] | None:
    """Ranks by ddptop node, each with its header line (node, hosts, rank count); None on
    a single-node run. Ranks whose hello has not arrived come last, as "not connected"."""
    if state.nnodes <= 1:
        return None
    by_node: dict[int | None, list[int]] = {}
    hosts: dict[int | None, list[str]] = {}
    for r in sorted(state.ranks):
        hello = state.ranks[r].hello
        node = hello.node if hello is not None else None
        by_node.setdefault(node, []).append(r)
        if hello is not None and hello.host not in hosts.setdefault(node, []):
            hosts[node].append(hello.host)
    groups = []
    for node in sorted(by_node, key=lambda n: (n is None, n or 0)):
        ranks = by_node[node]
        what = "not connected yet" if node is None else f"node {node} · {', '.join(hosts[node])}"
        head = Text(f"{what} · {len(ranks)} rank{'s' if len(ranks) != 1 else ''}", style=NODE_STYLE,
                    no_wrap=True, overflow="ellipsis")
        groups.append((head, ranks))
    return groups


def cell(value: Text | str, width: int, right: bool = False) -> Text:
    text = value.copy() if isinstance(value, Text) else Text(value)
    text.truncate(width, overflow="ellipsis")
    text.align("right" if right else "left", width)
    return text


def join_cells(cells: list[Text], widths: list[int], rights: list[bool]) -> Text:
    row = Text(no_wrap=True, overflow="crop")
    for i, (value, width, right) in enumerate(zip(cells, widths, rights)):
        if i:
            row.append(GAP)
        row.append_text(cell(value, width, right))
    return row


# Each column's value for a rank, as the table sorts by it (None: not known yet).
SORT_VALUES: dict[str, Callable[[int, Snapshot], float | str | None]] = {
    "rank": lambda r, snap: r,
    "where": lambda r, snap: rank_location(snap.state.ranks[r]),
    "step": lambda r, snap: snap.state.ranks[r].last_step,
    "p50": lambda r, snap: snap.ranks[r].p50,
    "p95": lambda r, snap: snap.ranks[r].p95,
    "own": lambda r, snap: snap.ranks[r].own_ms,
    "phases": lambda r, snap: snap.ranks[r].exposed_share,
    "samples": lambda r, snap: snap.rank_samples_per_s.get(r),
    "status": lambda r, snap: snap.status.get(r, ""),
}


def sorted_ranks(ranks: list[int], snap: Snapshot, key: str, descending: bool) -> list[int]:
    """`ranks` by column `key`, each rank's value read once; ranks with no value (or no
    figures yet) last, in the order given."""
    value = SORT_VALUES[key]
    have = {r: value(r, snap) for r in ranks if r in snap.ranks}
    known = sorted((r for r, v in have.items() if v is not None), key=lambda r: (have[r], r),
                   reverse=descending)
    placed = set(known)
    return known + [r for r in ranks if r not in placed]


class RankTable(Vertical):
    """Live per-rank table; call `show(snapshot)` to refresh it. `<`/`>` sort by the
    previous/next column, `i` inverts, a click on a column's title sorts by it."""

    BINDINGS = [
        Binding("less_than_sign", "sort_column(-1)", "Sort by previous column", show=False),
        Binding("greater_than_sign", "sort_column(1)", "Sort by next column", show=False),
        Binding("i", "invert_sort", "Invert sort", show=False),
        Binding("I", "invert_sort", "Invert sort", show=False),  # htop's
        Binding("enter", "choose", "Detail", tooltip="Open the rank: timeline, memory, processes"),
    ]

    class RankChosen(Message):
        """Enter (or a double click) on a rank's row: the app opens its detail."""

        def __init__(self, rank: int) -> None:
            super().__init__()
            self.rank = rank

    def __init__(self, **kwargs) -> None:  # noqa: ANN003 - Widget's options
        super().__init__(**kwargs)
        self._last: Snapshot | None = None
        self._rows_for = -1
        self._header_for: tuple[int, tuple[str, ...], str, bool] | None = None
        self._subtitle: Text | None = None
        self.sort_key = "rank"
        self._items: list[int | Text] = []
        self.sort_descending = False
        self.border_title = TITLE
        self._shown_cols: list[str] = [k for k, *_ in COLUMNS]

    def sort_label(self) -> str:
        return f"{LABELS[self.sort_key]} {ARROWS[self.sort_descending]}"

    def sort_by(self, key: str, descending: bool | None = None) -> None:
        """Sort the rows by column `key` (one of COLUMNS' keys); largest first for timings
        and rates unless `descending` says otherwise."""
        self.sort_key = key
        self.sort_descending = key in DESCENDING_FIRST if descending is None else descending
        if self._last is not None:
            self.show(self._last)

    def action_sort_column(self, delta: int) -> None:
        keys = [k for k, *_ in COLUMNS]
        self.sort_by(keys[(keys.index(self.sort_key) + delta) % len(keys)])

    def action_choose(self) -> None:
        rank = self.cursor_rank
        if rank is not None:
            self.post_message(self.RankChosen(rank))

    def action_invert_sort(self) -> None:
        self.sort_by(self.sort_key, not self.sort_descending)

    def on_click(self, event: events.Click) -> None:
        """A click on the header line sorts by the column under it (again: inverts)."""
        header = self.query_one("#rank-header", Static)
        if event.widget is self.body and event.chain == 2:  # a double click on a row opens the rank
            self.action_choose()
            return
        if event.widget is not header:
            return
        x, edge = event.x, 0
        widths = {k: w for k, _, w, _ in COLUMNS}
        for key in self._shown_cols:
            edge += (widths[key] or self.bar_width()) + len(GAP)
            if x < edge:
                if key == self.sort_key:
                    self.action_invert_sort()
                else:
                    self.sort_by(key)
                return

    def compose(self) -> ComposeResult:
        yield Static("", id="rank-header")
        yield LinesView(id="rank-rows")

    @property
    def body(self) -> LinesView:
        return self.query_one("#rank-rows", LinesView)

    @property
    def cursor_rank(self) -> int | None:
        """The rank on the cursor's row; on a node's header row, that node's first rank
        (None before any row)."""
        cursor = self.body.cursor
        if not 0 <= cursor < len(self._items):
            return None
        return next((item for item in self._items[cursor:] if isinstance(item, int)), None)

    def row_texts(self) -> list[str]:
        """The rows as plain text (tests, screen readers of a sort)."""
        return [t.plain for t in self.body.lines]

    def focus(self, scroll_visible: bool = True) -> RankTable:
        self.body.focus(scroll_visible)
        return self

    def columns(self) -> list[str]:
        """The columns that fit the table's width (the bar at least MIN_BAR wide)."""
        room = (self.body.content_region.width or 100) - 1 + len(GAP)  # 1: the scrollbar, if any
        widths = {k: w or MIN_BAR for k, _, w, _ in COLUMNS}
        return fit_columns([k for k, *_ in COLUMNS], widths, room, DROP, len(GAP))

    def bar_width(self) -> int:
        width = self.body.content_region.width or 100
        widths = {k: w for k, _, w, _ in COLUMNS}
        fixed = sum(widths[k] or 0 for k in self._shown_cols) + len(GAP) * (len(self._shown_cols) - 1)
        return max(MIN_BAR, min(MAX_BAR, width - fixed - 1))  # 1: the scrollbar, if any

    def on_resize(self, event: events.Resize) -> None:
        if self._last is not None:
            self.show(self._last)

    def show(self, snap: Snapshot) -> None:
        self._last = snap
        state = snap.state
        groups = node_groups(state)
        height = self._fit_height(len(state.ranks) + (len(groups) if groups else 0))
        if height != self._rows_for:
            self._rows_for = height
            self.styles.height = height
        cols = self._shown_cols = self.columns()
        bar_w = self.bar_width()
        if (bar_w, tuple(cols), self.sort_key, self.sort_descending) != self._header_for:
            self._header_for = (bar_w, tuple(cols), self.sort_key, self.sort_descending)
            self.query_one("#rank-header", Static).update(self._header(cols, bar_w))
        subtitle = legend(snap.phase_names, phase_shares_last50(snap.ranks, snap.phase_names)) + eval_key(snap) + Text("▲ straggler", style=SLOW_STYLE)
        if subtitle != self._subtitle:  # the shares move by a percent now and then
            self.border_subtitle = self._subtitle = subtitle
        slow = snap.slowest if state.world_size > 1 else None
        flags = rank_flags(snap)
        # a row is a rank, or a node's header line (Text) on a multi-node run
        items = self._items = self._ordered(snap, groups)

        def line(i: int) -> Text:
            item = items[i]
            return item if isinstance(item, Text) else rank_row(item, snap, item == slow, cols, bar_w, flags.get(item))

        self.body.set_lines(self.body.lines_in_view(len(items), line))

    def _header(self, cols: list[str], bar_w: int) -> Text:
        """The column titles; the sorted one in reverse with its arrow, as htop's."""
        spec = {k: (w or bar_w, right) for k, _, w, right in COLUMNS}
        cells = []
        for key in cols:
            sorted_here = key == self.sort_key and (key != "rank" or self.sort_descending)
            label = LABELS[key] + (ARROWS[self.sort_descending] if sorted_here else "")
            cells.append(Text(label, style="bold reverse" if sorted_here else "bold"))
        return join_cells(cells, [spec[k][0] for k in cols], [spec[k][1] for k in cols])

    def _fit_height(self, rows: int) -> int:
        """The rows plus the border, at most MAX_SHARE of the tab and never so much that
        the charts below lose their CHARTS_MIN rows (at 80x24 they had been pushed off)."""
        height = rows + CHROME
        parent = self.parent
        pane = parent.size.height if isinstance(parent, Widget) else 0
        if pane and isinstance(parent, Widget):
            # and the step timelines' rows and the lanes' least, when a tall terminal shows them
            tall = any(w.display for w in parent.query_children("#timelines"))
            height = min(height, int(pane * MAX_SHARE), pane - CHARTS_MIN - (TIMELINE_ROWS + LANES_MIN if tall else 0))
        return max(height, 5)

    def _ordered(self, snap: Snapshot, groups: list[tuple[Text, list[int]]] | None) -> list[int | Text]:
        """The rows in order: ranks sorted as asked, under their node's header line on a
        multi-node run (sorted within each node)."""
        if groups is None:
            return list(sorted_ranks(sorted(snap.state.ranks), snap, self.sort_key, self.sort_descending))
        items: list[int | Text] = []
        for head, ranks in groups:
            items += [head, *sorted_ranks(ranks, snap, self.sort_key, self.sort_descending)]
        return items



def rank_row(r: int, snap: Snapshot, is_slow: bool, cols: list[str], bar_w: int, flag: str | None = None) -> Text:
    """One rank's row: plain string formatting plus a few spans (a Text per cell, truncated
    and aligned, cost ~4x more at 64 ranks)."""
    rs, f = snap.state.ranks[r], snap.ranks[r]
    status = flag or snap.status[r]
    values = {
        "rank": f"{('▲' if is_slow else ' ') + str(r):<5.5}",
        "where": f"{truncate(rank_location(rs), 12):<12}",
        "step": f"{rs.last_step + 1 if rs.last_step >= 0 else '-':>6}",
        "p50": f"{fmt(f.p50, '.1f', '-'):>7}", "p95": f"{fmt(f.p95, '.1f', '-'):>7}",
        "own": f"{fmt(f.own_ms, '.1f', '-'):>7}",
        "samples": f"{fmt(snap.rank_samples_per_s.get(r), '.0f', '-'):>10}",
        "status": f"{status:<9.9}",
    }
    row = Text(no_wrap=True, overflow="crop")
    for i, key in enumerate(cols):
        if i:
            row.append(GAP)
        if key == "phases":
            row.append_text(phase_bar(f.phases, bar_w))
        elif key == "status":
            row.append(values[key], STATUS_STYLES.get(status, ""))
        else:
            row.append(values[key], SLOW_STYLE if is_slow and key in ("rank", "own") else None)
    return row


def eval_key(snap: Snapshot) -> Text:
    """Forwards without grad (validation, generation), outside the phases: their mean ms a
    measured step over the ranks that ran some; nothing when none did."""
    ms = eval_ms_per_step_run(snap.state.ranks.values())
    if ms is None:
        return Text()
    return Text(f"no-grad fwd {ms:.1f} ms/step (not in phases)  ", style="dim")


def rank_flags(snap: Snapshot) -> dict[int, str]:
    """rank -> what the status column says instead: the ranks a stall suspects, the
    straggler (a suspect wins: a hang matters more than a slow rank)."""
    flags = {}
    if snap.straggler is not None:
        flags[snap.straggler.rank] = "straggler"
    if snap.stall is not None:
        flags.update(dict.fromkeys(snap.stall.suspects, "suspect"))
    return flags
