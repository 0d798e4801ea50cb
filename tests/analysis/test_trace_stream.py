"""Trace summaries streamed and in a child process (issue 28.6): the streamed summary is the
whole-read one, the child answers what the monitor used to compute itself, every failure is
one line, and a 200 MB trace is summarised in at most 400 MB."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from ddptop.analysis.rank_trace import rank_trace
from ddptop.run.trace_files import (
    TraceError,
    read_rank_trace,
    read_trace,
    streamed_rank_trace,
    summarize_capture_traces,
    summarize_traces,
)
from ddptop.run.trace_job import _answer, run_job, summarize_capture
from tests.trace_big import write_big_trace
from tests.trace_builders import GpuTrace

TRACES = Path(__file__).parents[1] / "fixtures" / "traces"
FILES = sorted(p for p in TRACES.glob("*/*") if p.name.endswith((".json", ".json.gz")))
GLOO = {r: [str(TRACES / "cpu_gloo_2rank" / f"rank{r}.trace.json.gz")] for r in (0, 1)}


@pytest.mark.parametrize("path", FILES, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_streamed_summary_is_the_whole_read_one(path):
    streamed = streamed_rank_trace(path, top=1000)
    whole = rank_trace(read_trace(path), top=1000)
    assert streamed is not None  # it really streamed
    assert streamed == whole


def test_what_the_streamed_parser_refuses_is_read_whole(tmp_path):
    t = GpuTrace(1)
    t.cpu("ProfilerStep#5", 0, 1000, cat="user_annotation")
    t.kernel("gemm", 100, 300, launch=50).kernel("bad", 500, 1, launch=450)
    t.events[-2]["dur"] = float("nan")  # JSON's NaN: Python's json reads it, ijson does not
    path = tmp_path / "nan.json"
    path.write_text(json.dumps(t.trace()))
    assert streamed_rank_trace(path) is None
    view = read_rank_trace(path)
    assert view == rank_trace(t.trace())
    assert view.summary["dropped_note"] == "dropped 1 events: duration NaN or infinite 1"
    assert view.summary["rank"] == 1  # distributedInfo read either way
    bare = tmp_path / "bare.json"
    bare.write_text(json.dumps(t.trace()["traceEvents"][:3]))
    assert streamed_rank_trace(bare) == rank_trace(read_trace(bare))


def test_the_child_answers_what_the_monitor_computed_itself():
    assert asyncio.run(summarize_capture(GLOO)) == summarize_capture_traces(GLOO)
    (summaries, cross), _ = asyncio.run(run_job({"op": "traces", "paths": [str(TRACES / "h100_one_rank")],
                                                 "top": 5}))
    assert (summaries, cross) == summarize_traces([str(TRACES / "h100_one_rank")], top=5)


def test_child_failures_are_one_line(tmp_path):
    (tmp_path / "empty.json").write_text("")
    with pytest.raises(TraceError, match=r"^/.*/missing: no such file or directory$"):
        asyncio.run(run_job({"op": "traces", "paths": [str(tmp_path / "missing")]}))
    summary = asyncio.run(summarize_capture({0: [str(tmp_path / "empty.json")]}))
    assert summary["ranks"]["0"]["error"].endswith("empty (no trace was written)")
    with pytest.raises(TraceError, match=r"^trace summary process killed by SIGKILL \(out of memory\?\)$"):
        _answer(-9, b"", b"")
    with pytest.raises(TraceError, match=r"^trace summary process failed: boom$"):
        _answer(1, b"", b"Traceback (most recent call last):\nboom\n")


def test_a_child_out_of_memory_says_so_in_one_line(tmp_path):
    path = tmp_path / "big.json"
    write_big_trace(path, 20)  # ~55 MB to summarise; Python itself takes ~30 MB of address space
    with pytest.raises(TraceError) as err:
        asyncio.run(run_job({"op": "capture", "files": {"0": [str(path)]}, "memory_mb": 40}))
    assert str(err.value) == ("ran out of memory (limit 40 MB: 256 + 10x the traces' size, at most "
                              "DDPTOP_TRACE_MEMORY_MB)")


@pytest.mark.slow  # ~20 s: writing and summarising 200 MB
def test_a_200_mb_trace_is_summarised_in_at_most_400_mb(tmp_path):
    path = tmp_path / "big.json"
    expect = write_big_trace(path, 200)
    assert path.stat().st_size >= 200e6
    result, peak_mb = asyncio.run(run_job({"op": "capture", "files": {"0": [str(path)]}}))
    s = result["ranks"]["0"]
    assert (len(s["steps"]), s["counts"]["compute"], s["counts"]["comm"]) == (
        expect["steps"], expect["compute"], expect["comm"])
    assert s["window_ms"] == expect["window_ms"] and s["comm_ms"] == expect["comm_ms"]
    print(f"200 MB trace: child peak RSS {peak_mb} MB")
    assert peak_mb is not None and peak_mb <= 400


def test_the_jobs_peak_memory_is_its_own_not_its_parents() -> None:
    """ru_maxrss keeps the parent's RSS at the fork across the exec: the slow 200 MB test read
    572 MB beside a worker that had imported torch, 282 MB alone. The job reads its own VmHWM."""
    import subprocess
    import sys

    held = bytearray(300 << 20)
    held[::4096] = b"\x01" * len(held[::4096])  # touched: resident in this (the parent) process
    code = "from ddptop.run.trace_job import _peak_mb; print(_peak_mb())"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert float(out.stdout) < 250, out.stdout  # a Python that imported ddptop's trace job, not 300 MB more
    del held
