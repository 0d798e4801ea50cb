"""Layout snapshots (issue 21, "must show" 1): every tab at 80x24, 120x40 and 200x60 with 2, 8
and 64 ranks, from one scripted run whose clock is stopped (ddptop.tui.synthetic.snapshot_app),
so each SVG is the same bytes on every run. Beside the picture, each test checks from the
rendered screen what a picture review would miss: no view scrolls sideways (a line cut at the
edge), a one-line text that does not fit ends in an ellipsis, the footer's keys all fit, and
the charts under the rank table keep their rows. The alert slot holding its height with and
without an alert is checked at each size.

    .venv/bin/python -m pytest tests/tui/test_snapshots.py --snapshot-update   # after a layout change

then look at the changed SVGs (tests/tui/__snapshots__/) before committing them; on a mismatch,
pytest-textual-snapshot writes snapshot_report.html with both pictures side by side."""

from __future__ import annotations

import asyncio
import functools
from pathlib import Path
from typing import Any

import pytest
from rich.cells import cell_len
from rich.text import Text
from textual.content import Content
from textual.scroll_view import ScrollView
from textual.widget import Widget
from textual.widgets import Static

from ddptop.model.state import RunState
from ddptop.tui.app import DdpTopApp
from ddptop.tui.synthetic import (
    SYNTHETIC_NOW,
    app_on_state,
    fill_views,
    show_tab,
    snapshot_app,
    synthetic_state,
)
from ddptop.tui.views import TABS
from ddptop.tui.widgets.rank_table import RankTable
from ddptop.tui.widgets.run_alerts import ALERT_ROWS, RunAlerts, alert_lines, fit_rows

SIZES = {"80x24": (80, 24), "120x40": (120, 40), "200x60": (200, 60)}
RANKS = (2, 8, 64)


def screen_lines(app: DdpTopApp) -> list[str]:
    return [strip.text for strip in app.screen._compositor.render_strips()]


def visible(widget: Widget) -> bool:
    region = widget.region
    return widget.display and region.width > 0 and region.height > 0 and widget.screen is widget.app.screen \
        and all(node.display for node in widget.ancestors_with_self if isinstance(node, Widget))


def layout_faults(app: DdpTopApp) -> list[str]:
    """What the screen shows cut: each fault names the widget and the text."""
    lines = screen_lines(app)
    faults = []
    footer = lines[-1].rstrip()
    if "▏" in footer or not footer.endswith("? Help"):
        faults.append(f"footer cut: {footer!r}")
    for view in app.screen.query(ScrollView):  # LinesView, RichLog, DataTable
        if visible(view) and (view.show_horizontal_scrollbar
                              or view.virtual_size.width > view.scrollable_content_region.width):
            faults.append(f"{view!r} scrolls sideways: {view.virtual_size.width} cells in "
                          f"{view.scrollable_content_region.width}")
    for static in app.screen.query(Static):
        if visible(static) and static.styles.text_wrap == "nowrap":
            faults += _cut_lines(static, lines)
    for box in app.screen.query(Widget):  # a border title or subtitle (the legend) that is cut
        if visible(box) and box.styles.border_top[0]:
            for markup in (box.border_title, box.border_subtitle):
                title = Content.from_markup(markup or "").plain
                if cell_len(title) > box.outer_size.width - 4:
                    faults.append(f"{box!r} title cut: {title!r}")
    return faults


def _cut_lines(static: Static, lines: list[str]) -> list[str]:
    """Lines of a one-line-per-row text wider than the widget that do not end in `…`."""
    region = static.content_region
    faults = []
    for i, line in enumerate(str(static.render()).splitlines()[:region.height]):
        shown = lines[region.y + i][region.x:region.x + region.width].rstrip()
        if cell_len(line) > region.width and not shown.endswith("…"):
            faults.append(f"{static!r} cut without an ellipsis: {shown!r}")
    return faults


