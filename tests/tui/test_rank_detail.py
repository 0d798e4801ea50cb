"""A rank you can open (issue 21): Enter on a rank row asks for its detail; the detail screen
shows the step timeline, history, memory (with a creep alert) and processes."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from test_tui_usability import synthetic_app
from textual.widgets import Static
from waiting import poll

from ddptop.model import memory
from ddptop.model.snapshot import snapshot
from ddptop.tui.screens.rank_detail import RankDetailScreen, detail_lines
from ddptop.tui.synthetic import synthetic_state
from ddptop.tui.widgets.rank_table import RankTable
from ddptop.tui.widgets.step_timeline import StepTimelineView


def rising(n: int, start: float, per_step: float, key: str = "mem_allocated_mb") -> list[dict[str, float]]:
    return [{"step": i, key: start + per_step * i} for i in range(n)]


def test_creep_is_memory_that_keeps_rising_not_a_steady_sawtooth():
    found = memory.creep(rising(40, 1000.0, 10.0))
    assert found is not None and found.field == "mem_allocated_mb" and found.rise_mb == 390.0
    assert "allocated GPU memory keeps rising: +390 MiB (39%) over the last 39 steps" == found.describe()
    sawtooth = [{"step": i, "mem_allocated_mb": 1000.0 + (i % 5) * 100} for i in range(40)]
    assert memory.creep(sawtooth) is None
    assert memory.creep(rising(10, 1000.0, 50.0)) is None  # too few samples to say
    assert memory.creep(rising(40, 1000.0, 0.5)) is None  # +20 MiB: allocator noise
    assert memory.creep(rising(40, 500.0, 5.0, "rss_mb")).field == "rss_mb"


def test_the_detail_names_memory_processes_and_the_creep(tmp_path: Path) -> None:
    state = synthetic_state(2)
    for i, rec in enumerate(state.ranks[1].recent):
        rec.update(mem_allocated_mb=2000.0 + 20 * i, mem_reserved_mb=4096.0, mem_peak_mb=2500.0 + 20 * i,
                   rss_mb=3000.0)
    state.proc_stats[state.ranks[1].hello.pid] = (97.0, 3 << 30)
    state.add_log(1, "rank 1 says hello")
    text = "\n".join(t.plain for t in detail_lines(snapshot(state, time.time()), 1, 120))
    assert "allocated 7100 MiB" in text and "reserved 4096 MiB" in text and "peak 7600 MiB" in text
    assert f"pid {state.ranks[1].hello.pid}" in text and "CPU 97%" in text and "resident 3000 MiB" in text
    assert "allocated GPU memory keeps rising" in text
    assert "rank 1 says hello" in text
    for width in (80, 120, 200):  # nothing wraps: the bars make room for their legends
        wide = [t.plain for t in detail_lines(snapshot(state, time.time()), 1, width) if t.cell_len > width]
        assert not wide, wide
    other = "\n".join(t.plain for t in detail_lines(snapshot(state, time.time()), 0, 120))
    assert "keeps rising" not in other and "no CUDA allocator figures" in other


def test_enter_on_a_rank_opens_its_detail_with_timeline_memory_and_processes(tmp_path: Path) -> None:
    async def main() -> None:
        app, state = synthetic_app(tmp_path, 4, slow_rank=2)
        async with app.run_test(size=(120, 40)) as pilot:
            app.refresh_views()
            await pilot.pause()
            await pilot.press("down", "down", "enter")
            await pilot.pause()
            assert isinstance(app.screen, RankDetailScreen) and app.screen.rank == 2
            body = str(app.screen.query_one("#detail-body", Static).render())
            title = str(app.screen.query_one("#detail-title", Static).render())
            assert title.startswith("Rank detail: ▲ rank 2") and "straggler" in title  # issue 31: titled
            assert "memory" in body and "process" in body and "steps (last 50)" in body
            timeline = str(app.screen.query_one(StepTimelineView).render())
            assert "all-reduce" in timeline and "ms" in timeline
            await pilot.press("right_square_bracket")
            assert app.screen.rank == 3
            await pilot.press("escape")
            await pilot.pause()
            assert app.screen is app.screen_stack[0]
            assert isinstance(app.query_one(RankTable), RankTable)

    asyncio.run(main())


def test_a_real_run_reports_each_ranks_memory_and_bucket_spans(tmp_path: Path) -> None:
    """The rank side samples its resident set (and, on a GPU, the CUDA allocator) every
    MEMORY_EVERY steps, and sends its buckets' all-reduce spans (for the step timeline) at
    most twice a second: a user's script, unchanged, on 2 gloo ranks."""
    import json
    import subprocess

    from test_user_scripts import ddptop, summary_of

    from ddptop.rank.memory import MEMORY_EVERY, MEMORY_MIN_S

    runs = tmp_path / "runs"
    out = subprocess.run(ddptop(["--steps", "25", "--set", "gloo_timing=true"], runs, "plain_ddp.py", []), capture_output=True,
                         text=True, timeout=240)
    assert out.returncode == 0, out.stderr[-2000:]
    summary = summary_of(out.stdout)
    lines = (runs / summary["run_id"] / "steps.jsonl").read_text().splitlines()
    records = [json.loads(line) for line in lines]
    sampled = {(r["rank"], r["step"]): r["rss_mb"] for r in records if "rss_mb" in r}
    assert {(0, 0), (1, 0)} <= set(sampled)  # the first step is sampled on every rank
    for rank in (0, 1):  # then MEMORY_EVERY steps apart or more (timed steps need not fall on multiples)
        steps = sorted(step for r, step in sampled if r == rank)
        assert all(b - a >= MEMORY_EVERY for a, b in zip(steps, steps[1:])), steps
    for rank in (0, 1):  # and at most once in MEMORY_MIN_S
        t = sorted(r["t"] for r in records if "rss_mb" in r and r["rank"] == rank)
        assert all(b - a >= MEMORY_MIN_S - 0.05 for a, b in zip(t, t[1:])), t
    assert all(50 < mb < 20_000 for mb in sampled.values()), sampled
    assert not any("mem_allocated_mb" in r for r in records)  # no CUDA allocator on a CPU run
    with_spans = [r for r in records if "comm_spans" in r]
    assert {r["rank"] for r in with_spans} == {0, 1}, "each rank sends its buckets' spans"
    for r in with_spans:
        spans = r["comm_spans"]
        assert len(spans) == r["buckets"] and all(0 <= a <= b <= r["step_ms"] for a, b in spans), r
        assert max(b for _, b in spans) - min(a for a, _ in spans) >= r["comm_ms"] - 1e-3, r
    t = {rank: sorted(x["t"] for x in with_spans if x["rank"] == rank) for rank in (0, 1)}
    assert all(b - a > 0.45 for ts in t.values() for a, b in zip(ts, ts[1:])), "at most twice a second"


