"""RankTable: one row per rank over its last 50 steps: where it runs, step, p50/p95, own
work (what the straggler verdict rests on), phase bar, its share of the job's samples/s and
status; the straggler is marked (only while the verdict names it). A narrow terminal drops
samples/s, then p95, then host/device, never cuts one. Scrolls for many ranks. A
multi-node run groups the rows by node, each group under a header line; above
NODE_VIEW_ABOVE ranks it shows one row per node instead, and a node opens into its rank
rows (ddptop.tui.widgets.node_rows).

Rows are drawn through LinesView (line API), not DataTable: DataTable re-renders
every visible cell whenever any cell changes, which alone took ~45 ms per refresh
with 64 ranks; here a refresh costs what the changed rows cost."""

from __future__ import annotations

from rich.text import Text
from textual import events
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.message import Message
from textual.widget import Widget
from textual.widgets import Static

from ddptop.model.figures import RECENT_LABEL, phase_shares_last50
from ddptop.model.nodes import NodeFigures
from ddptop.model.rank_state import timed_every
from ddptop.tui.live import Snapshot
from ddptop.tui.render import SLOW_STYLE, fit_columns, legend
from ddptop.tui.widgets.lines_view import LinesView
from ddptop.tui.widgets.node_rows import (
    NODE_COLUMNS,
    NODE_DROP,
    NODE_TITLE,
    NODE_VIEW_ABOVE,
    Row,
    grouped_items,
    node_header,
    node_items,
    node_of,
    node_row,
)
from ddptop.tui.widgets.rank_rows import (
    ARROWS,
    COLUMNS,
    DESCENDING_FIRST,
    DROP,
    GAP,
    LABELS,
    MAX_BAR,
    MIN_BAR,
    eval_key,
    rank_flags,
    rank_header,
    rank_row,
    sorted_ranks,
)
from ddptop.tui.widgets.step_timeline import TIMELINE_ROWS

__all__ = ["COLUMNS", "RankTable", "eval_key"]

CHROME = 3  # border top and bottom + the header line
MAX_SHARE = 0.75  # of the tab's height; past that the rows scroll
LANES_MIN = 4  # the rank lanes' rows under the timelines (app.tcss RankLanes)
CHARTS_MIN = 5  # rows the charts under the table keep (ThroughputPanel's min-height)
TITLE = f"ranks · figures over each rank's {RECENT_LABEL} steps"


