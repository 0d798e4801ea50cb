"""bench/investigations/nccl_launch_gaps.py on a real 2x H200 trace (2026-11-26, tests/scripts/accum_ddp.py, the
rank its peer waits for): short all-reduce kernels whose NCCL span is mostly launch gap."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TRACE = ROOT / "tests" / "fixtures" / "traces" / "h200x2_accum_ddp_rank1.trace.json.gz"


def load():
    spec = importlib.util.spec_from_file_location("nccl_launch_gaps", ROOT / "bench" / "investigations" / "nccl_launch_gaps.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_short_kernels_on_an_idle_stream_start_a_launch_gap_after_nccls_start_event():
    mod = load()
    g = mod.gaps(mod.load(str(TRACE)))
    assert g["kernels"] == 6 and g["kernel_ms"] == pytest.approx(0.060, abs=0.002)
    assert g["idle_starts"] == 6 and 10 < g["gap_us_p50"] < 30  # each kernel ~10 us, its launch gap longer
    assert g["span_ms"] == pytest.approx(0.174, abs=0.005)  # ddptop's timer read 0.336 ms for these
    assert mod.main([]) == 2


def test_prints_one_line_a_trace(capsys):
    mod = load()
    assert mod.main([str(TRACE)]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    assert len(out) == 1 and out[0].startswith("h200x2_accum_ddp_rank1.trace.json.gz: 6 all-reduce kernels, 0.060 ms")