def test_space_freezes_the_display_and_plus_minus_change_the_refresh(tmp_path: Path) -> None:
    async def main() -> None:
        app, state = synthetic_app(tmp_path, 2)
        app.refresh_s = 1.0
        async with app.run_test(size=(120, 40)) as pilot:
            app.refresh_views()
            await pilot.pause()
            await pilot.press("space")
            assert app.views.paused
            shown = app.views.last  # taken once paused: a timer's refresh may land before the key
            state.ranks[0].last_step += 100  # the run goes on...
            app.refresh_views()
            assert app.views.last is shown  # ...the views keep what they showed
            await pilot.press("space")
            assert not app.views.paused and app.views.last is not shown
            await pilot.press("plus")
            assert app.refresh_s == 0.5
            await pilot.press("minus", "minus")
            assert app.refresh_s == 2.0

    asyncio.run(main())


def test_a_double_click_on_a_rank_row_opens_it(tmp_path: Path) -> None:
    async def main() -> None:
        app, state = synthetic_app(tmp_path, 4)
        async with app.run_test(size=(120, 40)) as pilot:
            app.refresh_views()
            await pilot.pause()
            rows = app.query_one("#rank-rows")
            await pilot.click(rows, offset=(2, 3))
            await pilot.pause()
            assert rows.cursor == 3
            await pilot.click(rows, offset=(2, 1), times=2)
            await pilot.pause()
            assert isinstance(app.screen, RankDetailScreen) and app.screen.rank == 1

    asyncio.run(main())


def test_a_gpu_memory_sample_reads_the_allocators_counters_once():
    from types import SimpleNamespace

    from ddptop.rank.memory import memory_sample

    calls = []

    def memory_stats(device: int) -> dict[str, int]:
        calls.append(device)
        return {"allocated_bytes.all.current": 3 << 30, "reserved_bytes.all.current": 7 << 30,
                "allocated_bytes.all.peak": 6 << 30}

    torch = SimpleNamespace(cuda=SimpleNamespace(current_device=lambda: 2, memory_stats=memory_stats))
    out = memory_sample(torch, cuda=True)
    assert calls == [2]
    assert (out["mem_allocated_mb"], out["mem_reserved_mb"], out["mem_peak_mb"]) == (3072.0, 7168.0, 6144.0)
    assert "mem_allocated_mb" not in memory_sample(torch, cuda=False)


