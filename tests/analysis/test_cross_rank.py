"""Cross-rank view of a capture (ddptop.analysis.cross_rank): who waits for whom, aligned on
the collectives' common end, on synthetic 2-rank traces with known waits and on the real
2-rank gloo fixture."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from ddptop.analysis.cross_rank import Collective, cross_rank, match
from ddptop.analysis.rank_trace import capture_cross_rank, rank_trace
from tests.trace_builders import GpuTrace

FIXTURES = Path(__file__).parents[1] / "fixtures" / "traces"
# rank 1's NCCL kernels start 28.1, 38.0 and 24.0 ms before rank 0's (issue 28's capture);
# the transfers (rank 0's whole kernels) take 1.9, 2.0, 1.8 ms
EARLY_MS = (28.1, 38.0, 24.0)
TRANSFER_MS = (1.9, 2.0, 1.8)


def two_ranks(offset_us: float = 0.0) -> dict[int, dict]:
    """Rank 0 is late on every collective; rank 1's clock runs `offset_us` ahead (another host)."""
    r0, r1 = GpuTrace(0), GpuTrace(1)
    t = 100_000.0
    for early, transfer in zip(EARLY_MS, TRANSFER_MS, strict=True):
        r0.kernel("gemm", t - 50_000, 49_000).allreduce(t, transfer * 1000)
        r1.kernel("gemm", t - 80_000, 10_000).allreduce(t - early * 1000 + offset_us,
                                                         (early + transfer) * 1000)
        t += 120_000
    return {0: r0.trace(), 1: r1.trace()}


@pytest.mark.parametrize("offset_us", [0.0, 5_000.0, -123_456.7])
def test_known_waits_exact_and_late_rank_named(offset_us):
    view = capture_cross_rank({r: rank_trace(t) for r, t in two_ranks(offset_us).items()})
    assert view["collectives"] == 3 and view["unmatched"] == 0
    r0, r1 = view["ranks"]["0"], view["ranks"]["1"]
    assert r1["wait_ms"] == pytest.approx(90.1, abs=1e-6)
    assert r1["transfer_ms"] == pytest.approx(5.7, abs=1e-6)
    assert r0["wait_ms"] == 0.0 and r0["transfer_ms"] == pytest.approx(5.7, abs=1e-6)
    assert r1["wait_pct"] == 94.1  # 90.1 of 95.8 ms, as in the issue
    assert view["late_rank"] == 0 and view["late_ms"] == pytest.approx(90.1, abs=1e-6)
    assert view["late_max_ms"] == pytest.approx(38.0, abs=1e-6)
    assert [c["late_ms"] for c in view["per_collective"]] == pytest.approx(list(EARLY_MS))
    assert all(c["late_rank"] == 0 for c in view["per_collective"])
    assert view["ranks"]["0"]["late_in"] == 3 and view["ranks"]["1"]["late_in"] == 0
    assert view["end_spread_us"] == pytest.approx(0.0, abs=0.01)  # the ends agree once aligned
    assert view["verdict"] == "rank 0 is late: its peers wait 90.1 ms for it (3 of 3 collectives, up to 38.0 ms)"


def test_lateness_per_collective_can_change_sides():
    a = [Collective("0/allreduce", 0, 1000), Collective("0/allreduce", 5000, 5300)]
    b = [Collective("0/allreduce", 700, 1000), Collective("0/allreduce", 2000, 5300)]
    view = cross_rank({0: a, 1: b}, {0: 10, 1: 10})
    assert [c["late_rank"] for c in view["per_collective"]] == [1, 0]
    assert view["ranks"]["0"]["held_others_ms"] == pytest.approx(3.0)
    assert view["ranks"]["1"]["held_others_ms"] == pytest.approx(0.7)
    assert view["late_rank"] == 0 and view["ranks"]["0"]["wait_ms"] == pytest.approx(0.7)


def test_ties_name_nobody():
    a = [Collective("k", 0, 1000)]
    b = [Collective("k", 20, 1000)]  # 20 us apart: noise
    view = cross_rank({0: a, 1: b}, {0: 5, 1: 5})
    assert view["late_rank"] is None and view["per_collective"][0]["late_rank"] is None
    assert view["verdict"].startswith("no rank late")


def test_a_rank_that_recorded_an_extra_collective_still_matches():
    a = [Collective("k", 100, 200), Collective("k", 1000, 1500), Collective("k", 3000, 3100)]
    b = [Collective("k", 1400, 1500), Collective("k", 2900, 3100)]  # rank 1 started recording later
    matched, unmatched = match({0: a, 1: b})
    assert unmatched == 1
    assert [(m[0].end, m[1].end) for m in matched] == [(1500, 1500), (3100, 3100)]


def test_nearly_empty_trace_is_said():
    r0, r1 = GpuTrace(0), GpuTrace(1)
    for i in range(40):
        r0.kernel("gemm", i * 100.0, 50)
    r0.allreduce(5000, 100)
    r1.allreduce(5000, 100)
    view = capture_cross_rank({0: rank_trace(r0.trace()), 1: rank_trace(r1.trace())})
    assert view["notes"] == ["rank 1's trace is nearly empty: 1 GPU/CPU activities against 41 on the busiest "
                             "rank (1 collectives)"]


def test_no_common_collective():
    view = cross_rank({0: [Collective("a", 0, 1)], 1: [Collective("b", 0, 1)]}, {0: 1, 1: 1})
    assert view["collectives"] == 0 and "cannot say" in view["verdict"]