def chart_faults(app: DdpTopApp) -> list[str]:
    """The ranks tab: the throughput charts keep their rows below the rank table (at 80x24
    they had been pushed off the screen), and the whole-run line fits its two rows."""
    table = app.query_one(RankTable)
    charts = app.query_one("#throughput", Widget)
    pane = app.query_one("#ranks", Widget).region
    faults = []
    if charts.region.bottom > pane.bottom or charts.region.y < table.region.bottom:
        faults.append(f"charts {charts.region} outside the tab {pane} under the table {table.region}")
    facts = app.query_one("#rate-facts", Static)
    rows = Text(str(facts.render())).wrap(app.console, facts.content_region.width)
    if len(rows) > facts.content_region.height:
        faults.append(f"whole-run line in {len(rows)} rows, {facts.content_region.height} shown")
    return faults


def _grid() -> list[Any]:
    """Every tab x size x rank count; by default a Latin square of them (tab k at size j with the
    rank count (j + k) mod 3): each tab at every size and every rank count, and every size with
    every rank count on some tab. The rest are -m slow (the suite's 10 minutes on 2 cores)."""
    out = []
    for k, tab in enumerate(TABS):
        for j, size in enumerate(SIZES):
            for i, ranks in enumerate(RANKS):
                marks = () if i == (j + k) % len(RANKS) else (pytest.mark.slow,)
                out.append(pytest.param(tab, size, ranks, marks=marks, id=f"{tab}-{size}-{ranks}r"))
    return out


@pytest.mark.parametrize(("tab", "size", "ranks"), _grid())
def test_every_tab_at_every_size_and_rank_count(snap_compare, tmp_path: Path, tab: str, size: str,
                                                ranks: int) -> None:
    app = snapshot_app(ranks, tmp_path)
    faults: list[str] = []

    async def run_before(pilot) -> None:  # noqa: ANN001
        await show_tab(app, pilot, tab)
        faults.extend(layout_faults(app))
        if tab == "ranks":
            faults.extend(chart_faults(app))

    matches = snap_compare(app, terminal_size=SIZES[size], run_before=run_before)
    assert faults == []  # first: it says what is wrong, the picture only that something is
    assert matches


@pytest.mark.parametrize("size", SIZES, ids=list(SIZES))
def test_the_alert_slot_keeps_its_rows_with_and_without_an_alert(tmp_path: Path, size: str) -> None:
    """A straggler verdict that comes and goes moves nothing (issue 21: it moved the whole
    layout by a row every few seconds)."""
    async def regions(slow_rank: int | None) -> tuple[object, ...]:
        app = snapshot_app(8, tmp_path / str(slow_rank), slow_rank=slow_rank)
        async with app.run_test(size=SIZES[size]) as pilot:
            await show_tab(app, pilot, "ranks")
            alerts = app.query_one(RunAlerts)
            shown = str(alerts.render()).strip()
            assert ("rank 1 straggler:" in shown) == (slow_rank is not None), shown
            return alerts.region.height, app.query_one("#tabs", Widget).region

    with_alert, without = asyncio.run(regions(1)), asyncio.run(regions(None))
    assert with_alert[0] == without[0] == ALERT_ROWS
    assert with_alert == without


@pytest.mark.parametrize("ranks", RANKS, ids=[f"{n}r" for n in RANKS])
def test_no_alert_is_cut_in_its_first_60_characters_at_80_columns(tmp_path: Path, ranks: int) -> None:
    """Issue 31: the actionable part of an alert comes first and survives 80 columns (the
    phase of a straggler had been cut off). Each alert line's first 60 characters, or all
    of a shorter one, are on the screen whole; a line cut later ends in `…`."""
    app = snapshot_app(ranks, tmp_path)
    state = app.workbench.current.state  # type: ignore[union-attr]
    state.notes.append("rank 0: comm hook not timed: the script registered its own before ddptop could wrap it")

    async def main() -> tuple[list[str], list[str]]:
        async with app.run_test(size=SIZES["80x24"]) as pilot:
            await show_tab(app, pilot, "ranks")
            assert app.views.last is not None
            return [t.plain for t in fit_rows(alert_lines(app.views.last))], screen_lines(app)

    alerts, lines = asyncio.run(main())
    assert alerts and "straggler: backward, costs the job " in alerts[0]
    for alert in alerts:
        shown = next(line for line in lines if alert[:20] in line).strip()
        assert alert[:60].strip() in shown, (alert, shown)
        assert shown == alert.strip() or shown.endswith("…"), shown


