"""The rank table's node view (issue 30, "a thousand ranks on a hundred nodes"): a run of
more than 64 ranks on several nodes shows one row per node; its figures are the figure
functions' over that node's ranks, the straggler's node carries the mark with the rank,
Enter and `n` open and close a node with the cursor kept in place, `N` switches to every
rank and back, and a node whose ranks all stalled or were lost says so."""

from __future__ import annotations

import asyncio
import statistics
from pathlib import Path

from test_snapshots import big_state

from ddptop.model import figures
from ddptop.model.state import RunState
from ddptop.tui.app import DdpTopApp
from ddptop.tui.synthetic import SYNTHETIC_NOW, app_on_state, show_tab, synthetic_state
from ddptop.tui.widgets.node_rows import NODE_COLUMNS, NODE_VIEW_ABOVE
from ddptop.tui.widgets.rank_table import RankTable


def screen(app: DdpTopApp) -> list[str]:
    return [strip.text for strip in app.screen._compositor.render_strips()]


def node_cells(row: str, shown: list[str]) -> dict[str, str]:
    """A node row cut into its columns (`shown`: the keys on screen), by their widths."""
    cells, x = {}, 0
    for key, _, width, *_ in NODE_COLUMNS:
        if key in shown:
            cells[key] = row[x:x + width].strip()
            x += width + 2
    return cells


def test_node_rows_are_the_figure_functions_over_their_ranks_and_mark_the_straggler(tmp_path: Path) -> None:
    state = big_state()
    app = app_on_state(state, tmp_path)

    async def main() -> tuple[list[str], list[str]]:
        async with app.run_test(size=(200, 60)) as pilot:
            await show_tab(app, pilot, "ranks")
            table = app.query_one(RankTable)
            return table.row_texts(), list(table._node_cols)

    rows, shown = asyncio.run(main())
    assert shown == [k for k, *_ in NODE_COLUMNS]  # 200 columns: every one
    members: dict[int, list[int]] = {}
    for r, rs in state.ranks.items():
        assert rs.hello is not None
        members.setdefault(rs.hello.node, []).append(r)
    straggler = state.straggler()
    assert straggler is not None and straggler.rank == 1
    assert len(rows) == len(members) == 128
    for row in rows:
        cells = node_cells(row, shown)
        node = int(cells["node"].lstrip("▸▾ ▲"))
        ranks = members[node]
        figs = [figures.rank_figures(state.ranks[r]) for r in ranks]  # from scratch, not the state's cache
        p50, own = figures.node_step_ms_p50_last50(figs), figures.node_own_ms_last50(figs)
        assert p50 == statistics.median(f.p50 for f in figs if f.p50 is not None)
        assert own == max(f.own_ms for f in figs if f.own_ms is not None)
        steps = sorted({state.ranks[r].last_step + 1 for r in ranks})
        assert cells["p50"] == f"{p50:.1f}" and cells["own"] == f"{own:.1f}", (node, cells)
        assert cells["steps"] == (str(steps[0]) if len(steps) == 1 else f"{steps[0]}-{steps[-1]}")
        assert cells["host"] == f"node{node}" and cells["ranks"] == "8" and cells["state"] == "8 live"
        holds = straggler.rank in ranks
        assert (cells["straggler"] == f"▲ rank {straggler.rank}") == holds, (node, cells)
        assert ("▲" in cells["node"]) == holds and (cells["straggler"] == "") != holds


def small_state(**kw: object) -> RunState:
    """72 ranks on 9 nodes: just past NODE_VIEW_ABOVE, quick to make."""
    assert 72 > NODE_VIEW_ABOVE
    return synthetic_state(72, steps=60, now=SYNTHETIC_NOW, nodes=9, **kw)  # type: ignore[arg-type]


def test_enter_n_and_shift_n_open_and_close_nodes_keeping_the_cursor(tmp_path: Path) -> None:
    app = app_on_state(small_state(), tmp_path)

    async def main() -> None:
        async with app.run_test(size=(120, 40)) as pilot:
            await show_tab(app, pilot, "ranks")
            table = app.query_one(RankTable)
            assert len(table.row_texts()) == 9 and "n Open/close node" in screen(app)[-1]
            await pilot.press("down", "down", "enter")  # node 2 opens under its row
            await pilot.pause()
            rows = table.row_texts()
            assert table.body.cursor == 2 and rows[2].startswith("▾") and len(rows) == 9 + 1 + 8
            assert rows[3].split()[:2] == ["rank", "host/device"]  # the rank columns' titles
            assert [int(r.split()[0].lstrip("▲")) for r in rows[4:12]] == list(range(16, 24))
            await pilot.press("down", "down", "down")
            assert table.cursor_rank == 17
            await pilot.press("n")  # from one of its ranks: the node closes, the cursor on its row
            await pilot.pause()
            assert len(table.row_texts()) == 9 and table.body.cursor == 2 and table.cursor_rank == 16
            # the step timeline under the table says what Enter does on a node's row
            app.refresh_views()
            await pilot.pause()
            assert table.cursor_on_node and any("(⏎ opens the node)" in line for line in screen(app)), screen(app)
            await pilot.press("N")  # every rank, grouped: the cursor on node 2's header line
            await pilot.pause()
            rows = table.row_texts()
            assert len(rows) == 72 + 9 and rows[table.body.cursor].startswith("node 2 · node2")
            assert "n Open/close node" not in screen(app)[-1]  # nothing to open or close here
            await pilot.press("N")
            await pilot.pause()
            assert len(table.row_texts()) == 9 and table.body.cursor == 2
            table.sort_by("own")  # the node doing the most own work first: the straggler's
            assert table.row_texts()[0].startswith("▸ ▲0")

    asyncio.run(main())


def test_a_node_whose_ranks_stalled_or_were_lost_says_so(tmp_path: Path) -> None:
    state = small_state()
    for r in range(24, 32):  # node 3: every connection dropped
        state.rank_disconnected(r, SYNTHETIC_NOW)
    for r in range(40, 48):  # node 5: silent past the stall bound
        state.ranks[r].last_seen = SYNTHETIC_NOW - 100
    state.ranks[50].status, state.ranks[51].status = "failed", "done"  # node 6: one of each
    for r in range(56, 64):  # node 7: half lost, half stalled
        if r < 60:
            state.rank_disconnected(r, SYNTHETIC_NOW)
        else:
            state.ranks[r].last_seen = SYNTHETIC_NOW - 100
    app = app_on_state(state, tmp_path)

    async def main() -> list[str]:
        async with app.run_test(size=(120, 40)) as pilot:
            await show_tab(app, pilot, "ranks")
            snap = app.views.last
            assert snap is not None
            assert [nf.node for nf in snap.nodes if nf.down] == [3, 5, 7]
            return app.query_one(RankTable).row_texts()

    rows = asyncio.run(main())
    state_of = {int(r[:7].lstrip("▸▾ ▲")): r.rstrip().split("  ")[-1].strip() for r in rows}
    assert state_of[3] == "all 8 lost" and state_of[5] == "all 8 stalled"
    assert state_of[6] == "6 live 1 failed 1 done" and state_of[7] == "down: 4 stalled 4 lost"
    assert state_of[0] == "8 live"