def test_the_ranks_tab_draws_the_cursor_rows_last_step_when_the_terminal_is_tall(tmp_path: Path) -> None:
    async def main() -> None:
        app, state = synthetic_app(tmp_path, 4, slow_rank=2)
        state.ranks[1].add_spans({state.ranks[1].recent[-1]["step"]: ((40.0, 52.0), (45.0, 66.0))})
        async with app.run_test(size=(120, 40)) as pilot:
            app.refresh_views()
            await pilot.pause()
            view = app.query_one("#overview-timeline", StepTimelineView)
            assert view.display and view.border_title.startswith("rank 0: the cursor's row")
            assert "all-reduce" in str(view.render())
            await pilot.press("down")
            app.refresh_views()
            await pilot.pause()
            assert view.border_title.startswith("rank 1: the cursor's row")
            assert "in 2 buckets" in str(view.render()) and "buckets" in str(view.render()).splitlines()[2]
            table = app.query_one(RankTable)
            assert table.region.bottom <= app.query_one("#throughput").region.y  # nothing overlaps
            assert app.query_one("#throughput").region.bottom <= view.region.y
        small, _ = synthetic_app(tmp_path / "small", 4)
        async with small.run_test(size=(80, 24)) as pilot:  # no room: the charts keep theirs
            small.refresh_views()
            await pilot.pause()
            assert not small.query_one("#timelines").display and not small.query_one("#rank-lanes").display

    asyncio.run(main())


def test_a_ranks_children_are_sampled_and_listed_in_its_detail() -> None:
    """DataLoader workers and the script's subprocesses are the rank process's children:
    psutil finds them (grandchildren too) every second, and the detail lists them."""
    import os
    import subprocess
    import sys

    from ddptop.hw.hardware import HardwareSampler
    from ddptop.hw.processes import ProcessStats

    child = subprocess.Popen([sys.executable, "-c",
                              "import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', "
                              "'import time; time.sleep(60)']); time.sleep(60)"])
    try:
        import psutil

        grand: list[int] = []
        tracker = ProcessStats()
        stats: dict = {}

        def both_seen() -> bool:  # this test's child and its own child (a test worker may have others)
            nonlocal grand, stats
            stats = tracker.stats([os.getpid()], children=True)
            try:
                grand = [c.pid for c in psutil.Process(child.pid).children()]
            except psutil.Error:
                grand = []
            return bool(grand) and {child.pid, grand[0]} <= set(tracker.children.get(os.getpid(), []))

        poll(both_seen, 10, every=0.1)
        kids = tracker.children[os.getpid()]
        assert child.pid in kids and grand and grand[0] in kids, (kids, grand)
        assert all(k in stats and stats[k][1] > 0 for k in (child.pid, grand[0]))
        gpu, procs, family = HardwareSampler().sample([os.getpid()])
        assert child.pid in family[os.getpid()] and child.pid in procs
    finally:
        for pid in [child.pid, *grand]:  # ours only: a test worker's other children are not this test's
            try:
                os.kill(pid, 9)
            except OSError:
                pass
        child.wait()
    state = synthetic_state(2)
    pid = state.ranks[0].hello.pid
    state.proc_stats.update({pid: (95.0, 2 << 30), 31001: (40.0, 300 << 20), 31002: (38.0, 310 << 20)})
    state.proc_children[pid] = [31001, 31002]
    text = "\n".join(t.plain for t in detail_lines(snapshot(state, time.time()), 0, 120))
    assert "children  2 (DataLoader workers, subprocesses): CPU 78%" in text
    assert "pid 31001  CPU 40%  resident 300" in text
    other = "\n".join(t.plain for t in detail_lines(snapshot(state, time.time()), 1, 120))
    assert "children" not in other


def test_enter_on_a_nodes_header_row_opens_that_nodes_first_rank(tmp_path: Path) -> None:
    async def main() -> None:
        app, state = synthetic_app(tmp_path, 16, nodes=2)
        async with app.run_test(size=(120, 40)) as pilot:
            app.refresh_views()
            await pilot.pause()
            table = app.query_one(RankTable)
            assert table.body.cursor == 0 and not table.row_texts()[0].lstrip().startswith("0")
            assert table.cursor_rank == 0  # the cursor starts on node 0's header row
            await pilot.press("enter")
            await pilot.pause()
            assert isinstance(app.screen, RankDetailScreen) and app.screen.rank == 0

    asyncio.run(main())


def test_log_lines_read_plain_and_only_their_prefix_is_dim():
    from ddptop.tui.widgets.log_view import format_line

    text = format_line(3, "loss 2.31")
    prefix = text.plain.index("loss")
    styles = {str(span.style) for span in text.spans if span.start >= prefix}
    assert "dim" not in str(text.style) and not any("dim" in s for s in styles)


def test_the_detail_says_the_hosts_time_between_forward_and_backward_where_it_matters() -> None:
    """Issue 44: the straggler rule names `host between forward and backward` (a loader called
    there, nanoGPT's prefetch); the rank's detail shows that time, which its phase bar keeps
    inside forward. The loss's own sub-millisecond launch is not said."""
    state = synthetic_state(2)
    for rank, gap in ((0, 0.2), (1, 6.3)):
        for rec in state.ranks[rank].recent:
            rec["host_gap_ms"] = gap
    snap = snapshot(state, time.time())
    assert "after fwd" not in "\n".join(t.plain for t in detail_lines(snap, 0, 120))
    text = "\n".join(t.plain for t in detail_lines(snap, 1, 140))
    assert "after fwd the host spends 6.3 ms a step between forward's return and backward" in text