class RankTable(Vertical):
    """Live per-rank table; call `show(snapshot)` to refresh it. `<`/`>` sort by the
    previous/next column, `i` inverts, a click on a column's title sorts by it."""

    BINDINGS = [
        # through the app, whose toast says the order now
        Binding("less_than_sign", "app.sort_step(-1)", "Sort by previous column", show=False),
        Binding("greater_than_sign", "app.sort_step(1)", "Sort by next column", show=False),
        Binding("i", "app.invert_sort", "Invert sort", show=False),
        Binding("I", "app.invert_sort", "Invert sort", show=False),  # htop's
        Binding("enter", "choose", "Detail", tooltip="Open the rank: timeline, memory, processes; on a node's row, open/close it"),
        # a multi-node run only (check_action): the node rows of a big run, a node's ranks
        Binding("n", "toggle_node", "Open/close node", tooltip="Show or hide the ranks of the cursor's node"),
        Binding("N", "node_view", "Node rows / every rank", show=False),
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
        self._header_for: tuple[int, tuple[str, ...], str, bool, bool] | None = None
        self._subtitle: Text | None = None
        self.sort_key = "rank"
        self._items: list[Row] = []
        self.sort_descending = False
        self.border_title = TITLE
        self._shown_cols: list[str] = [k for k, *_ in COLUMNS]
        self._node_cols: list[str] = [k for k, *_ in NODE_COLUMNS]
        self.node_view: bool | None = None  # one row per node (None: above NODE_VIEW_ABOVE ranks)
        self.opened: set[int | None] = set()  # the nodes shown with their ranks, in the node view
        self._keys_for: tuple[bool, bool] | None = None  # (multi-node, node view) the footer shows keys for

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
        if isinstance(self._cursor_item(), NodeFigures):
            self.action_toggle_node()
            return
        rank = self.cursor_rank
        if rank is not None:
            self.post_message(self.RankChosen(rank))

    def nodes_shown(self, snap: Snapshot) -> bool:
        """One row per node: a multi-node run above NODE_VIEW_ABOVE ranks, unless `N` said otherwise."""
        auto = len(snap.state.ranks) > NODE_VIEW_ABOVE
        return bool(snap.nodes) and (auto if self.node_view is None else self.node_view)

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        """`n` and `N` on a multi-node run only (`n` in the node view): hidden otherwise."""
        if action not in ("toggle_node", "node_view"):
            return True
        snap = self._last
        return snap is not None and bool(snap.nodes) and (action == "node_view" or self.nodes_shown(snap))

    def action_toggle_node(self) -> None:
        """Open or close the cursor's node; from one of its rank rows, close it (the cursor
        goes to the node's row)."""
        snap, item = self._last, self._cursor_item()
        if snap is None or not self.nodes_shown(snap):
            if snap is not None and snap.nodes:
                self.app.notify("n opens a node's row: N shows the node rows first", timeout=4)
            else:
                self.app.action_point_to("n")  # type: ignore[attr-defined]
            return
        rank = self.cursor_rank
        nf = item if isinstance(item, NodeFigures) else node_of(snap, rank) if rank is not None else None
        if nf is not None:
            self.opened ^= {nf.node}
            self._show_keeping(("node", nf.node))

    def action_node_view(self) -> None:
        """Switch between one row per node and every rank (grouped by node); the cursor stays
        on its node, or its rank where that rank is shown."""
        snap = self._last
        if snap is None or not snap.nodes:
            self.app.action_point_to("n")  # type: ignore[attr-defined]
            return
        key = self._cursor_key(snap)
        self.node_view = not self.nodes_shown(snap)
        self._show_keeping(key)

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
        if self._last is not None and self.nodes_shown(self._last):  # node columns, each sorting by a rank column's key
            spans = [(w, sort) for k, _, w, _, sort in NODE_COLUMNS if k in self._node_cols]
        else:
            widths = {k: w for k, _, w, _ in COLUMNS}
            spans = [(widths[k] or self.bar_width(), k) for k in self._shown_cols]
        for width, key in spans:
            edge += width + len(GAP)
            if x < edge:
                if key == self.sort_key:
                    self.action_invert_sort()
                elif key is not None:
                    self.sort_by(key)
                return

    def compose(self) -> ComposeResult:
        yield Static("", id="rank-header")
        yield LinesView(id="rank-rows")

    @property
    def body(self) -> LinesView:
        return self.query_one("#rank-rows", LinesView)

    def _cursor_item(self) -> Row | None:
        cursor = self.body.cursor
        return self._items[cursor] if 0 <= cursor < len(self._items) else None

    @property
    def cursor_rank(self) -> int | None:
        """The rank on the cursor's row; on a node's header row, that node's first rank; on
        a node's row, its straggler or else its first rank (None before any row)."""
        item = self._cursor_item()
        if isinstance(item, NodeFigures):
            return item.straggler if item.straggler is not None else next(iter(item.ranks), None)
        cursor = self.body.cursor
        return next((item for item in self._items[cursor:] if isinstance(item, int)), None) if item is not None else None

    @property
    def cursor_on_node(self) -> bool:
        """The cursor is on a node's row (the node view): Enter opens the node."""
        return isinstance(self._cursor_item(), NodeFigures)

    def _cursor_key(self, snap: Snapshot) -> tuple[str, int | None] | None:
        """What the cursor's row stands for: a node (its row or header line) or a rank."""
        item = self._cursor_item()
        if isinstance(item, NodeFigures):
            return ("node", item.node)
        if isinstance(item, int):
            return ("rank", item)
        nf = node_of(snap, self.cursor_rank) if self.cursor_rank is not None else None
        return ("node", nf.node) if nf is not None else None

    def _index_of(self, key: tuple[str, int | None], snap: Snapshot) -> int | None:
        """The row of `key` now: a rank's (else its node's); a node's row, or its header line."""
        kind, ident = key
        for i, item in enumerate(self._items):
            if (kind == "rank" and isinstance(item, int) and item == ident) or (
                    kind == "node" and isinstance(item, NodeFigures) and item.node == ident):
                return i
        if kind == "rank":
            nf = node_of(snap, ident) if ident is not None else None
            return self._index_of(("node", nf.node), snap) if nf is not None else None
        members = next((set(nf.ranks) for nf in snap.nodes if nf.node == ident), set())
        firsts = [i for i, item in enumerate(self._items) if isinstance(item, int) and item in members]
        return min(firsts) - 1 if firsts else None  # the header line above the node's first rank

    def _show_keeping(self, key: tuple[str, int | None] | None) -> None:
        """Show the rows again after they changed (a node opened or closed, the view switched),
        the cursor on the row of `key`."""
        snap = self._last
        if snap is None:
            return
        self.show(snap)
        index = self._index_of(key, snap) if key is not None else None
        if index is not None:
            self.body.move_cursor(index)

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

    def node_columns(self) -> list[str]:
        """The node view's columns that fit the table's width."""
        room = (self.body.content_region.width or 100) - 1 + len(GAP)
        widths = {k: w for k, _, w, *_ in NODE_COLUMNS}
        return fit_columns(list(widths), widths, room, NODE_DROP, len(GAP))

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
        nodes = self.nodes_shown(snap)
        if (bool(snap.nodes), nodes) != self._keys_for:  # `n` and `N` come and go with them
            self._keys_for = (bool(snap.nodes), nodes)
            self.refresh_bindings()
        cols = self._shown_cols = self.columns()
        node_cols = self._node_cols = self.node_columns()
        bar_w = self.bar_width()
        # a row is a rank, a node's header line (Text), or on the node view a node
        items = self._items = self._ordered(snap, nodes, cols, bar_w)
        height = self._fit_height(len(items))
        if height != self._rows_for:
            self._rows_for = height
            self.styles.height = height
        if (bar_w, tuple(cols), self.sort_key, self.sort_descending, nodes) != self._header_for:
            self._header_for = (bar_w, tuple(cols), self.sort_key, self.sort_descending, nodes)
            arrow = ARROWS[self.sort_descending]
            self.query_one("#rank-header", Static).update(
                node_header(node_cols, self.sort_key, arrow) if nodes else self._header(cols, bar_w))
            self.border_title = NODE_TITLE if nodes else TITLE
        every = timed_every(rs.info for rs in snap.state.ranks.values())
        timed = Text(f"1 step in {every} timed  " if every > 1 else "", style="dim")
        subtitle = (legend(snap.phase_names, phase_shares_last50(snap.ranks, snap.phase_names)) + eval_key(snap)
                    + timed + Text("▲ straggler", style=SLOW_STYLE))
        if subtitle != self._subtitle:  # the shares move by a percent now and then
            self.border_subtitle = self._subtitle = subtitle
        slow = snap.slowest if snap.state.world_size > 1 else None
        flags = rank_flags(snap)

        def line(i: int) -> Text:
            item = items[i]
            if isinstance(item, NodeFigures):
                return node_row(item, node_cols, item.node in self.opened)
            return item if isinstance(item, Text) else rank_row(item, snap, item == slow, cols, bar_w, flags.get(item))

        self.body.set_lines(self.body.lines_in_view(len(items), line))

    def _header(self, cols: list[str], bar_w: int) -> Text:
        return rank_header(cols, bar_w, self.sort_key, self.sort_descending)

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

    def _ordered(self, snap: Snapshot, nodes: bool, cols: list[str], bar_w: int) -> list[Row]:
        """The rows in order: ranks sorted as asked; on a multi-node run under their node's
        header line (sorted within each node), or on the node view each node, sorted as
        asked, and the ranks of those opened under theirs."""
        def ranks_in(ranks: list[int]) -> list[int]:
            return sorted_ranks(ranks, snap, self.sort_key, self.sort_descending)

        if nodes:
            sub_header = self._header(cols, bar_w)
            sub_header.stylize("dim")
            return node_items(snap, self.opened, self.sort_key, self.sort_descending, ranks_in, sub_header)
        return grouped_items(snap, ranks_in) if snap.nodes else list(ranks_in(sorted(snap.state.ranks)))
