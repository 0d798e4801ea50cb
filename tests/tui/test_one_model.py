"""One model of the run (issue 20): the header, the rank table, the alerts, the runs tab
and the headless line all read their figures from RunState / ddptop.model.figures, so they
cannot contradict each other: one slowest rank, one straggler rule, one stall bound,
samples/s = steps/s x samples per step, the same steps/s in the header and runs tab."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

import pytest
from test_tui_views import app_for, show

from ddptop.model import figures, report
from ddptop.model.config import RunConfig
from ddptop.model.snapshot import snapshot
from ddptop.model.state import RunState
from ddptop.tui.widgets.rank_table import RankTable
from ddptop.tui.widgets.run_alerts import RunAlerts
from ddptop.tui.widgets.run_header import RunHeader
from ddptop.tui.widgets.runs_panel import RunsPanel
from ddptop.wire.protocol import Hello, Steps

NOW = 1_000_000.0


def rec(step: int, step_ms: float, exposed: float = 0.0, samples: int = 32) -> dict[str, float]:
    return {"step": step, "t": float(step), "step_ms": step_ms, "data_ms": 1.0, "forward_ms": 2.0,
            "backward_ms": step_ms - 4.0, "optimizer_ms": 1.0, "samples": samples,
            "exposed_comm_ms": exposed}


def state_of(per_rank: dict[int, list[dict[str, float]]], warmup: int = 0) -> RunState:
    n = len(per_rank)
    state = RunState(run_id="20260101-120000-baseline", config=RunConfig(preset="baseline", steps=1000),
                     world_size=n, warmup=warmup, started_at=NOW - 30)
    for r, recs in per_rank.items():
        state.apply(Hello(rank=r, local_rank=r, world_size=n, host="h", pid=100 + r, token="",
                          device="cpu", backend="gloo", model="tiny"), NOW)
        state.apply(Steps(r, recs), NOW)
    return state


def disagreeing_state() -> RunState:
    """Rank 0 was the slowest for 200 steps and is now the fastest; rank 1 is steady.
    Over the whole recent ring (256) rank 0's median own work is the highest, over the
    last 50 steps rank 1's is: two windows used to name two different ranks. The last
    80 steps are long enough for the straggler rule's checks to agree on rank 1."""
    rank0 = [rec(i, 100.0) for i in range(200)] + [rec(i, 50.0) for i in range(200, 280)]
    rank1 = [rec(i, 80.0) for i in range(280)]
    return state_of({0: rank0, 1: rank1})


def test_slowest_and_straggler_name_the_same_rank() -> None:
    state = disagreeing_state()
    snap = snapshot(state, NOW)
    assert snap.straggler is not None and snap.straggler.rank == 1
    assert snap.slowest == 1 == state.slowest_rank() == state.straggler().rank
    summary = state.summary()
    assert summary["slowest_rank"] == summary["straggler"]["rank"] == 1


def test_the_screen_names_one_slow_rank(tmp_path: Path) -> None:
    state = disagreeing_state()
    state.status = "running"

    async def main() -> None:
        app = app_for(state, tmp_path)
        async with app.run_test(size=(120, 40)) as pilot:
            await show(app, pilot)
            header = str(app.query_one(RunHeader).render())
            alerts = str(app.query_one(RunAlerts).render())
            rows = app.query_one(RankTable).row_texts()
            assert "slowest rank 1" in header
            assert "rank 1 straggler: backward, costs the job 30.0 ms/step" in alerts
            assert [r.split()[0] for r in rows] == ["0", "▲1"]
            assert rows[1].rstrip().endswith("straggler") and not rows[0].rstrip().endswith("straggler")

    asyncio.run(main())


def uneven_state() -> RunState:
    """Rank 0 steps in 10 ms; rank 1 mostly in 20 ms with a 120 ms step in every ten:
    its median (20) and its mean (30) differ, and the ranks' own rates differ."""
    rank0 = [rec(i, 10.0) for i in range(100)]
    rank1 = [rec(i, 120.0 if i % 10 == 9 else 20.0) for i in range(100)]
    return state_of({0: rank0, 1: rank1}, warmup=0)


