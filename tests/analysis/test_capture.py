import asyncio
import gzip
import json
import subprocess
import sys
from pathlib import Path

import pytest

from ddptop.analysis.capture import (
    intersection_length,
    parse_capture_spec,
    summarize_trace,
    union_length,
)


def test_parse_capture_spec():
    assert parse_capture_spec("10:3", 40) == (10, 3)
    for bad in ("10", "a:3", "10:0", "39:5", "-1:2"):
        with pytest.raises(ValueError):
            parse_capture_spec(bad, 40)


def test_interval_arithmetic():
    assert union_length([(0, 10), (5, 15), (20, 25)]) == 20
    assert intersection_length([(0, 10), (20, 30)], [(5, 25)]) == 10


def test_gpu_trace_summary_separates_nccl_kernels_and_overlap():
    k = lambda name, ts, dur: {"ph": "X", "cat": "kernel", "name": name, "ts": ts, "dur": dur}  # noqa: E731
    trace = {"traceEvents": [
        {"ph": "X", "cat": "user_annotation", "name": "ddptop_step_10", "ts": 0, "dur": 100_000},
        {"ph": "X", "cat": "user_annotation", "name": "ddptop_step_11", "ts": 100_000, "dur": 90_000},
        k("sm90_xmma_gemm_bf16", 0, 60_000),
        k("ncclDevKernel_AllReduce_Sum_f32_RING_LL", 50_000, 30_000),  # 10 ms under the gemm
        k("elementwise_kernel", 120_000, 10_000),
    ]}
    s = summarize_trace(trace)
    assert s["source"] == "gpu" and s["steps"] == [10, 11] and s["step_ms"] == [100.0, 90.0]
    assert s["comm_ms"] == 30.0 and s["compute_ms"] == 70.0 and s["overlap_ms"] == 10.0
    assert s["window_ms"] == 130.0 and s["idle_ms"] == 40.0 and s["memory_ms"] == 0.0
    assert s["top"][0]["name"] == "sm90_xmma_gemm_bf16" and s["comm_by"] == {"name": 1}


@pytest.mark.e2e
def test_headless_capture_window_on_cpu(tmp_path):
    cmd = [sys.executable, "-m", "ddptop", "--headless", "--json", "--runs-dir", str(tmp_path), "--nproc", "2",
           "--steps", "40", "--capture", "10:3", "--set", "workers=0", "--set", "gloo_timing=true"]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=240)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    summary = json.loads(res.stdout.strip().splitlines()[-1])
    (cap,) = summary["captures"]
    assert cap["status"] == "done" and cap["steps"] == "10-12" and cap["profiler"] == "torch"
    assert sorted(cap["files"]) == ["0", "1"]
    for rank in ("0", "1"):
        (path,) = cap["files"][rank]
        assert path.endswith(f"rank{rank}.trace.json.gz")
        with gzip.open(path, "rt") as f:
            trace = json.load(f)  # valid Chrome trace JSON, gzipped
        assert trace["traceEvents"]
        per_rank = cap["summary"]["ranks"][rank]
        assert per_rank["steps"] == [10, 11, 12] and per_rank["source"] == "cpu"
        assert per_rank["comm_ms"] > 0 and per_rank["comm_by"].get("annotation", 0) >= 3  # gloo:all_reduce
        assert per_rank["window_ms"] >= per_rank["busy_ms"] > per_rank["comm_ms"]
        assert per_rank["timer_steps"] == 3 and per_rank["timer_comm_ms"] > 0  # ddptop's timer, same steps
    assert "ui.perfetto.dev" in cap["summary"]["open_with"]
    # the same capture through `ddptop trace`
    tr = subprocess.run([sys.executable, "-m", "ddptop", "trace", "--json", cap["dir"]], capture_output=True,
                        text=True, timeout=60)
    assert tr.returncode == 0, tr.stderr
    traces = json.loads(tr.stdout)["traces"]
    assert [t["rank"] for t in traces] == [0, 1]
    assert [t["comm_ms"] for t in traces] == [cap["summary"]["ranks"][r]["comm_ms"] for r in ("0", "1")]
    assert "capture 1 steps 10-12 (torch): done" in res.stdout
    steps = [json.loads(line) for line in (tmp_path / summary["run_id"] / "steps.jsonl").read_text().splitlines()]
    profiled = {(r["rank"], r["step"]) for r in steps if r.get("profiled")}
    # the profiler's warmup step, the window, and the step after it (issue 45: start-up out of the window)
    assert profiled == {(rank, s) for rank in (0, 1) for s in (9, 10, 11, 12, 13)}
    assert cap["warmup"] == 1
    said = cap["summary"]["perturbation"]
    assert said["ranks"] == 2 and said["profiled_ms"] > 0 and said["unprofiled_ms"] > 0 and said["warmup_steps"] == 1
    assert "  profiled steps " in res.stdout and "warmed up 1 step(s) before recording" in res.stdout
    assert json.loads(tr.stdout)["perturbation"][cap["dir"]]["profiled_ms"] == said["profiled_ms"]
    # what who-waits was discounted with, kept for `ddptop trace DIR` (issue 45)
    assert cap["summary"]["window_steps"] == 3 and "unprofiled_straggler" in cap["summary"]
    assert json.loads(tr.stdout)["cross_rank"]["verdict"] == cap["summary"]["cross_rank"]["verdict"]


