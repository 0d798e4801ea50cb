import json
import subprocess
import sys
from pathlib import Path

import pytest

from ddptop.capture import intersection_length, parse_capture_spec, summarize_trace, union_length


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
    assert s["source"] == "gpu kernels" and s["steps"] == [10, 11] and s["step_ms"] == [100.0, 90.0]
    assert s["comm_ms"] == 30.0 and s["compute_ms"] == 70.0 and s["overlap_ms"] == 10.0
    assert s["top"][0]["name"] == "sm90_xmma_gemm_bf16"


@pytest.mark.e2e
def test_headless_capture_window_on_cpu(tmp_path):
    cmd = [sys.executable, "-m", "ddptop", "--headless", "--json", "--runs-dir", str(tmp_path), "--nproc", "2",
           "--steps", "40", "--capture", "10:3", "--set", "workers=0"]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=240)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    summary = json.loads(res.stdout.strip().splitlines()[-1])
    (cap,) = summary["captures"]
    assert cap["status"] == "done" and cap["steps"] == "10-12" and cap["profiler"] == "torch"
    assert sorted(cap["files"]) == ["0", "1"]
    for rank in ("0", "1"):
        (path,) = cap["files"][rank]
        trace = json.loads(open(path).read())  # valid Chrome trace JSON
        assert trace["traceEvents"]
        per_rank = cap["summary"]["ranks"][rank]
        assert per_rank["steps"] == [10, 11, 12]
        assert per_rank["comm_ms"] > 0
        assert per_rank["timer_steps"] == 3 and per_rank["timer_comm_ms"] > 0  # ddptop's timer, same steps
    assert "capture 1 steps 10-12 (torch): done" in res.stdout
    steps = [json.loads(line) for line in (tmp_path / summary["run_id"] / "steps.jsonl").read_text().splitlines()]
    profiled = {(r["rank"], r["step"]) for r in steps if r.get("profiled")}
    assert profiled == {(rank, s) for rank in (0, 1) for s in (10, 11, 12, 13)}  # window + the step after


def test_timer_is_compared_with_the_trace_on_the_same_steps():
    from ddptop.capture import compare_with_timer

    summary = {"ranks": {"0": {"comm_ms": 30.0}, "1": {"comm_ms": 20.0}, "2": {"note": "nsys"}}}
    recs = {
        0: [{"step": s, "comm_ms": 11.0} for s in range(8, 15)],  # only 10-12 count
        1: [{"step": 10, "comm_ms": 8.0}, {"step": 11, "comm_ms": 8.0}, {"step": 12}],
        2: [{"step": 10, "comm_ms": 1.0}],
    }
    compare_with_timer(summary, recs, range(10, 13))
    r0, r1 = summary["ranks"]["0"], summary["ranks"]["1"]
    assert r0["timer_comm_ms"] == 33.0 and r0["timer_steps"] == 3 and r0["timer_vs_trace"] == 1.1
    assert r1["timer_comm_ms"] == 16.0 and r1["timer_steps"] == 2 and r1["timer_vs_trace"] == 0.8
    assert summary["ranks"]["2"] == {"note": "nsys", "timer_comm_ms": 1.0, "timer_steps": 1}
    assert summary["timer_vs_trace_mean"] == 0.95


def test_nsys_outputs_are_grouped_by_rank(tmp_path):
    from pathlib import Path

    from ddptop.capture import nsys_files_by_rank

    paths = [Path("/c/nsys_rank0.qdstrm"), Path("/c/nsys_rank1.qdstrm"), Path("/c/nsys_rank10.1.nsys-rep"),
             Path("/c/other.txt")]
    assert nsys_files_by_rank(paths) == {0: ["/c/nsys_rank0.qdstrm"], 1: ["/c/nsys_rank1.qdstrm"],
                                         10: ["/c/nsys_rank10.1.nsys-rep"]}


def test_a_stall_at_an_nsys_window_is_put_down_to_nsys():
    from ddptop.capture import Capture, nsys_window_at

    caps = [Capture(1, 12, 2, "torch", "/c/1"), Capture(2, 30, 2, "nsys", "/c/2")]
    assert nsys_window_at(caps, 29).capture_id == 2  # cudaProfilerStart before step 30
    assert nsys_window_at(caps, 30).capture_id == 2  # inside the window
    # stopped after step 31 (its record waits for cudaProfilerStop): nsys is writing; once
    # step 31 is reported the ranks are past the window
    assert nsys_window_at(caps, 31) is None and nsys_window_at(caps, 12) is None  # torch windows too


def test_one_rank_nccl_kernel_counts_as_communication_and_gz_traces_read():
    """H100, DDP on one GPU: NCCL's all-reduce kernel is `...onerank...` (no "nccl" in its
    name) but carries 'Collective name'; a GEMM with "Broadcast" in its name is compute."""
    from ddptop.capture import is_comm, read_trace, summarize_trace

    path = Path(__file__).parent / "fixtures" / "traces" / "h100_ddp1_vit_l_32_steps20-22_rank0.trace.json.gz"
    s = summarize_trace(read_trace(str(path)))
    assert s["steps"] == [20, 21, 22]
    assert s["comm_ms"] == pytest.approx(3.045, abs=0.01)
    gemm = {"cat": "kernel", "name": "sm90_xmma_gemm_GemmWithEpilogueBroadcast_bf16", "args": {}}
    assert not is_comm(gemm)
    assert is_comm({"cat": "kernel", "name": "ncclDevKernel_AllReduce_Sum_f32_RING_LL", "args": {}})
