"""Issue 46 point 3: the exit summary shows each rank as the TUI's final screen does (own ms,
the exposed wait apart from backward, phases, the straggler flag), never the wait folded into
`bwd` (a delayed-rank run read rank 0 `bwd 84.1` against rank 1's `31.5`: backward-bound,
while the TUI showed rank 0 waiting for rank 1). And the table fits the terminal's width."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

from test_tui_views import app_for, screen_text, show

from ddptop.model import report
from ddptop.model.snapshot import snapshot
from ddptop.tui.synthetic import synthetic_state


def exit_rows(text: str) -> dict[int, dict[str, str]]:
    lines = text.splitlines()
    i = next(k for k, x in enumerate(lines) if x.startswith("rank "))
    head = lines[i].split()
    head = [h for h in head if h != "ms"]  # "p50 ms" -> "p50"
    rows = {}
    for line in lines[i + 2:]:
        if not re.match(r"\s*\d+\s", line):
            break
        cells = line.split()
        rows[int(cells[0])] = dict(zip(head, cells))
    return rows


def test_exit_summary_shows_the_final_screens_figures_per_rank(tmp_path: Path) -> None:
    state = synthetic_state(2, slow_rank=1, backend="gloo")  # rank 0 waits for rank 1 in the all-reduce
    state.status = "completed"
    summary = state.summary()
    text = report.final_report(summary, "/runs/x", width=120)
    rows = exit_rows(text)
    snap = snapshot(state, state.started_at + 60)
    for r, f in snap.ranks.items():
        row = rows[r]
        assert row["own"] == f"{f.own_ms:.1f}" and row["p50"] == f"{f.p50:.1f}"
        for name, key in (("data", "data"), ("fwd", "forward"), ("bwd", "backward"), ("exposed", "comm"),
                          ("opt", "optimizer")):
            assert row[name] == f"{f.phases[key]:.1f}", (r, name, row, f.phases)
    # the waiting rank reads as waiting, not as backward-bound
    assert float(rows[0]["exposed"]) > 15 and float(rows[0]["bwd"]) < float(rows[1]["bwd"])
    named = summary["straggler"]["rank"] if summary.get("straggler") else None
    if named is not None:
        assert rows[named]["status"] == "straggler"

    async def screen() -> str:
        app = app_for(state, tmp_path)
        async with app.run_test(size=(160, 40)) as pilot:
            await show(app, pilot)
            await pilot.pause()
            return screen_text(app)

    shown = asyncio.run(screen())
    for r, row in rows.items():  # the TUI's rank rows: the same p50 and own ms
        line = next(x for x in shown.splitlines() if re.match(rf"[│┃]\s*▲?{r}\s+node", x))
        assert row["p50"] in line and row["own"] in line, (line, row)


def test_the_exit_table_and_the_presets_and_ls_tables_follow_the_width() -> None:
    state = synthetic_state(4, slow_rank=1, backend="gloo")
    state.status = "completed"
    summary = state.summary()
    for width in (70, 80, 200):
        table = report.ranks_table(summary, width)
        assert max(map(len, table.splitlines())) <= width, (width, table)
        presets = report.presets_table(width)
        assert max(map(len, presets.splitlines())) <= max(width, 70), (width, presets)
    wide = report.ranks_table(summary, 200)
    assert "host" in wide and "p95 ms" in wide  # nothing dropped where it fits
    def words(text: str) -> set[str]:
        return {w for w in text.split() if w.strip("-")}

    assert words(report.presets_table(200)) == words(report.presets_table(60))  # wrapped at words, none cut


def test_on_a_terminal_the_exit_summarys_advice_wraps_at_words() -> None:
    """An advice line of ~400 characters broke mid-word at 200 columns (the terminal wrapped it)."""
    state = synthetic_state(2, slow_rank=1, backend="gloo")
    state.status = "completed"
    summary = state.summary()
    summary["advice"] = {"reason": "all-reduce is 29% of the step: " + "compress gradients and overlap " * 14,
                         "label": "expected, not measured yet"}
    flat_advice = "advice (expected, not measured yet): " + summary["advice"]["reason"]
    for width in (80, 200):
        text = report.final_report(summary, "/runs/x", width=width, wrap=True)
        lines = text.splitlines()
        assert max(map(len, lines)) <= width
        start = next(i for i, x in enumerate(lines) if x.startswith("advice"))
        joined = " ".join(x.strip() for x in lines[start:start + 12] if not x.startswith("records"))
        assert " ".join(flat_advice.split()) in " ".join(joined.split())  # every word whole
    piped = report.final_report(summary, "/runs/x", width=80, wrap=False)
    assert flat_advice.rstrip() in piped  # piped: one line a finding, for grep
