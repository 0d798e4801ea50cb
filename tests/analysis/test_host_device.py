"""Host-bound vs device-bound per rank (ddptop.analysis.host_device): HTA 0.5.0's queue length
and launch delay, the GPU's idle time by cause, the verdict; synthetic traces with known
queues, and HTA itself on the real H100 capture."""

from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path

import pytest

from ddptop.analysis.rank_trace import rank_trace
from tests.trace_builders import GpuTrace

H100 = Path(__file__).parents[1] / "fixtures" / "traces" / "h100_one_rank" / "rank0.trace.json.gz"


def test_known_queue_length_and_launch_delay():
    """Three kernels launched at 0, 1, 2 (each call 0.5 us), started at 10, 20, 30: the queue
    steps 1 2 3 2 1 0 (mean 1.5, max 3); launch delays 9.5, 18.5, 27.5 us."""
    t = GpuTrace(0)
    for i in range(3):
        t.kernel("k", 10.0 * (i + 1), 5.0, launch=float(i))
    t.events = [dict(e, dur=0.5) if e["cat"] == "cuda_runtime" else e for e in t.events]
    b = rank_trace(t.trace()).summary["bound"]
    assert (b["queue_stream"], b["queue_mean"], b["queue_max"]) == (7, 1.5, 3.0)
    assert b["launch_delay_mean_ms"] == pytest.approx(0.0185) and b["launch_delay_max_ms"] == pytest.approx(0.0275)
    assert b["launches"] == 3


def test_host_bound_rank():
    """Every kernel is launched after the previous one ended: the GPU waits on the host."""
    t = GpuTrace(0)
    for i in range(10):
        t.kernel("k", 1000.0 * i + 500, 100.0, launch=1000.0 * i + 400)  # busy 100 of each 1000 us
    b = rank_trace(t.trace()).summary["bound"]
    assert b["idle_host_wait_ms"] == pytest.approx(8.1) and b["idle_other_ms"] == 0.0
    assert b["window_ms"] == pytest.approx(9.1) and b["host_wait_pct"] == pytest.approx(89.0)
    assert b["queue_max"] == 1.0
    assert b["verdict"].startswith("host-bound: the GPU waited on the host 8.1 ms (89%) of its 9.1 ms window "
                                   "(queue 0.5 (max 1) on stream 7, launch delay 0.10 ms)")


def test_device_bound_rank():
    """100 kernels all launched up front, run back to back (1 us gaps: kernel wait)."""
    t = GpuTrace(0)
    for i in range(100):
        t.kernel("k", 1000.0 + 101.0 * i, 100.0, launch=float(i))
    b = rank_trace(t.trace()).summary["bound"]
    assert b["idle_host_wait_ms"] == 0.0 and b["idle_kernel_wait_ms"] == pytest.approx(0.099)
    assert b["queue_max"] == 100.0
    assert b["verdict"].startswith("device-bound: the GPU waited on the host only 0.0 ms (0%)")


def test_idle_other_is_a_wait_on_another_stream():
    t = GpuTrace(0)
    t.kernel("a", 0.0, 100.0, launch=-10.0).kernel("b", 500.0, 100.0, launch=5.0)  # queued, yet 400 us idle
    b = rank_trace(t.trace()).summary["bound"]
    assert b["idle_other_ms"] == pytest.approx(0.4) and b["idle_host_wait_ms"] == 0.0


def test_cpu_trace_has_no_verdict():
    t = GpuTrace(0).cpu("aten::mm", 0, 100)
    assert "bound" not in rank_trace(t.trace()).summary


@pytest.mark.filterwarnings("ignore::Warning:hta")
def test_agrees_with_hta_on_the_h100_capture(tmp_path, monkeypatch):
    """HTA 0.5.0's queue length summary and launch stats on the same trace (ns rounding off)."""
    pytest.importorskip("hta")
    monkeypatch.setenv("HTA_DISABLE_NS_ROUNDING", "1")
    from hta.trace_analysis import TraceAnalysis

    shutil.copy(H100, tmp_path / H100.name)
    analysis = TraceAnalysis(trace_dir=str(tmp_path), include_last_profiler_step=True)
    queues = analysis.get_queue_length_summary(ranks=[0])
    delays = analysis.get_cuda_kernel_launch_stats(ranks=[0], visualize=False)[0]["launch_delay"]
    b = rank_trace(json.load(gzip.open(H100))).summary["bound"]
    for stream, q in b["queues"].items():
        row = queues.loc[(0, int(stream))]["queue_length"]
        assert q["mean"] == pytest.approx(row["mean"], abs=0.01) and q["max"] == row["max"]
    assert b["launch_delay_mean_ms"] == pytest.approx(delays.mean() / 1000, abs=1e-3)
    assert b["launch_delay_max_ms"] == pytest.approx(delays.max() / 1000, abs=1e-3)
    assert b["verdict"].startswith("host-bound")  # one H100, ViT-L: 89.3 ms of 359.4 waiting on the host


def test_verdict_in_trace_command_and_captures_tab(capsys):
    from ddptop.analysis.capture import Capture
    from ddptop.commands.trace import main_trace
    from ddptop.run.trace_files import summarize_capture_traces
    from ddptop.tui.widgets.captures_panel import capture_lines

    assert main_trace([str(H100)]) == 0
    out = capsys.readouterr().out
    assert "  host-bound: the GPU waited on the host 89.3 ms (25%) of its 359.4 ms window (queue 5.2 (max 23) " \
           "on stream 7, launch delay 0.24 ms)" in out
    cap = Capture(1, 20, 3, "torch", str(H100.parent), status="done",
                  summary=summarize_capture_traces({0: [str(H100)]}))
    shown = "\n".join(t.plain for t in capture_lines(cap))
    assert "      host-bound: the GPU waited on the host 89.3 ms (25%)" in shown
