"""The rank table's rank rows: the columns (what a narrow terminal drops first), each
rank's row over its last 50 steps, the column titles, and the order the table sorts by.
Text in, Text out: every figure is the Snapshot's."""

from __future__ import annotations

from collections.abc import Callable

from rich.text import Text

from ddptop.model.figures import eval_ms_per_step_run
from ddptop.model.report import fmt
from ddptop.tui.live import Snapshot, rank_location
from ddptop.tui.render import SLOW_STYLE, STATUS_STYLES, cells_row, phase_bar, truncate

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


# Each column's value for a rank, as the table sorts by it (None: not known yet).
SORT_VALUES: dict[str, Callable[[int, Snapshot], float | str | None]] = {
    "rank": lambda r, snap: r,
    "where": lambda r, snap: rank_location(snap.state.ranks[r]),
    "step": lambda r, snap: snap.state.ranks[r].steps_run(),
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



def rank_header(cols: list[str], bar_w: int, sort_key: str, descending: bool) -> Text:
    """The column titles; the sorted one in reverse with its arrow, as htop's."""
    spec = {k: (w or bar_w, right) for k, _, w, right in COLUMNS}
    cells: list[tuple[str, str | None]] = []
    for key in cols:
        sorted_here = key == sort_key and (key != "rank" or descending)
        label = LABELS[key] + (ARROWS[descending] if sorted_here else "")
        cells.append((label, "bold reverse" if sorted_here else "bold"))
    return cells_row(cells, [spec[k] for k in cols])


def rank_row(r: int, snap: Snapshot, is_slow: bool, cols: list[str], bar_w: int, flag: str | None = None) -> Text:
    """One rank's row: plain string formatting plus a few spans (a Text per cell, truncated
    and aligned, cost ~4x more at 64 ranks)."""
    rs, f = snap.state.ranks[r], snap.ranks[r]
    status = flag or snap.status[r]
    values = {
        "rank": f"{('▲' if is_slow else ' ') + str(r):<5.5}",
        "where": f"{truncate(rank_location(rs), 12):<12}",
        "step": f"{rs.steps_run() or '-':>6}",
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
