"""Repeated runs as one figure (issue 47): the interleaved order, the interval across runs, the
speedup's interval; the recommendation over such rows names ties and is never beaten beyond
the intervals by a lossless preset; the advisor's expectations before a sweep, scored."""

import random

import pytest

from ddptop.analysis.across_runs import across_interval, ratio_interval, rounds
from ddptop.analysis.advisor import recommend_from_sweep
from ddptop.analysis.sweep_advice import beats, measured, reference
from ddptop.analysis.sweep_expect import (
    Expectation,
    expectations,
    expected_path,
    score,
    score_lines,
)
from ddptop.model.config import RunConfig, preset_config


def test_rounds_interleave_every_preset_and_reverse_every_other_round():
    assert rounds(3, 3) == [(1, 0), (1, 1), (1, 2), (2, 2), (2, 1), (2, 0), (3, 0), (3, 1), (3, 2)]
    assert rounds(2, 1) == [(1, 0), (1, 1)]  # --repeat 1: the sweep as it always ran


def test_interval_across_runs_is_t_over_the_runs_and_never_narrower_than_per_step():
    lo, hi = across_interval([10.0, 11.0, 12.0])
    assert (lo + hi) / 2 == pytest.approx(11.0)
    assert (hi - lo) / 2 == pytest.approx(4.303 * 1.0 / 3 ** 0.5, rel=1e-3)  # t(2 df) * sd / sqrt(n)
    # three runs that agree by chance: each run's per-step interval (+-5) still bounds the mean's
    lo, hi = across_interval([11.0, 11.0, 11.0], [(6.0, 16.0)] * 3)
    assert (hi - lo) / 2 == pytest.approx((3 * 25) ** 0.5 / 3)
    assert across_interval([11.0]) is None


@pytest.mark.parametrize(("a", "b"), [((12.0, 13.0), (10.0, 11.0)), ((10.5, 13.0), (10.0, 11.0)),
                                      ((9.0, 10.0), (10.5, 11.0))])
def test_speedup_interval_clears_one_exactly_when_the_intervals_are_apart(a, b):
    lo, hi = ratio_interval(a, b)
    assert lo <= (sum(a) / 2) / (sum(b) / 2) <= hi
    assert (lo > 1) == (a[0] > b[1])


def row(preset, rate, ci, runs=3):
    return {"preset": preset, "status": "completed", "steps_per_s": rate, "steps_per_s_ci": ci, "runs": runs}


def test_overlapping_lossless_presets_are_tied_not_ranked():
    rows = [row("baseline", 10.0, (9.6, 10.4)), row("overlap", 12.0, (11.2, 12.8)),
            row("static", 11.8, (11.0, 12.6)), row("view", 10.1, (9.8, 10.4))]
    advice = recommend_from_sweep(rows)
    assert advice.preset == "overlap"
    assert "overlap and static tie as the fastest lossless configurations" in advice.reason
    assert "neither beats the other beyond noise" in advice.reason and "is the fastest" not in advice.reason
    assert "interval across its runs" in advice.reason  # says which interval it judged by
    # apart: one pick, no tie
    rows[2] = row("static", 10.9, (10.5, 11.1))
    advice = recommend_from_sweep(rows)
    assert advice.reason.startswith("overlap is the fastest lossless configuration") and "tie" not in advice.reason


def test_recommendation_is_never_beaten_beyond_the_intervals_by_a_lossless_preset():
    rng = random.Random(47)
    presets = ["baseline", "static", "view", "overlap", "bf16", "bf16-overlap", "powersgd", "amp"]
    for _ in range(500):
        rows = []
        for p in presets:
            rate = rng.uniform(5, 15)
            half = rng.uniform(0.05, 2.0)
            rows.append(row(p, rate, (rate - half, rate + half)))
        advice = recommend_from_sweep(rows)
        done = measured(rows)
        ref = reference(done)
        pick = next(m for m in done if m.preset == advice.preset)
        lossless = [m for m in done if not m.lossy and m is not ref and beats(m, ref)]
        best = max(lossless, key=lambda m: m.rate, default=None)
        for m in done:
            if not m.lossy:
                assert not beats(m, pick), (m, pick, advice.reason)
            if m is not pick and m is not ref and m.lossy == pick.lossy and pick is not ref \
                    and not beats(pick, m):  # the table cannot rank them: the advice says so
                assert "tie" in advice.reason and m.name in advice.reason.split("):")[0], advice.reason
            if pick.lossy and best is not None and m is not best and m is not ref and not m.lossy \
                    and not beats(best, m):  # the fastest lossless named beside a lossy pick: its ties too
                assert "tied with" in advice.reason and f"{m.name} (" in advice.reason, advice.reason



def test_expected_path_from_links_and_environment():
    assert expected_path("auto", 4, {"nvlink"}, {}) == "nvlink"
    assert expected_path("auto", 4, {"nvlink"}, {"NCCL_P2P_DISABLE": "1"}) == "shm"
    assert expected_path("auto", 2, {"pcie-host"}, {}) == "pcie-p2p"
    assert expected_path("gloo", 2, {"nvlink"}, {}) is None  # gloo: the path cannot be foreseen
    assert expected_path("auto", 2, None, {}) is None  # no NVML
    assert expected_path("auto", 1, {"nvlink"}, {}) is None


def test_expectations_follow_the_rules_and_are_scored_against_the_table():
    presets = ["single", "baseline", "static", "overlap", "bf16", "powersgd"]
    ref = preset_config("baseline", RunConfig(nproc=4)).to_dict()
    on_nvlink, basis = expectations(presets, ref, 4, "nvlink", {"nvlink"}, {})
    assert "NVLink" in basis
    assert {e.preset: e.faster for e in on_nvlink} == {"overlap": True, "bf16": False, "powersgd": False}
    on_shm, _ = expectations(presets + ["bf16-overlap"], ref, 4, "shm", {"nvlink"}, {"NCCL_P2P_DISABLE": "1"})
    assert [e for e in on_shm if e.faster] == [e for e in on_shm if e.preset == "bf16-overlap"] != []
    assert expectations(presets, ref, 2, None, None, {}) == ([], expectations(presets, ref, 2, None, None, {})[1])

    rows = [row("baseline", 10.0, (9.6, 10.4)), row("overlap", 11.0, (10.6, 11.3)),
            row("bf16", 12.0, (11.5, 12.5)), row("powersgd", 10.1, (9.5, 10.7))]
    scored = score(on_nvlink, rows)
    assert [(s["preset"], s["held"]) for s in scored] == [("overlap", True), ("bf16", False), ("powersgd", True)]
    lines = score_lines(scored)
    assert lines[0].startswith("**The advisor's expectations before the sweep:** 2 of 3 held")
    assert "- bf16: expected not faster" in lines[2] and "did not hold" in lines[2]
    assert score([Expectation("fp16", True, "x")], rows)[0]["held"] is None  # not run: not scored