def test_timer_is_compared_with_the_trace_on_the_same_steps():
    from ddptop.analysis.capture import compare_with_timer

    # rank 0's trace also holds a collective of the script's own (HF's token count all_gather)
    summary = {"ranks": {"0": {"comm_ms": 35.0, "allreduce_ms": 30.0, "comm_call_ms": 33.0}, "1": {"comm_ms": 20.0},
                         "2": {"note": "nsys"}}}
    recs = {
        0: [{"step": s, "comm_ms": 11.0} for s in range(8, 15)],  # only 10-12 count
        1: [{"step": 10, "comm_ms": 8.0}, {"step": 11, "comm_ms": 8.0}, {"step": 12}],
        2: [{"step": 10, "comm_ms": 1.0}],
    }
    compare_with_timer(summary, recs, range(10, 13))
    r0, r1 = summary["ranks"]["0"], summary["ranks"]["1"]
    assert r0["timer_comm_ms"] == 33.0 and r0["timer_steps"] == 3 and r0["timer_vs_trace"] == 1.1
    assert r0["other_comm_ms"] == 5.0  # compared with the all-reduces only: what the timer times
    # 2 of 3 steps timed: no ratio (it would read 0.8 of a trace of 3 steps)
    assert r1["timer_comm_ms"] == 16.0 and r1["timer_steps"] == 2 and "timer_vs_trace" not in r1
    assert r0["timer_vs_call"] == 1.0 and "timer_vs_call" not in r1 and summary["timer_vs_call_mean"] == 1.0
    assert summary["ranks"]["2"] == {"note": "nsys", "timer_comm_ms": 1.0, "timer_steps": 1}
    assert summary["timer_vs_trace_mean"] == 1.1


def test_nsys_outputs_are_grouped_by_rank(tmp_path):
    from pathlib import Path

    from ddptop.analysis.capture import nsys_files_by_rank

    paths = [Path("/c/nsys_rank0.qdstrm"), Path("/c/nsys_rank1.qdstrm"), Path("/c/nsys_rank10.1.nsys-rep"),
             Path("/c/other.txt")]
    assert nsys_files_by_rank(paths) == {0: ["/c/nsys_rank0.qdstrm"], 1: ["/c/nsys_rank1.qdstrm"],
                                         10: ["/c/nsys_rank10.1.nsys-rep"]}


def test_a_stall_at_an_nsys_window_is_put_down_to_nsys():
    from ddptop.analysis.capture import Capture, nsys_window_at

    caps = [Capture(1, 12, 2, "torch", "/c/1"), Capture(2, 30, 2, "nsys", "/c/2")]
    assert nsys_window_at(caps, 29).capture_id == 2  # cudaProfilerStart before step 30
    assert nsys_window_at(caps, 30).capture_id == 2  # inside the window
    # stopped after step 31 (its record waits for cudaProfilerStop): nsys is writing; once
    # step 31 is reported the ranks are past the window
    assert nsys_window_at(caps, 31) is None and nsys_window_at(caps, 12) is None  # torch windows too


