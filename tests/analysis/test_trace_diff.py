"""`ddptop trace A B --diff` (ddptop.analysis.trace_diff): per rank, each kernel class and the
kernels that got faster or slower; on synthetic captures with known changes and on fixtures."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ddptop.commands.trace import main_trace
from ddptop.run.trace_files import summarize_files
from tests.trace_builders import GpuTrace

TRACES = Path(__file__).parents[1] / "fixtures" / "traces"


def capture(tmp_path: Path, name: str, gemm_us: float, nccl_us: float) -> str:
    out = tmp_path / name
    out.mkdir()
    for rank in (0, 1):
        t = GpuTrace(rank)
        t.kernel("gemm", 0, gemm_us).kernel("gemm", 2000, gemm_us).allreduce(4000, nccl_us)
        t.kernel("Memcpy DtoD", 5000, 50, cat="gpu_memcpy")
        (out / f"rank{rank}.trace.json").write_text(json.dumps(t.trace()))
    return str(out)


def test_known_changes(tmp_path, capsys):
    before, after = capture(tmp_path, "a", 1000, 500), capture(tmp_path, "b", 800, 700)
    assert main_trace([before, after, "--diff", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert set(d["ranks"]) == {"0", "1"} and "note" not in d
    row = d["ranks"]["1"]
    assert row["classes"]["compute"] == {"before_ms": 2.0, "after_ms": 1.6, "delta_ms": -0.4, "ratio": 0.8}
    assert row["classes"]["comm"] == {"before_ms": 0.5, "after_ms": 0.7, "delta_ms": 0.2, "ratio": 1.4}
    assert row["classes"]["memory"]["delta_ms"] == 0.0
    gemm, nccl, memcpy = row["kernels"]
    assert (gemm["name"], gemm["verdict"], gemm["delta_ms"], gemm["count"]) == ("gemm", "faster", -0.4, [2, 2])
    assert (nccl["verdict"], nccl["delta_ms"], nccl["kind"]) == ("slower", 0.2, "comm")
    assert memcpy["verdict"] == "same"
    assert main_trace([before, after, "--diff"]) == 0
    text = capsys.readouterr().out
    assert "  compute       2.000 ->      1.600 ms      -0.400 (x0.800)" in text
    assert "  faster     -0.400 ms  2.000 -> 1.600 (x2 -> x2, compute)  gemm" in text


def test_two_fixture_captures(capsys):
    """The real 2-rank gloo capture against the hand-made GPU trace: rank 0 compared (their
    own summaries' differences), rank 1 named as only in the first."""
    a, b = TRACES / "cpu_gloo_2rank", TRACES / "handmade"
    assert main_trace([str(a), str(b), "--diff", "--json", "--top", "50"]) == 0
    d = json.loads(capsys.readouterr().out)
    (x, _), (y,) = summarize_files([str(a)], top=1000), summarize_files([str(b)], top=1000)
    row = d["ranks"]["0"]
    for k in ("window", "compute", "comm", "idle"):
        assert row["classes"][k]["delta_ms"] == pytest.approx(y[f"{k}_ms"] - x[f"{k}_ms"], abs=1e-3)
    assert row["classes"]["memory"] == {"before_ms": None, "after_ms": 0.06}  # CPU trace: no memory class
    first = row["kernels"][0]
    assert (first["name"], first["verdict"]) == ("gloo:all_reduce", "faster")
    assert d["note"] == "only in one capture: rank 1 (before)"


def test_same_capture_twice_changes_nothing(capsys):
    h100 = TRACES / "h100_one_rank"
    assert main_trace([str(h100), str(h100), "--diff", "--json"]) == 0
    row = json.loads(capsys.readouterr().out)["ranks"]["0"]
    assert all(c["delta_ms"] == 0.0 for c in row["classes"].values())
    assert {c["verdict"] for c in row["kernels"]} == {"same"}


def test_diff_needs_two_captures(capsys):
    assert main_trace([str(TRACES / "handmade"), "--diff"]) == 2
    assert capsys.readouterr().err.strip() == "ddptop trace: error: --diff compares two captures A B, got 1 paths"