@pytest.mark.parametrize("size", SIZES, ids=list(SIZES))
def test_the_rank_detail_at_every_size(snap_compare, tmp_path: Path, size: str) -> None:
    """Enter on rank 1 (the straggler): its last step with four buckets, its history, memory,
    children and NCCL peers, with nothing wider than the screen."""
    app = snapshot_app(8, tmp_path)
    shown: list[str] = []

    async def run_before(pilot) -> None:  # noqa: ANN001
        await show_tab(app, pilot, "ranks")
        await pilot.press("down", "enter")
        await pilot.pause()
        app.screen.refresh_detail()  # type: ignore[attr-defined]
        await pilot.pause()
        shown.extend(screen_lines(app))

    assert snap_compare(app, terminal_size=SIZES[size], run_before=run_before)
    text = "\n".join(shown)
    assert "rank 1" in text and "in 4 buckets" in text
    if size != "80x24":  # at 80x24 the rest is a scroll away
        assert "allocated 3008 MiB" in text and "children  2 (DataLoader workers" in text
    assert not [line for line in shown if len(line.rstrip()) > SIZES[size][0]]


# --- a thousand ranks on a hundred nodes (issue 30) --------------------------------------------

BIG_RANKS, BIG_NODES = 1024, 128


@functools.cache
def big_state() -> RunState:
    """1,024 ranks on 128 nodes, rank 1 (node 0) the straggler named; 80 steps a rank, enough
    for the verdict's checks (made once: the apps only read it)."""
    state = fill_views(synthetic_state(BIG_RANKS, steps=80, now=SYNTHETIC_NOW, nodes=BIG_NODES), SYNTHETIC_NOW)
    assert state.straggler() is not None and state.straggler().rank == 1  # type: ignore[union-attr]
    return state


@pytest.mark.parametrize("size", (pytest.param("80x24", marks=pytest.mark.slow), "200x60"))  # 40 s each, loaded
def test_the_node_view_of_1024_ranks_on_128_nodes(snap_compare, tmp_path: Path, size: str) -> None:
    """One row per node, the straggler's node marked with its rank; nothing cut."""
    app = app_on_state(big_state(), tmp_path)
    faults: list[str] = []
    rows: list[str] = []

    async def run_before(pilot) -> None:  # noqa: ANN001
        await show_tab(app, pilot, "ranks")
        faults.extend(layout_faults(app) + chart_faults(app))
        rows.extend(app.query_one(RankTable).row_texts())

    matches = snap_compare(app, terminal_size=SIZES[size], run_before=run_before)
    assert faults == []
    assert len(rows) == BIG_NODES and "▲ rank 1" in rows[0] and "▲" not in "".join(rows[1:])
    assert matches


def test_a_node_opened_into_its_ranks(snap_compare, tmp_path: Path) -> None:
    """Enter on node 0 shows its eight rank rows under it, the straggler's among them; the
    cursor stays on the node's row."""
    app = app_on_state(big_state(), tmp_path)
    rows: list[str] = []

    async def run_before(pilot) -> None:  # noqa: ANN001
        await show_tab(app, pilot, "ranks")
        await pilot.press("enter")
        await show_tab(app, pilot, "ranks")
        table = app.query_one(RankTable)
        assert table.body.cursor == 0 and table.opened == {0}
        rows.extend(table.row_texts())

    assert snap_compare(app, terminal_size=SIZES["80x24"], run_before=run_before)
    assert len(rows) == BIG_NODES + 1 + 8 and rows[0].startswith("▾ ▲0") and rows[3].startswith("▲1")
