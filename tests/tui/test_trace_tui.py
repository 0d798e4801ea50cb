"""The captures tab while traces are summarised (issue 28.6, 28.4): the TUI keeps refreshing
(never blocked > 100 ms) while a large capture is summarised by the real capture pipeline,
and `D` picks two captures and shows `ddptop trace A B --diff`'s lines."""

from __future__ import annotations

import asyncio
import gc
import json
import time
from pathlib import Path

import pytest

from ddptop.analysis.capture import Capture
from ddptop.commands.trace import main_trace
from ddptop.run.capture_pipeline import CapturePipeline
from ddptop.tui.app import DdpTopApp
from ddptop.tui.screens.capture_diff import CaptureDiffScreen
from ddptop.tui.synthetic import synthetic_state, synthetic_workbench
from ddptop.tui.widgets.captures_panel import CapturesPanel
from ddptop.wire import protocol
from tests.trace_big import write_big_trace
from tests.trace_builders import GpuTrace

TICK_S = 0.05
MAX_LATE_S = 0.1



# Two more tries: on a loaded 2-core VM one refresh read 102 ms blocked once in a full suite
# (2026-11-28, the VM ~2.5x slower than the day before); a summary that truly runs on the
# refresh's thread blocks every try (~3 s) and still fails.
@pytest.mark.flaky(reruns=2, reruns_delay=1)
def test_refresh_is_never_blocked_while_a_large_capture_is_summarised(tmp_path: Path) -> None:
    path = tmp_path / "rank0.trace.json"
    expect = write_big_trace(path, 25)  # both ranks' files: ~3 s of summarising
    state = synthetic_state(2)
    state.captures.clear()
    app = DdpTopApp(synthetic_workbench(state, tmp_path), autostart=False, refresh_s=3600)
    pipeline = CapturePipeline(state, options=None, run_dir=tmp_path)  # type: ignore[arg-type]
    ticks: list[tuple[float, float]] = []

    def tick() -> None:  # the app's refresh, on a fast clock, timed (wall, and this process's CPU)
        ticks.append((time.monotonic(), time.process_time()))
        app.refresh_views()

    async def main() -> None:
        async with app.run_test(size=(120, 40)) as pilot:
            await pilot.press("6")
            cap = Capture(7, start=0, count=1, profiler="torch", out_dir=str(tmp_path))
            state.captures[7] = cap
            app.set_interval(TICK_S, tick)
            await pilot.pause(0.3)
            for rank in (0, 1):  # both ranks wrote their trace: the pipeline summarises the window
                pipeline.report(protocol.CaptureReport(rank, 7, "written", [str(path)]))
            assert cap.status == "processing"
            deadline = time.monotonic() + 60
            while cap.status == "processing" and time.monotonic() < deadline:
                await pilot.pause(0.1)
            await pilot.pause(0.3)
            assert cap.status == "done", cap.error
            assert cap.summary is not None
            assert cap.summary["ranks"]["0"]["counts"]["compute"] == expect["compute"]
            assert "#7  steps 0-0  torch  done" in app.query_one(CapturesPanel).text()

    # The test worker's own heap (every module and test before this one) would make a full
    # garbage collection take 100-200 ms whenever one falls due; a TUI process has no such heap.
    gc.collect()
    gc.freeze()
    try:
        asyncio.run(main())
    finally:
        gc.unfreeze()
    assert len(ticks) > 40, len(ticks)
    # Blocked: late while this process worked (the summary in a thread of it: 200 ms). Late while
    # it did not run at all is the OS serving other processes (a loaded CI box), not a block.
    late = [(b - a - TICK_S, cb - ca) for (a, ca), (b, cb) in zip(ticks, ticks[1:])]
    blocked = max(min(wall, cpu) for wall, cpu in late)
    print(f"{len(ticks)} refreshes, the latest {max(w for w, _ in late) * 1000:.0f} ms late, "
          f"blocked at most {blocked * 1000:.0f} ms")
    assert blocked < MAX_LATE_S, f"a refresh was blocked {blocked * 1000:.0f} ms"


def _capture_dir(root: Path, gemm_us: float) -> Path:
    root.mkdir()
    for rank in (0, 1):
        t = GpuTrace(rank)
        t.cpu("ProfilerStep#3", 0, 2000, cat="user_annotation")
        t.kernel("gemm", 100, gemm_us, launch=50).kernel("relu", 800, 50, launch=700)
        t.allreduce(1000, 300 + 100 * rank, launch=950)
        (root / f"rank{rank}.trace.json").write_text(json.dumps(t.trace()))
    return root


def test_pick_two_captures_and_see_their_diff(tmp_path: Path, capsys) -> None:  # noqa: ANN001
    before, after = _capture_dir(tmp_path / "a", 600.0), _capture_dir(tmp_path / "b", 400.0)
    assert main_trace([str(before), str(after), "--diff"]) == 0
    cli = capsys.readouterr().out.splitlines()
    state = synthetic_state(2)
    state.captures = {1: Capture(1, 3, 1, "torch", str(before), status="done"),
                      2: Capture(2, 9, 1, "torch", str(tmp_path / "c"), status="failed"),  # not offered
                      3: Capture(3, 20, 1, "torch", str(after), status="done")}
    app = DdpTopApp(synthetic_workbench(state, tmp_path), autostart=False, refresh_s=3600)

    async def main() -> None:
        async with app.run_test(size=(120, 40)) as pilot:
            await pilot.press("6")
            await pilot.press("D")
            screen = app.screen
            assert isinstance(screen, CaptureDiffScreen)
            assert [cap.capture_id for _, cap in screen.captures] == [1, 3]
            await pilot.press("space", "down", "space")  # pick both
            deadline = time.monotonic() + 30
            while (not screen.lines or "comparing" in screen.lines[0].plain) and time.monotonic() < deadline:
                await pilot.pause(0.1)
            shown = [line.plain for line in screen.lines]
            assert shown[0] == f"before {before}   after {after}"
            assert shown[2:] == cli  # what `ddptop trace A B --diff` prints
            assert any(line.startswith("  faster") and line.endswith("gemm") for line in shown)
            await pilot.press("escape")
            assert not isinstance(app.screen, CaptureDiffScreen)

    asyncio.run(main())
