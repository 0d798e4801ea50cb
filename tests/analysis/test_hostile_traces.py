"""Hostile traces (issue 28.6): implausible, negative, NaN and string durations and exact
duplicates are dropped and counted in one line; nothing usable is one line and exit 2; an
empty file says so."""

from __future__ import annotations

import copy
import gzip
import json

import pytest

from ddptop.analysis.plausibility import clean
from ddptop.analysis.rank_trace import rank_trace
from ddptop.commands.trace import main_trace
from tests.trace_builders import GpuTrace


def good() -> GpuTrace:
    t = GpuTrace(0)
    t.cpu("ProfilerStep#5", 0, 1000, cat="user_annotation")
    t.kernel("gemm", 100, 300, launch=50).kernel("gemm", 500, 300, launch=450)
    return t


@pytest.mark.parametrize("dur, reason", [(1e12, "ends far beyond the rest of the trace 1"), (-5, "negative duration 1"),
                                         (float("nan"), "duration NaN or infinite 1"),
                                         ("300", "duration not a number 1")])
def test_bad_duration_dropped_and_counted(dur, reason, tmp_path, capsys):
    t = good()
    t.kernel("bad", 900, 1, launch=850)
    t.events[-2]["dur"] = dur  # the kernel (its launch is last)
    s = rank_trace(t.trace()).summary
    assert s["dropped_note"] == f"dropped 1 events: {reason}"
    assert s["window_ms"] == 0.7 and s["counts"]["compute"] == 2  # the window is the good kernels'
    path = tmp_path / "t.json"
    path.write_text(json.dumps(t.trace()))  # NaN written as JSON's NaN, as Python's json reads it
    assert main_trace([str(path)]) == 0
    assert f"  dropped 1 events: {reason}" in capsys.readouterr().out


def test_exact_duplicates_counted_once():
    t = good()
    t.events += copy.deepcopy(t.events[1:3])  # the first kernel and its launch, again
    s = rank_trace(t.trace()).summary
    assert s["dropped"] == {"duplicate": 2} and s["dropped_note"] == "dropped 2 events: exact duplicate 2"
    assert s["counts"]["compute"] == 2 and s["busy_ms"] == 0.6


def test_without_steps_long_kernels_are_kept():
    events = [{"ph": "X", "cat": "kernel", "name": "k", "ts": 0, "dur": 1e6, "pid": 0, "tid": 7}]
    assert clean(events) == (events, {})


def test_nothing_usable_is_one_line_and_exit_2(tmp_path, capsys):
    t = GpuTrace(0)
    t.kernel("k", 0, -1).kernel("k", 5, float("nan"))
    (tmp_path / "rank0.trace.json").write_text(json.dumps(t.trace()))
    assert main_trace([str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["ddptop trace: error: nothing usable: rank0.trace.json: dropped 2 events: "
                   "duration NaN or infinite 1, negative duration 1"]


@pytest.mark.parametrize("name", ["rank0.trace.json", "rank0.trace.json.gz"])
def test_empty_file_says_empty(name, tmp_path, capsys):
    path = tmp_path / name
    if name.endswith(".gz"):
        with gzip.open(path, "wb"):
            pass
    else:
        path.write_bytes(b"")
    assert main_trace([str(path)]) == 2
    assert capsys.readouterr().err.strip() == f"ddptop trace: error: {path}: empty (no trace was written)"


def test_capture_tab_says_what_was_dropped(tmp_path):
    from ddptop.analysis.capture import Capture
    from ddptop.run.trace_files import summarize_capture_traces
    from ddptop.tui.widgets.captures_panel import capture_lines

    t = good()
    t.events += copy.deepcopy(t.events[1:2])
    (tmp_path / "r0.json").write_text(json.dumps(t.trace()))
    summary = summarize_capture_traces({0: [str(tmp_path / "r0.json")]})
    shown = "\n".join(x.plain for x in capture_lines(Capture(1, 5, 1, "torch", str(tmp_path), "done",
                                                             summary=summary)))
    assert "      dropped 1 events: exact duplicate 1" in shown


def test_repeated_metadata_events_are_not_counted_as_dropped():
    # torch.profiler itself writes some thread_sort_index metadata twice: not the trace's fault
    meta = {"args": {"sort_index": 7}, "name": "thread_sort_index", "ph": "M", "pid": 1, "tid": 7, "ts": 5.0}
    kept, dropped = clean([meta, dict(meta), {"ph": "X", "name": "k", "ts": 1.0, "dur": 2.0, "pid": 1, "tid": 7}])
    assert dropped == {} and len(kept) == 3


def test_kernels_outlasting_their_host_step_are_kept():
    """A GPU kernel runs after the host range that launched it (issue 45): a `ProfilerStep#6` of
    20 us on the CPU that launched 25 ms of kernels and a 2.7 ms all-reduce (CUDA graphs, a
    host far ahead of its GPU) keeps every kernel and its comm; the 1e12-us kernel beside them
    is still dropped."""
    t = GpuTrace(0)
    t.cpu("ProfilerStep#6", 0, 20, cat="user_annotation")
    at = 30.0
    for i in range(10):  # 10 GEMMs of 2.23 ms, back to back, all launched inside the 20 us step
        t.kernel(f"gemm{i}", at, 2230, launch=1 + i)
        at += 2230
    t.allreduce(at, 2700, launch=15)
    s = rank_trace(t.trace()).summary
    assert "dropped" not in s
    assert s["counts"]["compute"] == 10 and s["comm_ms"] == 2.7 and s["source"] == "gpu"
    assert s["window_ms"] == pytest.approx(25.0, abs=0.01)
    t.kernel("bad", at + 2700, 1e12, launch=18)
    s = rank_trace(t.trace()).summary
    assert s["dropped"] == {"implausible": 1} and s["comm_ms"] == 2.7 and s["counts"]["compute"] == 10
