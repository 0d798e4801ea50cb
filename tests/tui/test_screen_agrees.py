"""Issue 46 point 5 and 9: a screen agrees with itself over time. A paused screen changes in
nothing (the header's step counted on: 261 -> 283); after `R` the old run's chart goes; after
`x` the header says `stopping` at once (it said `running` for 6 s); the waiting line ends
when every rank is connected (then it waits for the first step)."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

from test_tui_one_screen import NOW, app_on, rec, screen, scripted_state
from test_web import LiveSession
from textual.widgets import Sparkline

from ddptop.model import report
from ddptop.model.config import RunConfig
from ddptop.model.state import RunState
from ddptop.wire.protocol import Hello, Steps


def test_a_paused_screen_changes_in_nothing_while_the_run_goes_on(tmp_path: Path) -> None:
    state = scripted_state()

    async def main() -> tuple[str, str]:
        app = app_on(state, tmp_path)
        async with app.run_test(size=(120, 40)) as pilot:
            app.refresh_views()
            await pilot.press("space")
            app.refresh_views()
            await pilot.pause()
            before = screen(app)
            for r in (0, 1):  # the run goes on: 22 more steps, one more rank status
                state.apply(Steps(r, [rec(i, r) for i in range(120, 142)]), NOW)
            state.dropped[0] = 3
            app.refresh_views()
            await pilot.pause()
            return before, screen(app)

    before, after = asyncio.run(main())
    assert "[paused]" in before and "step 120/1000" in before
    assert after == before


def test_after_x_the_header_says_stopping_at_once(tmp_path: Path) -> None:
    async def main() -> str:
        app = app_on(scripted_state(), tmp_path)
        async with app.run_test(size=(120, 40)) as pilot:
            app.refresh_views()
            await pilot.press("x")
            await pilot.pause()
            await pilot.press("y")
            await pilot.pause()
            return screen(app).splitlines()[0]

    head = asyncio.run(main())
    assert "● stopping" in head and "running" not in head


def test_after_a_restart_the_old_runs_chart_is_gone_until_the_new_one_steps(tmp_path: Path) -> None:
    async def main() -> tuple[list, list, str]:
        app = app_on(scripted_state(), tmp_path)
        async with app.run_test(size=(120, 40)) as pilot:
            old = scripted_state()
            for i in range(60):
                old.history.append((i * 0.5, 10.0 + i % 3))
            app.workbench.sessions[-1] = LiveSession(old, old.config, tmp_path / "a")
            app.refresh_views()
            await pilot.pause()
            spark = app.query_one("#rate-spark", Sparkline)
            shown = list(spark.data or [])
            fresh = RunState(run_id="20260101-120100-baseline", config=old.config, world_size=2, warmup=0,
                             started_at=NOW)
            app.workbench.sessions.append(LiveSession(fresh, fresh.config, tmp_path / "b"))
            app.refresh_views()
            await pilot.pause()
            return shown, list(spark.data or []), app.query_one("#rate-box").border_title

    shown, after, title = asyncio.run(main())
    assert shown and not after and title == "steps/s: waiting for steps"


def test_the_waiting_line_ends_when_every_rank_is_connected() -> None:
    state = RunState(run_id="r", config=RunConfig(steps=10), world_size=2, warmup=0, started_at=NOW)
    for r in (0, 1):
        state.apply(Hello(rank=r, local_rank=r, world_size=2, host="h", pid=1 + r, token="", device="cpu",
                          backend="gloo", model="tiny"), NOW)
    line = report.status_line(state, NOW)
    assert "waiting for the first step" in line and "2/2 connected" not in line
    from ddptop.model.snapshot import snapshot
    from ddptop.tui.widgets.run_header import rate_pieces

    header = " ".join(p.plain for p in rate_pieces(snapshot(state, NOW)))
    assert "all 2 ranks connected: waiting for the first step" in header


def test_at_200x60_with_2_ranks_no_empty_timeline_rows_and_two_different_steps(tmp_path: Path) -> None:
    """The lanes box had ~22 empty rows; the cursor's panel and the fastest rank's showed one step twice."""
    from ddptop.tui.synthetic import show_tab, snapshot_app
    from ddptop.tui.widgets.rank_lanes import RankLanes
    from ddptop.tui.widgets.step_timeline import StepTimelineView

    async def main() -> tuple[int, str, str]:
        app = snapshot_app(2, tmp_path)
        async with app.run_test(size=(200, 60)) as pilot:
            await show_tab(app, pilot, "ranks")
            lanes = app.query_one(RankLanes)
            left = app.query_one("#overview-timeline", StepTimelineView).border_title
            right = app.query_one("#fastest-timeline", StepTimelineView).border_title
            return lanes.region.height, str(left), str(right)

    height, left, right = asyncio.run(main())
    assert height <= 2 + 2, height  # its two rows and its border
    assert left.split(":")[0] != right.split(":")[0], (left, right)


def test_the_gpu_tab_on_a_cpu_run_is_not_a_few_lines_then_blank(tmp_path: Path) -> None:
    """On CPU the GPU tab was 4 lines, then 50 blank ones: now each rank's CPU history and,
    right under the table, what the tab shows and where GPU figures come from."""
    from ddptop.tui.synthetic import SYNTHETIC_NOW, app_on_state, show_tab, synthetic_state

    state = synthetic_state(2, backend="gloo", now=SYNTHETIC_NOW)
    state.gpu_unavailable = "NVML not available: no NVIDIA driver"
    for i in range(20):
        sample = {rs.hello.pid: (50.0 + 2 * i, 500 << 20) for rs in state.ranks.values()}
        state.proc_history.append(sample)
        state.proc_stats = sample

    async def main() -> list[str]:
        app = app_on_state(state, tmp_path, SYNTHETIC_NOW)
        async with app.run_test(size=(200, 60)) as pilot:
            await show_tab(app, pilot, "gpu")
            return [s.text.rstrip() for s in app.screen._compositor.render_strips()]

    lines = asyncio.run(main())
    head = next(i for i, x in enumerate(lines) if "CPU % history" in x)
    rows = lines[head + 1:head + 3]
    assert all("▁" in r or "█" in r for r in rows), rows  # each rank's CPU over time
    assert "on a machine with NVML this tab shows each GPU" in " ".join(lines[head + 3:head + 6])


def _cpu_run_state() -> RunState:
    """Two gloo ranks on a machine without NVML, 20 psutil samples of each."""
    from ddptop.tui.synthetic import SYNTHETIC_NOW, synthetic_state

    state = synthetic_state(2, backend="gloo", now=SYNTHETIC_NOW)
    state.gpu_unavailable = "NVML not available: no NVIDIA driver"
    for i in range(20):
        sample = {rs.hello.pid: (50.0 + 2 * i, (500 + 10 * i) << 20) for rs in state.ranks.values()}
        state.proc_history.append(sample)
        state.proc_stats = sample
    return state


def blank_rows(lines: list[str], top: int, bottom: int) -> list[int]:
    """Rows of the tab (screen rows top..bottom-1) with nothing in them, or with a box whose
    inside is blank on that row (a chart box with its rows left empty)."""
    blank = []
    for y in range(top, bottom):
        inside = [part for part in lines[y].split("│") if len(part) > 10]
        if not lines[y].strip() or any(not part.strip() for part in inside):
            blank.append(y)
    return blank


def _tab_screen(tmp_path: Path, tab: str, size: tuple[int, int], n_ranks: int = 2,
                cpu: bool = False) -> tuple[list[str], int, int]:
    from textual.widget import Widget

    from ddptop.tui.synthetic import SYNTHETIC_NOW, app_on_state, show_tab, snapshot_app

    async def main() -> tuple[list[str], int, int]:
        app = app_on_state(_cpu_run_state(), tmp_path, SYNTHETIC_NOW) if cpu else snapshot_app(n_ranks, tmp_path)
        async with app.run_test(size=size) as pilot:
            await show_tab(app, pilot, tab)
            pane = app.query_one(f"#{tab}", Widget).region
            return [s.text.rstrip() for s in app.screen._compositor.render_strips()], pane.y, pane.bottom

    return asyncio.run(main())


def test_at_200x60_the_gpu_and_ranks_tabs_have_no_blank_areas(tmp_path: Path) -> None:
    """Issue 46 point 8: the GPU tab was its table then ~45 blank rows (on a GPU run and on a CPU
    one), the ranks tab's steps/s box 8 blank rows under its chart and the step-times box ~12 beside
    it. Now the GPU tab charts each GPU's utilization, memory and power (or each rank's CPU % and
    RSS) over time in the rows the table leaves, and the ranks tab's charts take their boxes' rows."""
    faults, texts = {}, {}
    for name, tab, cpu in (("gpu", "gpu", False), ("cpu", "gpu", True), ("ranks", "ranks", False)):
        lines, top, bottom = _tab_screen(tmp_path / name, tab, (200, 60), cpu=cpu)
        blank = blank_rows(lines, top, bottom)
        if len(blank) > 3:  # the blank line between table and charts, the charts' top padding
            faults[name] = blank
        texts[name] = "\n".join(lines)
    assert faults == {}
    gpu, cpu = texts["gpu"], texts["cpu"]
    assert "gpu 0 util 97 %" in gpu and "scale 0-100 %" in gpu and "gpu 1 power 612 W" in gpu, gpu
    assert re.search(r"history: the last 2:5\d \(17\d samples, newest on the right; at most 300 kept\)", gpu), gpu
    assert "rank 0 CPU 88 %" in cpu and "rank 1 RSS 690.0 MiB" in cpu, cpu
    assert "on a machine with NVML this tab shows each GPU" in cpu, cpu


def test_at_80x24_the_gpu_history_leaves_the_table_whole(tmp_path: Path) -> None:
    """The history takes only the rows the table leaves: 8 GPUs at 80x24 keep all their rows and
    the history is one line saying what a taller terminal shows; 2 GPUs leave room for charts."""
    lines, top, bottom = _tab_screen(tmp_path / "8", "gpu", (80, 24), n_ranks=8)
    tab = lines[top:bottom]
    assert [row.split()[0] for row in tab if row.split()[1:3] == ["97", "%"]] == [str(g) for g in range(8)]
    assert "history: a taller terminal charts each GPU's util, memory, power over time" in "\n".join(tab)
    lines, top, bottom = _tab_screen(tmp_path / "2", "gpu", (80, 24), n_ranks=2)
    assert "gpu 1 power 612 W (0-700 W)" in "\n".join(lines[top:bottom])
