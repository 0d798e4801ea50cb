"""Captures HTA can use (issue 28.5): every profiled step is also a `ProfilerStep#N` range
(HTA's straggler and per-step analyses find steps by it) and `--set capture_memory=true`
records memory (torch.profiler's profile_memory: HTA's memory timeline). A real 2-rank gloo
run through the real socket."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys

from ddptop.model.config import RunConfig


def test_capture_memory_is_a_setting():
    assert RunConfig().capture_memory is False


def test_capture_has_profiler_step_markers_and_memory(tmp_path):
    cmd = [sys.executable, "-m", "ddptop", "--headless", "--json", "--runs-dir", str(tmp_path), "--nproc", "2",
           "--steps", "24", "--capture", "10:3", "--set", "workers=0", "--set", "capture_memory=true"]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=240)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    (cap,) = json.loads(res.stdout.strip().splitlines()[-1])["captures"]
    assert cap["status"] == "done"
    for rank in ("0", "1"):
        (path,) = cap["files"][rank]
        with gzip.open(path, "rt") as f:
            events = json.load(f)["traceEvents"]
        ranges = {e["name"]: e for e in events if e.get("ph") == "X" and e.get("cat") == "user_annotation"}
        for step in (10, 11, 12):
            outer, ours = ranges[f"ProfilerStep#{step}"], ranges[f"ddptop_step_{step}"]
            assert outer["ts"] <= ours["ts"] and ours["ts"] + ours["dur"] <= outer["ts"] + outer["dur"] + 1e-3
        assert any(e.get("name") == "[memory]" for e in events)  # profile_memory's allocation events
        assert cap["summary"]["ranks"][rank]["steps"] == [10, 11, 12]
    hta_steps(cap, tmp_path / "hta")
    assert "who waits" in subprocess.run([sys.executable, "-m", "ddptop", "trace", cap["dir"]], capture_output=True,
                                         text=True, timeout=60).stdout


def hta_steps(cap: dict, where) -> None:
    """HTA 0.5.0 reads the two ranks' traces and finds the window's steps (it leaves the last
    one out unless asked)."""
    import shutil
    import warnings

    import pytest
    pytest.importorskip("hta")
    from hta.trace_analysis import TraceAnalysis

    where.mkdir()
    for rank in ("0", "1"):
        shutil.copy(cap["files"][rank][0], where)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        steps = TraceAnalysis(trace_dir=str(where)).get_profiler_steps()
    assert [int(s) for s in steps] == [10, 11]