def test_one_rank_nccl_kernel_counts_as_communication_and_gz_traces_read(tmp_path):
    """H100, DDP on one GPU: NCCL's all-reduce kernel is `...onerank...` (no "nccl" in its
    name) but carries 'Collective name'; a GEMM with "Broadcast" in its name is compute; a
    rank whose trace cannot be read is named, the others summarised."""
    from ddptop.run.nsys import summarize_capture

    path = Path(__file__).parents[1] / "fixtures" / "traces" / "h100_one_rank" / "rank0.trace.json.gz"
    bad = tmp_path / "rank1.trace.json.gz"
    bad.write_bytes(path.read_bytes()[:1000])
    s = summarize_capture({0: [str(path)], 1: [str(bad)], 2: ["/c/nsys_rank2.qdstrm"]})
    r0 = s["ranks"]["0"]
    assert r0["steps"] == [20, 21, 22] and r0["file"] == str(path)
    assert r0["comm_ms"] == pytest.approx(3.045, abs=0.001) and r0["comm_by"] == {"args": 3}
    assert s["ranks"]["1"]["error"].startswith(f"cannot read {bad}: truncated or corrupt gzip")
    assert "nsys" in s["ranks"]["2"]["note"] and s["comm_ms_mean"] == r0["comm_ms"]
    k = lambda name, ts, args=None: {"ph": "X", "cat": "kernel", "name": name, "ts": ts, "dur": 10,  # noqa: E731
                                     "args": args or {}}
    g = summarize_trace({"traceEvents": [k("sm90_xmma_gemm_GemmWithEpilogueBroadcast_bf16", 0),
                                         k("ncclDevKernel_AllReduce_Sum_f32_RING_LL", 20),
                                         k("broadcast_elementwise", 40, {"Collective name": "broadcast"})]})
    assert g["compute_ms"] == 0.01 and g["comm_ms"] == 0.02 and g["comm_by"] == {"name": 1, "args": 1}


def test_a_tui_run_gets_the_capture_options_of_its_command_line(monkeypatch, tmp_path):
    """--capture/--profiler reach the TUI's runs (they used to be validated, then dropped)."""
    from ddptop import cli
    from ddptop.tui import factory as tui_factory

    got = {}

    def fake_run_tui(config, runs_dir, user_cmd=None, capture=None):
        got["capture"] = capture
        return 0

    monkeypatch.setattr(tui_factory, "run_tui", fake_run_tui)
    monkeypatch.setattr(sys.stdout, "isatty", lambda: True)
    code = cli.main(["--runs-dir", str(tmp_path), "--nproc", "2", "--steps", "40", "--capture", "10:3",
                     "--profiler", "torch"])
    assert code == 0
    assert got["capture"].windows == [(10, 3)] and got["capture"].profiler == "torch"


@pytest.mark.e2e
def test_capture_window_of_a_tui_run_and_its_summary_on_disk_says_done(tmp_path):
    """A TUI run (through its supervisor, as the CLI starts it) records the --capture
    window; captures/<n>/summary.json says done, not processing."""
    from test_tui import START_TIMEOUT, cpu_config, wait_for

    from ddptop.model.options import CaptureOptions
    from ddptop.tui.factory import build_app
    from ddptop.tui.messages import RunEnded

    seen = []

    async def main():
        app = build_app(cpu_config(steps=14), tmp_path, capture=CaptureOptions(windows=[(6, 2)]))
        async with app.run_test(size=(120, 40), message_hook=seen.append) as pilot:
            session = app.workbench.current
            await wait_for(pilot, lambda: any(isinstance(m, RunEnded) for m in seen), START_TIMEOUT + 60,
                           "the run to end")
            await pilot.pause(0.2)  # the app handles its RunEnded before it is torn down
            return session.state, session.run_dir

    state, run_dir = asyncio.run(main())
    assert state.status == "completed", state.error
    cap = state.captures[1]
    assert (cap.status, cap.steps, cap.profiler) == ("done", "6-7", "torch"), cap.error
    on_disk = json.loads((run_dir / "captures" / "1" / "summary.json").read_text())
    assert on_disk["status"] == "done" and on_disk["steps"] == "6-7"


