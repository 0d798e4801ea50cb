"""A comm hook's own work in a capture (ddptop.analysis.hook_work) and ddptop's hook timer
against the same span (ddptop.analysis.capture.compare_with_timer), on a synthetic bf16-hook
trace laid out as torch runs the hook, and on a real CPU trace of one."""

from __future__ import annotations

import json

import pytest

from ddptop.analysis.capture import compare_with_timer
from ddptop.analysis.rank_trace import rank_trace
from tests.trace_builders import GpuTrace


def bf16_bucket(t: GpuTrace, at: float) -> None:
    """One bucket as the bf16 hook runs on a GPU (times relative to `at`, us): inside autograd's
    AccumulateGrad of the bucket's last gradient, after DDP's own accumulate and bucket copy,
    the cast (0.60 ms), the divide (0.41), the collective's call (NCCL 1.90 ms, and a
    bookkeeping memset launched inside the call) and the decompressing copy on a pool stream
    (0.95)."""
    t.cpu("autograd::engine::evaluate_function: torch::autograd::AccumulateGrad", at, 2000)
    t.cpu("torch::autograd::AccumulateGrad", at, 50).kernel("add_grad", at + 100, 50, launch=at + 10)
    t.cpu("torch::distributed::reducer::copy_", at + 60, 40).kernel("copy_into_bucket", at + 150, 50, launch=at + 70)
    t.cpu("aten::to", at + 200, 50).kernel("cast_to_bf16", at + 300, 600, launch=at + 210)
    t.cpu("aten::div_", at + 260, 40).kernel("div_by_world", at + 900, 410, launch=at + 270)
    t.cpu("c10d::allreduce_", at + 400, 100).cpu("nccl:all_reduce", at + 410, 80)
    t.allreduce(at + 1310, 1900, launch=at + 420)
    t.kernel("nccl_bookkeeping_memset", at + 1305, 5, stream=20, launch=at + 430)
    t.cpu("aten::copy_", at + 600, 50).kernel("decompress_copy", at + 3210, 950, stream=30, launch=at + 610)


def hooked_trace() -> dict:
    t = GpuTrace(0)
    t.kernel("forward_gemm", 0, 900, launch=-50)
    bf16_bucket(t, 1000)
    bf16_bucket(t, 11000)
    return t.trace()


def test_hook_work_and_span_exact():
    s = rank_trace(hooked_trace()).summary
    hook = s["hook"]
    assert hook["work_ms"] == pytest.approx(2 * (0.60 + 0.41 + 0.95))
    assert hook["span_ms"] == pytest.approx(2 * 3.86)  # cast start to decompress end, per bucket
    assert hook["buckets"] == 2 and hook["count"] == 6
    assert [t["name"] for t in hook["top"]] == ["decompress_copy", "cast_to_bf16", "div_by_world"]
    assert s["comm_ms"] == pytest.approx(2 * (1.9 + 0.005))  # the collectives' kernels, as before


def test_no_hook_no_hook_work():
    t = GpuTrace(0)
    t.cpu("autograd::engine::evaluate_function: torch::autograd::AccumulateGrad", 0, 500)
    t.cpu("torch::autograd::AccumulateGrad", 0, 50).kernel("add_grad", 100, 50, launch=10)
    t.cpu("torch::distributed::reducer::copy_", 60, 40).kernel("copy_into_bucket", 150, 50, launch=70)
    t.cpu("nccl:all_reduce", 110, 80).allreduce(200, 1000, launch=120)
    assert "hook" not in rank_trace(t.trace()).summary


def test_timer_compared_with_the_same_span():
    """The ranks send NCCL's own comm_ms and the hook's whole span hook_ms per step: the first
    against the trace's collectives, the second against the trace's hook span (like with like)."""
    entry = {"file": "rank0", **rank_trace(hooked_trace()).summary}
    summary = {"ranks": {"0": entry}}
    records = {0: [{"step": 20, "comm_ms": 1.905, "hook_ms": 3.86}, {"step": 21, "comm_ms": 1.905, "hook_ms": 3.86},
                   {"step": 22, "comm_ms": 9.0, "hook_ms": 20.0}]}  # outside the window
    compare_with_timer(summary, records, range(20, 22))
    assert entry["timer_vs_trace"] == pytest.approx(1.0)
    assert entry["timer_hook_ms"] == pytest.approx(7.72) and entry["timer_vs_trace_hook"] == pytest.approx(1.0)
    assert entry["hook_extra_ms"] == pytest.approx(2 * (3.86 - 1.905))
    assert summary["timer_vs_trace_hook_mean"] == pytest.approx(1.0)


def test_without_nccl_timing_the_timer_is_the_hook_span():
    entry = {"file": "rank0", **rank_trace(hooked_trace()).summary}
    summary = {"ranks": {"0": entry}}
    compare_with_timer(summary, {0: [{"step": 20, "comm_ms": 7.72}]}, range(20, 21))
    assert entry["timer_vs_trace_hook"] == pytest.approx(1.0)


def test_shown_in_trace_command_and_captures_tab(tmp_path, capsys):
    from ddptop.analysis.capture import Capture
    from ddptop.commands.trace import main_trace
    from ddptop.run.trace_files import summarize_capture_traces
    from ddptop.tui.widgets.captures_panel import capture_lines

    path = tmp_path / "rank0.trace.json"
    path.write_text(json.dumps(hooked_trace()))
    assert main_trace([str(path)]) == 0
    line = ("comm hook: own work 3.92 ms (decompress_copy 1.90, cast_to_bf16 1.20, div_by_world 0.82); "
            "with its collectives 7.72 ms over 2 buckets")
    assert line in capsys.readouterr().out
    summary = summarize_capture_traces({0: [str(path)]})
    compare_with_timer(summary, {0: [{"step": 5, "comm_ms": 3.81, "hook_ms": 7.7}]}, range(5, 6))
    shown = "\n".join(t.plain for t in capture_lines(Capture(1, 5, 1, "torch", str(tmp_path), "done",
                                                             summary=summary)))
    assert line + "; ddptop's hook timer 7.70 ms (0.997 of that)" in shown


def test_real_cpu_bf16_hook_trace():
    """torch 2.x on CPU, DDP with bf16_compress_hook on a 1-rank gloo group, one profiled step
    (tests/fixtures/traces/cpu_bf16_hook/rank0.trace.json, trimmed to the backward's ops):
    aten::to 7.4 us, aten::div_ 10.3, the decompressing aten::copy_ 4.1; the span from the cast
    to the copy's end 186.7 us."""
    from pathlib import Path
    trace = json.loads((Path(__file__).parents[1] / "fixtures" / "traces" / "cpu_bf16_hook" /
                        "rank0.trace.json").read_text())
    hook = rank_trace(trace).summary["hook"]
    assert hook["work_ms"] == pytest.approx(0.0218, abs=1e-3) and hook["span_ms"] == pytest.approx(0.187, abs=1e-3)
    assert {t["name"] for t in hook["top"]} >= {"aten::to", "aten::div_", "aten::copy_"}