def numbers(text: str, *labels: str) -> list[float]:
    return [float(re.search(rf"{re.escape(label)}\s+([0-9.]+)", text).group(1)) for label in labels]


def test_samples_per_s_is_steps_per_s_times_samples_per_step_everywhere(tmp_path: Path) -> None:
    state = uneven_state()
    state.status = "running"
    per_step = 64  # 32 samples on each of 2 ranks
    steps, samples = state.steps_per_s(), figures.job_samples_per_s_run(state.ranks.values())
    assert steps == pytest.approx(100 / 3.0)  # rank 1's 100 steps took 3 s: it bounds the job
    assert samples == pytest.approx(steps * per_step)
    summary = state.summary()
    assert summary["samples_per_s"] == pytest.approx(summary["steps_per_s"] * per_step, rel=0.01)

    line = report.status_line(state, NOW)
    line_steps = float(re.search(r"([0-9.]+) steps/s", line).group(1))
    line_samples = float(re.search(r"([0-9.]+) samples/s", line).group(1))
    assert line_samples == pytest.approx(line_steps * per_step, rel=0.01)

    async def main() -> None:
        app = app_for(state, tmp_path)
        async with app.run_test(size=(120, 40)) as pilot:
            await show(app, pilot)
            header = str(app.query_one(RunHeader).render())
            h_steps, h_samples = numbers(header, "steps/s", "samples/s")
            assert h_samples == pytest.approx(h_steps * per_step, rel=0.01)
            await show(app, pilot, "3")
            table = app.query_one(RunsPanel).table
            cells = dict(zip([str(c.label) for c in table.ordered_columns],
                             [str(v) for v in table.get_row_at(0)]))
            assert float(cells["steps/s"]) == h_steps == line_steps == pytest.approx(steps, abs=0.01)
            assert float(cells["samples/s"]) == pytest.approx(float(cells["steps/s"]) * per_step, rel=0.01)

    asyncio.run(main())


def test_a_rank_reads_stalled_after_the_same_bound_as_the_run() -> None:
    """One stall rule: a rank is "stalled?" once silent for the run's stall bound (20
    median steps, at least 10 s), not after a bound of its own."""
    state = state_of({0: [rec(i, 1000.0) for i in range(10)], 1: [rec(i, 1000.0) for i in range(10)]})
    for rs in state.ranks.values():
        rs.status = "running"
    assert state.stall_bound_s() == pytest.approx(20.0)
    assert set(snapshot(state, NOW + 15).status.values()) == {"running"}
    assert set(snapshot(state, NOW + 21).status.values()) == {"stalled?"}


def test_figures_are_recomputed_only_for_ranks_that_sent_records() -> None:
    state = uneven_state()
    first = state.rank_figures()
    state.apply(Steps(0, [rec(100, 10.0)]), NOW)
    second = state.rank_figures()
    assert second[1] is first[1] and second[0] is not first[0]
    assert second[0].step_ms[-1] == 10.0 and len(second[0].step_ms) == 101


def test_exposed_comm_alone_splits_out_of_backward_and_says_the_total_is_not_timed() -> None:
    """A GPU run with DDP's own all-reduce and no nccl_timing: exposed comm every step, no comm_ms."""
    state = state_of({0: [rec(i, 100.0, exposed=20.0) for i in range(30)],
                      1: [rec(i, 100.0, exposed=20.0) for i in range(30)]})
    snap = snapshot(state, NOW)
    assert snap.with_comm and snap.comm is not None
    assert snap.comm[0] is None and snap.comm[1] == pytest.approx(0.2)
    fig = snap.ranks[0]
    assert fig.comm_share is None and fig.exposed_share == pytest.approx(0.2)
    assert fig.phases["comm"] == pytest.approx(20.0) and fig.phases["backward"] == pytest.approx(76.0)
    assert "exposed comm 20%" in report.status_line(state, NOW)
    lines = report.final_report(state.summary(), "/runs/x")
    assert "20.0% of the step exposed" in lines and "gloo_timing is off" in lines  # a gloo run: its own switch
