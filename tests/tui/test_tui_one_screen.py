"""Issue 31, "must show" 1 and 2: a screen that never contradicts itself. A scripted run
with known numbers (every step 100 ms on both ranks; rank 1 spends 16 ms more of it in
data, rank 0 waits those 16 ms more in the all-reduce) is read back from the rendered
screen at 80x24 and 200x60: each figure names its window and reads the same wherever it
appears; the straggler's row shows the own work its verdict rests on (its p50 is no
higher than the others', as in a real DDP run); a symmetric run's mark does not flip over
60 s of refreshes; the advice for a data straggler names data, not compression."""

from __future__ import annotations

import asyncio
import random
import re
from pathlib import Path

import pytest
from test_web import LiveSession

from ddptop.analysis.advisor import advise_run
from ddptop.model.config import RunConfig
from ddptop.model.snapshot import snapshot
from ddptop.model.state import RunState
from ddptop.tui.app import DdpTopApp
from ddptop.tui.screens.rank_detail import RankDetailScreen
from ddptop.tui.synthetic import synthetic_workbench
from ddptop.tui.widgets.rank_table import RankTable
from ddptop.wire.protocol import Hello, Steps

NOW = 1_000_000.0
SIZES = {"80x24": (80, 24), "200x60": (200, 60)}


def rec(step: int, rank: int, jitter: float = 0.0) -> dict[str, float]:
    """100 ms a step; rank 1: data 26 ms, exposed comm 4; the others: data 10, exposed 20 (they
    wait 16 ms for rank 1 in the all-reduce: 16 ms more of it, comm 32 vs 48 ms)."""
    data, exposed = (26.0, 4.0) if rank == 1 else (10.0, 20.0)
    return {"step": step, "t": NOW - 12 + step * 0.1, "step_ms": 100.0 + jitter, "data_ms": data,
            "forward_ms": 20.0 + jitter, "backward_ms": 40.0 + exposed, "optimizer_ms": 100.0 - data - 60.0 - exposed,
            "samples": 32, "comm_ms": 28.0 + exposed, "exposed_comm_ms": exposed}


def scripted_state(ranks: int = 2, steps: int = 120) -> RunState:
    state = RunState(run_id="20260101-120000-baseline", config=RunConfig(preset="baseline", steps=1000),
                     world_size=ranks, warmup=0, started_at=NOW - 60)
    for r in range(ranks):
        state.apply(Hello(rank=r, local_rank=r, world_size=ranks, host="h", pid=100 + r, token="",
                          device="cpu", backend="gloo", model="tiny"), NOW)
        state.apply(Steps(r, [rec(i, r) for i in range(steps)]), NOW)
    return state


def app_on(state: RunState, tmp_path: Path, live: bool = True, **kw: object) -> DdpTopApp:
    bench = synthetic_workbench(state, tmp_path)
    if live:
        bench.sessions[-1] = LiveSession(state, state.config, tmp_path / state.run_id)  # type: ignore[call-overload]
    return DdpTopApp(bench, autostart=False, refresh_s=3600, clock=lambda: NOW, **kw)  # type: ignore[arg-type]


def screen(app: DdpTopApp) -> str:
    return "\n".join(strip.text for strip in app.screen._compositor.render_strips())


def number(pattern: str, text: str) -> float:
    found = re.search(pattern, text)
    assert found, f"{pattern!r} not on the screen:\n{text}"
    return float(found.group(1))


def row_of(app: DdpTopApp, rank: int) -> dict[str, str]:
    """The rank's row as {column title: cell}, read from the rendered table."""
    table = app.query_one(RankTable)
    titles = str(table.query_one("#rank-header").render()).split("  ")
    titles = [t.strip().rstrip("↓↑") for t in titles if t.strip()]
    row = next(r for r in table.row_texts() if r.split()[0].lstrip("▲") == str(rank))
    cells = [c.strip() for c in re.split(r"\s{2,}", row.strip())]
    phases = titles.index("phases")
    cells.insert(phases, "") if len(cells) < len(titles) else None  # a bar of one colour splits nothing
    return dict(zip(titles, cells))