def test_real_gloo_capture_names_the_late_rank():
    """tests/fixtures/traces/cpu_gloo_2rank: gloo:all_reduce ops, 2 per rank. Rank 0's first
    lasts 10.33 ms, rank 1's 2.36 ms (rank 1 late by 7.96); the second 0.559 vs 16.20 ms
    (rank 0 late by 15.64)."""
    traces = {r: rank_trace(json.load(gzip.open(FIXTURES / "cpu_gloo_2rank" / f"rank{r}.trace.json.gz")))
              for r in (0, 1)}
    view = capture_cross_rank(traces)
    assert view["aligned_on"].startswith("the ends of the backend's")
    assert view["collectives"] == 2
    assert [c["late_rank"] for c in view["per_collective"]] == [1, 0]
    assert [c["late_ms"] for c in view["per_collective"]] == pytest.approx([7.963, 15.641], abs=0.002)
    assert view["late_rank"] == 0 and view["late_ms"] == pytest.approx(15.641, abs=0.002)


def test_capture_summary_trace_command_and_captures_tab_say_who_waits(tmp_path, capsys):
    from ddptop.analysis.capture import Capture
    from ddptop.commands.trace import main_trace
    from ddptop.run.trace_files import summarize_capture_traces
    from ddptop.tui.widgets.captures_panel import capture_lines

    for r, t in two_ranks().items():
        (tmp_path / f"rank{r}.trace.json").write_text(json.dumps(t))
    summary = summarize_capture_traces({r: [str(tmp_path / f"rank{r}.trace.json")] for r in (0, 1)})
    assert summary["cross_rank"]["late_rank"] == 0
    assert summary["cross_rank"]["ranks"]["1"]["wait_ms"] == pytest.approx(90.1)
    json.dumps(summary)  # summary.json
    verdict = "rank 0 is late: its peers wait 90.1 ms for it (3 of 3 collectives, up to 38.0 ms)"

    assert main_trace([str(tmp_path)]) == 0
    text = capsys.readouterr().out
    assert f"who waits: {verdict}" in text
    assert "r1 collectives 95.8 ms: waiting for peers 90.1 (94%), transfer 5.7" in text
    assert "late per collective: r0 28.1, r0 38.0, r0 24.0 ms" in text
    assert main_trace([str(tmp_path), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["cross_rank"]["late_rank"] == 0

    cap = Capture(1, 20, 3, "torch", str(tmp_path), status="done", summary=summary)
    shown = "\n".join(t.plain for t in capture_lines(cap))
    assert f"who waits {verdict}" in shown
    assert "r1 collectives 95.8 ms: waiting for peers 90.1 (94%)" in shown


@pytest.mark.parametrize("kept", [True, False])  # summary.json with the discount's inputs / an older one without
def test_trace_command_discounts_who_waits_as_the_capture_summary_does(tmp_path, capsys, kept):
    """Issue 45 on 4x H200: the capture's summary said `rank 0 late by 35.3 ms a step: within the
    profiler's own +36.1 ms`, while `ddptop trace DIR` on the same capture said `rank 0 is late`
    and put the profiled-vs-unprofiled line after every kernel table. The same capture reads the
    same in both, and the ratio comes before who-waits."""
    from ddptop.analysis.capture import discount_late
    from ddptop.commands.trace import main_trace
    from ddptop.run.trace_files import summarize_capture_traces

    for r, t in two_ranks().items():
        (tmp_path / f"rank{r}.trace.json").write_text(json.dumps(t))
    summary = summarize_capture_traces({r: [str(tmp_path / f"rank{r}.trace.json")] for r in (0, 1)})
    said = {"profiled_ms": 128.0, "unprofiled_ms": 93.0, "pct": 37.6, "ranks": 2, "warmup_steps": 1}
    summary["perturbation"] = said
    if kept:
        summary.update(window_steps=3, unprofiled_straggler=None)
    discount_late(summary["cross_rank"], said, 3, None)  # as the capture pipeline does
    verdict = summary["cross_rank"]["verdict"]
    assert verdict == "rank 0 late by 30.0 ms a step: within the profiler's own +35.0 ms a step; unprofiled, no straggler"
    (tmp_path / "summary.json").write_text(json.dumps(
        {"id": 1, "profiler": "torch", "status": "done", "steps": "20-22", "warmup": 1, "summary": summary}))

    assert main_trace([str(tmp_path)]) == 0
    text = capsys.readouterr().out
    assert f"who waits: {verdict}" in text and "rank 0 is late" not in text
    ratio = text.index("profiled steps 128.0 ms vs 93.0 ms unprofiled (+38%)")
    assert ratio < text.index("who waits:") < text.index("rank0.trace.json  (")
    assert main_trace([str(tmp_path), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["cross_rank"]["verdict"] == verdict


def test_trace_command_says_a_straggler_the_unprofiled_steps_show_too(tmp_path, capsys):
    from ddptop.commands.trace import main_trace
    from ddptop.run.trace_files import summarize_capture_traces

    for r, t in two_ranks().items():
        (tmp_path / f"rank{r}.trace.json").write_text(json.dumps(t))
    summary = summarize_capture_traces({r: [str(tmp_path / f"rank{r}.trace.json")] for r in (0, 1)})
    summary.update(perturbation={"profiled_ms": 128.0, "unprofiled_ms": 93.0, "pct": 37.6},
                   window_steps=3, unprofiled_straggler="rank 0 straggler: forward, costs the job 20.0 ms/step")
    (tmp_path / "summary.json").write_text(json.dumps({"id": 1, "steps": "20-22", "summary": summary}))
    assert main_trace([str(tmp_path)]) == 0
    text = capsys.readouterr().out
    assert ("who waits: rank 0 is late: its peers wait 90.1 ms for it (3 of 3 collectives, up to 38.0 ms); "
            "in the unprofiled steps too: rank 0 straggler: forward, costs the job 20.0 ms/step") in text
