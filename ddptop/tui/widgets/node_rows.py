"""The rank table's rows on a multi-node run (issue 30): every rank under its node's header
line, or, above NODE_VIEW_ABOVE ranks, one row per node (its ranks by condition, the steps
they are at, the node's p50 and own work, the straggler when it runs there), a node opened
showing its rank rows under it. Text in, Text out: the figures are the Snapshot's
(ddptop.model.nodes), read here, never computed."""

from __future__ import annotations

from collections.abc import Callable, Collection

from rich.text import Text

from ddptop.model.figures import RECENT_LABEL
from ddptop.model.nodes import NodeFigures
from ddptop.model.report import fmt
from ddptop.tui.live import Snapshot
from ddptop.tui.render import SLOW_STYLE, STATUS_STYLES, cells_row

# Above this many ranks a multi-node run opens as one row per node, whatever the terminal's
# height: 64 ranks on 8 nodes (72 rows) still read rank by rank; a view that changed with
# the terminal's height would change under a resize, and 16 ranks already fill 80x24.
NODE_VIEW_ABOVE = 64
# key, label, width, right-aligned, the rank table's sort key it sorts by (None: none)
NODE_COLUMNS = (
    ("node", "node", 7, False, "rank"),
    ("host", "host", 12, False, "where"),
    ("ranks", "ranks", 5, True, None),
    ("steps", "steps", 11, True, "step"),
    ("p50", "p50 ms", 7, True, "p50"),
    ("own", "own ms", 7, True, "own"),
    ("straggler", "straggler", 11, False, None),
    ("state", "state", 22, False, "status"),
)
NODE_DROP = ("host", "ranks")  # what a narrow terminal leaves out, first first (state counts the ranks too)
NODE_TITLE = f"nodes · p50: median of its ranks' {RECENT_LABEL} p50 · own: its ranks' most"
NODE_STYLE = "bold #5fafd7"
DOWN_STYLE = STATUS_STYLES["suspect"]
Row = int | Text | NodeFigures  # a rank, a header line, a node

# Each rank column's sort key as it sorts the nodes (None: in node order).
NODE_SORT_VALUES: dict[str, Callable[[NodeFigures], float | str | None]] = {
    "rank": lambda nf: nf.node, "where": lambda nf: nf.node,
    "step": lambda nf: nf.first_step if nf.first_step >= 0 else None,
    "p50": lambda nf: nf.p50, "own": lambda nf: nf.own_ms,
    "status": lambda nf: trouble(nf),
}
_TROUBLE = ("failed", "lost", "stalled", "live", "done")


def trouble(nf: NodeFigures) -> int:
    """How bad a node's state is, worst first: down, then a failed, lost, stalled rank."""
    return 0 if nf.down else 1 + min((_TROUBLE.index(c) for c in nf.counts), default=len(_TROUBLE))


def group_header(nf: NodeFigures) -> Text:
    """The header line above a node's rank rows (every rank shown)."""
    n = len(nf.ranks)
    what = "not connected yet" if nf.node is None else f"node {nf.node} · {', '.join(nf.hosts)}"
    return Text(f"{what} · {n} rank{'s' if n != 1 else ''}", style=NODE_STYLE, no_wrap=True, overflow="ellipsis")


def state_text(nf: NodeFigures) -> tuple[str, str]:
    """(what the node's ranks are doing, its style): "8 live", "7 live 1 stalled"; a node
    whose every rank stalled or was lost says so first ("all 8 lost", "down: 5 stalled 3 lost")."""
    counts = " ".join(f"{n} {c}" for c, n in nf.counts.items())
    if nf.down:
        only = len(nf.counts) == 1
        return (f"all {counts}" if only else f"down: {counts}"), DOWN_STYLE
    for cond, word in (("failed", "failed"), ("lost", "lost"), ("stalled", "stalled?")):
        if cond in nf.counts:
            return counts, STATUS_STYLES[word]
    return counts, STATUS_STYLES["running" if "live" in nf.counts else "done"]


def node_row(nf: NodeFigures, cols: list[str], is_open: bool) -> Text:
    """One node's row in the columns `cols` (NODE_COLUMNS' keys that fit)."""
    first, last = nf.first_step + 1, nf.last_step + 1  # shown as the rank rows show a step
    state, style = state_text(nf)
    values = {
        "node": f"{'▾' if is_open else '▸'} {'▲' if nf.straggler is not None else ' '}"
                f"{nf.node if nf.node is not None else '-'}",
        "host": ", ".join(nf.hosts) or "not connected",
        "ranks": str(len(nf.ranks)),
        "state": state,
        "steps": "-" if nf.last_step < 0 else str(last) if first == last else f"{first}-{last}",
        "p50": fmt(nf.p50, ".1f", "-"), "own": fmt(nf.own_ms, ".1f", "-"),
        "straggler": f"▲ rank {nf.straggler}" if nf.straggler is not None else "",
    }
    styles = {"state": style, "straggler": SLOW_STYLE,
              "node": SLOW_STYLE if nf.straggler is not None else NODE_STYLE}
    return cells_row([(values[k], styles.get(k)) for k in cols], [_SPEC[k] for k in cols])


def node_header(cols: list[str], sort_key: str, arrow: str) -> Text:
    """The node columns' titles; the one that sorts as the table does in reverse, with its arrow."""
    cells = []
    for key in cols:
        here = _SORTS[key] == sort_key and (sort_key != "rank" or arrow == "↓")
        cells.append((_LABELS[key] + (arrow if here else ""), "bold reverse" if here else "bold"))
    return cells_row(cells, [_SPEC[k] for k in cols])


def node_items(snap: Snapshot, opened: Collection[int | None], sort_key: str, descending: bool,
               ranks_in: Callable[[list[int]], list[int]], sub_header: Text) -> list[Row]:
    """Node view's rows: each node (sorted as the table is, by its NODE_SORT_VALUES), and under
    an opened one the rank columns' titles (dim) and its ranks as `ranks_in` orders them."""
    value = NODE_SORT_VALUES.get(sort_key)
    nodes = list(snap.nodes)
    if value is not None:
        have = {i: value(nf) for i, nf in enumerate(nodes)}
        known = sorted((i for i, v in have.items() if v is not None), key=lambda i: (have[i], i), reverse=descending)
        nodes = [nodes[i] for i in known] + [nf for i, nf in enumerate(nodes) if have[i] is None]
    items: list[Row] = []
    for nf in nodes:
        items.append(nf)
        if nf.node in opened:
            items += [sub_header, *ranks_in(list(nf.ranks))]
    return items


def grouped_items(snap: Snapshot, ranks_in: Callable[[list[int]], list[int]]) -> list[Row]:
    """Every rank, under its node's header line (sorted within each node)."""
    items: list[Row] = []
    for nf in snap.nodes:
        items += [group_header(nf), *ranks_in(list(nf.ranks))]
    return items


def node_of(snap: Snapshot, rank: int) -> NodeFigures | None:
    return next((nf for nf in snap.nodes if rank in nf.ranks), None)


def row_key(item: Row) -> tuple[str, int | None] | None:
    """What a row stands for, to find it again after the rows change (None: a header line)."""
    if isinstance(item, NodeFigures):
        return ("node", item.node)
    return ("rank", item) if isinstance(item, int) else None


_SPEC = {k: (w, right) for k, _, w, right, _ in NODE_COLUMNS}
_LABELS = {k: lbl for k, lbl, *_ in NODE_COLUMNS}
_SORTS = {k: s for k, *_, s in NODE_COLUMNS}
