"""The GPU tab's history charts (issue 46 point 8): they fill exactly the rows the table
leaves, never wider than the tab, and where rows are short they say what a taller terminal
shows instead of cutting charts silently. Pure: series in, lines out."""

from __future__ import annotations

import collections

from ddptop.model.config import RunConfig
from ddptop.model.state import RunState
from ddptop.tui.render import chart_rows
from ddptop.tui.synthetic import synthetic_gpu_sample
from ddptop.tui.widgets.gpu_history import gpu_series, history_lines


def test_the_charts_fill_the_rows_they_get_and_no_more() -> None:
    history = [synthetic_gpu_sample(8, t=float(t), util=float(t % 100)) for t in range(130)]
    series = gpu_series(history)
    assert [s.label for s in series[:3]] == ["gpu 0 util", "gpu 0 memory", "gpu 0 power"] and len(series) == 24
    for width in (78, 118, 198):
        for height in range(0, 60):
            lines = history_lines(series, lambda n: f"history: the last {n} samples", "each GPU's util, memory, power", width, height)
            assert len(lines) == min(height, len(lines)) and all(line.cell_len <= width for line in lines)
            if height >= 3:
                assert len(lines) == height, (width, height, len(lines))  # no blank rows at the bottom
            if 1 <= height <= 2:
                assert "a taller terminal charts" in lines[0].plain
            if 2 < height <= len(series):
                assert "more charts: a taller terminal shows them" in lines[-1].plain


def test_a_chart_is_right_aligned_scaled_and_a_zero_still_shows() -> None:
    rows = chart_rows([0.0, 50.0, 100.0], 5, 2, 0.0, 100.0)
    assert rows == ["    █", "  ▁██"]  # newest on the right; 50 % is the bottom row full
    assert chart_rows([], 5, 2, 0.0, 1.0) == ["     ", "     "]


def test_the_history_it_reads_stays_bounded() -> None:
    state = RunState(run_id="r", config=RunConfig(), world_size=2)
    assert isinstance(state.gpu_history, collections.deque) and state.gpu_history.maxlen == 300
    assert isinstance(state.proc_history, collections.deque) and state.proc_history.maxlen == 300