def test_the_trace_side_of_the_comparison_is_its_all_reduces():
    """HF's Trainer all-gathers its token count every step, on the same NCCL stream: ddptop's
    timer times all-reduces, so the trace's figure it is compared with is theirs alone."""
    sys.path.insert(0, str(Path(__file__).parents[1]))
    from trace_builders import GpuTrace

    from ddptop.analysis.rank_trace import rank_trace

    t = GpuTrace(0)
    t.kernel("gemm", 0, 5000)
    t.kernel("ncclDevKernel_AllGather_RING_LL", 5000, 3000, stream=20, **{"Collective name": "_allgather_base"})
    t.allreduce(8000, 1000).allreduce(9500, 1500)
    s = rank_trace(t.trace()).summary
    assert s["comm_ms"] == pytest.approx(5.5) and s["allreduce_ms"] == pytest.approx(2.5)


def test_perturbation_compares_the_window_with_the_unprofiled_steps_before_it():
    from ddptop.analysis.capture import perturbation

    def recs(window_ms, before_ms):
        out = [{"step": s, "step_ms": before_ms} for s in range(0, 19)]
        out.append({"step": 19, "step_ms": 500.0, "profiled": 1})  # the warmup step: CUPTI's start-up
        out += [{"step": s, "step_ms": window_ms, "profiled": 1} for s in (20, 21, 22)]
        return out

    said = perturbation({0: recs(128.0, 93.0), 1: recs(130.0, 95.0)}, range(20, 23), warmup=1)
    assert said == {"profiled_ms": 129.0, "unprofiled_ms": 94.0, "pct": 37.2, "ranks": 2, "warmup_steps": 1}
    from ddptop.model.capture import perturbation_line
    assert perturbation_line(said) == "profiled steps 129.0 ms vs 94.0 ms unprofiled (+37%)"
    assert perturbation({0: recs(1.0, 1.0)[:19]}, range(20, 23)) is None  # no window steps reported


def test_a_straggler_the_profiler_made_is_said_so_not_named():
    from ddptop.analysis.capture import discount_late

    said = {"profiled_ms": 128.0, "unprofiled_ms": 93.0}
    cross = {"late_rank": 0, "late_ms": 105.0, "verdict": "rank 0 is late: its peers wait 105.0 ms for it"}
    discount_late(cross, said, steps=3, unprofiled=None)
    assert cross["verdict"] == ("rank 0 late by 35.0 ms a step: within the profiler's own +35.0 ms a step; "
                                "unprofiled, no straggler") and cross["profiler_made"]
    real = {"late_rank": 1, "late_ms": 105.0, "verdict": "rank 1 is late"}
    discount_late(real, said, steps=3, unprofiled="rank 1 straggler: forward +30.0 ms/step")
    assert real["verdict"] == "rank 1 is late; in the unprofiled steps too: rank 1 straggler: forward +30.0 ms/step"
    more = {"late_rank": 1, "late_ms": 300.0, "verdict": "rank 1 is late"}
    discount_late(more, said, steps=3, unprofiled=None)
    assert "more than the profiler's own +35.0" in more["verdict"] and "profiler_made" not in more
    none = {"late_rank": None, "verdict": "no rank late"}
    discount_late(none, said, 3, None)
    assert none["verdict"] == "no rank late"


def test_the_captures_tab_says_how_much_the_profiler_slowed_the_steps_and_the_warmup():
    """Issue 45: a capture's profiled steps against the unprofiled ones, and the warmup step
    recorded before them, on the captures tab (the summary and `ddptop trace` say it too)."""
    from ddptop.analysis.capture import Capture
    from ddptop.tui.widgets.captures_panel import capture_lines

    said = {"profiled_ms": 129.0, "unprofiled_ms": 94.0, "pct": 37.2, "ranks": 2, "warmup_steps": 1}
    summary = {"ranks": {"0": {"comm_ms": 1.0}}, "comm_ms_mean": 1.0, "perturbation": said}
    cap = Capture(1, 20, 3, "torch", "/tmp/cap1", status="done", summary=summary, warmup=1)
    shown = [t.plain for t in capture_lines(cap)]
    assert ("    profiler profiled steps 129.0 ms vs 94.0 ms unprofiled (+37%); "
            "warmed up 1 step(s) before recording") in shown, shown