@pytest.mark.parametrize("size", SIZES)
def test_every_figure_reads_the_same_and_names_its_window(tmp_path: Path, size: str) -> None:
    state = scripted_state()
    state.status = "running"

    async def main() -> None:
        app = app_on(state, tmp_path)
        async with app.run_test(size=SIZES[size]) as pilot:
            app.refresh_views()
            await pilot.pause()
            app.refresh_views()
            await pilot.pause()
            text = screen(app)
            # header: both windows, each named
            run_rate = number(r"run steps/s ([0-9.]+)", text)
            recent_rate = number(r"last 50 steps/s ([0-9.]+)", text)
            assert run_rate == recent_rate == 10.0  # 100 ms steps, whichever window
            assert number(r"run steps/s [0-9.]+  samples/s ([0-9.]+)", text) == 640.0
            job_samples = number(r"last 50 steps/s [0-9.]+  samples/s ([0-9.]+)", text)
            # the chart's "now" is the header's last-50 figure, named the same
            assert number(r"steps/s last 50 ([0-9.]+)", text) == recent_rate
            assert re.search(r"\brun p50 [0-9.]+ ms", text)  # the whole-run percentiles say so
            # the table: its window in its title, p50 = 1000 / the job's rate, own work per rank
            assert "figures over each rank's last 50 steps" in text
            rows = {r: row_of(app, r) for r in (0, 1)}
            assert float(rows[1]["p50 ms"]) == float(rows[0]["p50 ms"]) == 1000 / recent_rate
            own0, own1 = float(rows[0]["own ms"]), float(rows[1]["own ms"])
            assert (own0, own1) == (80.0, 96.0)
            if "samples/s" in rows[0]:  # dropped at 80 columns: the rows add up to the header's
                assert float(rows[0]["samples/s"]) + float(rows[1]["samples/s"]) == job_samples
            # the alert: the straggler's cost is the table's difference in own work (no wait hidden)
            excess = number(r"rank 1 straggler: data, costs the job ([0-9.]+) ms/step", text)
            assert excess == own1 - own0 and ("last on 50/50 steps" in text or size == "80x24")
            # exposed comm: the legend's share is the header's (where the header has room)
            legend = number(r"exposed (\d+)%", text)
            assert legend == 12  # (20 + 4) / 2 of 100 ms
            if size == "200x60":
                assert "comm 40% of step, exposed 12% (last 50;" in text  # then the run's shares
                assert number(r"r1\s+\S+\s+([0-9.]+) ms", text) == float(rows[1]["p50 ms"])  # the sparkline's figure
            # the detail: titled, the same p50 and own work, the same step as its timeline
            await pilot.press("down", "enter")
            await pilot.pause()
            assert isinstance(app.screen, RankDetailScreen)
            app.screen.refresh_detail()
            await pilot.pause()
            detail = screen(app)
            assert "Rank detail: ▲ rank 1" in detail and "straggler" in detail
            assert number(r"p50 ([0-9.]+)", detail) == float(rows[1]["p50 ms"])
            assert number(r"own work ([0-9.]+)", detail) == own1 and "(last 50)" in detail
            step = number(r"Rank detail: .* step (\d+)", detail)
            assert number(r"│? ?step (\d+)\s+[0-9.]+ ms", detail) == step == 120

    asyncio.run(main())


def test_the_straggler_row_shows_the_own_work_its_verdict_rests_on(tmp_path: Path) -> None:
    """As in a real DDP run the straggler's step is no longer than the others' (they wait
    for it): only its own work, now a column, shows why it is marked."""
    state = scripted_state(ranks=4)
    state.status = "running"
    finding = state.straggler()
    assert finding is not None and finding.rank == 1

    async def main() -> None:
        app = app_on(state, tmp_path)
        async with app.run_test(size=(120, 40)) as pilot:
            app.refresh_views()
            await pilot.pause()
            rows = {r: row_of(app, r) for r in range(4)}
            assert rows[1]["rank"] == "▲1" and rows[1]["status"] == "straggler"
            assert float(rows[1]["own ms"]) == finding.own_ms == max(float(r["own ms"]) for r in rows.values())
            assert {float(r["p50 ms"]) for r in rows.values()} == {100.0}  # the step alone says nothing
            assert float(rows[0]["own ms"]) == finding.others_ms

    asyncio.run(main())


def test_no_straggler_flip_on_a_symmetric_run_over_60_s_of_refreshes(tmp_path: Path) -> None:
    """4 ranks alike but for noise; 120 refreshes 0.5 s apart, two steps each. The rank with
    the most own work changes often (that was the mark); the mark, the header, the status
    column and the alert never name a straggler."""
    rng = random.Random(3)
    state = RunState(run_id="20260101-120000-baseline", config=RunConfig(preset="baseline"), world_size=4,
                     warmup=0, started_at=NOW - 60)
    for r in range(4):
        state.apply(Hello(rank=r, local_rank=r, world_size=4, host="h", pid=100 + r, token="", device="cpu",
                          backend="gloo", model="tiny"), NOW)

    def step_all(step: int) -> None:
        for r in range(4):
            jitter = rng.gauss(0.0, 3.0)
            state.apply(Steps(r, [{**rec(step, 0), "step_ms": 100.0 + jitter, "forward_ms": 20.0 + jitter}]), NOW)

    for step in range(40):
        step_all(step)

    async def main() -> tuple[set[int | None], int, list[str]]:
        app = app_on(state, tmp_path)
        heaviest: list[int | None] = []
        said: list[str] = []
        async with app.run_test(size=(120, 40)) as pilot:
            for tick in range(120):
                step_all(40 + 2 * tick)
                step_all(41 + 2 * tick)
                app.refresh_views()
                snap = app.views.last
                assert snap is not None
                heaviest.append(snap.heaviest)
                rows = app.query_one(RankTable).row_texts()
                said += [r for r in rows if "▲" in r or "straggler" in r]
                if tick % 20 == 0:
                    await pilot.pause()
                    text = screen(app)
                    said += [line for line in text.splitlines() if "slowest" in line or re.search(r"rank \d+ straggler:", line)]
        flips = sum(a != b for a, b in zip(heaviest, heaviest[1:]))
        return set(heaviest), flips, said

    heaviest, flips, said = asyncio.run(main())
    assert len(heaviest) > 1 and flips >= 5  # what the mark used to follow
    assert said == []
    assert state.straggler() is None and state.straggler_verdict.latest is not None


def test_the_advice_for_a_data_straggler_names_data_not_compression(tmp_path: Path) -> None:
    """The wiring tab shows the advisor's word: the other ranks' all-reduce wait is rank 1's
    data, so no communication setting (compression) is advised."""
    state = scripted_state()
    state.status = "running"
    state.advice = advise_run(state.summary(), None, None, env={})

    async def main() -> str:
        app = app_on(state, tmp_path)
        async with app.run_test(size=(120, 40)) as pilot:
            await pilot.press("5")
            app.refresh_views()
            await pilot.pause()
            return screen(app)

    text = asyncio.run(main())
    # the advice says the verdict's own words: the cost to the job, not the rank's excess
    said = state.summary()["straggler"]
    assert f"rank 1 straggler: data, costs the job {said['cost_ms']:.1f} ms/step" in text and "input pipeline" in text
    advice = text[text.index("rank 1 straggler: data"):].lower()
    assert not re.search(r"compress|bf16|powersgd|fp16", advice), advice
    assert snapshot(state, NOW).straggler is not None
