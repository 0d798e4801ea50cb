"""bench/scaling.py (issue 47's scaling table): configurations, interleaved order, the
efficiency against one rank's samples/s, and a run that failed shown as such."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def load():
    spec = importlib.util.spec_from_file_location("scaling", ROOT / "bench" / "scaling.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run(nproc, preset, sps, samples, rnd=1, ci=None):
    return {"round": rnd, "nproc": nproc, "preset": preset, "rc": 0, "status": "completed",
            "steps_per_s": sps, "samples_per_s": samples, "ci": ci}


def test_configurations_put_one_unsharded_rank_first_for_the_demo_and_the_script_as_is():
    mod = load()
    assert mod.configs([1, 2, 4], ["baseline", "bf16-overlap"], []) == [
        (1, "single"), (2, "baseline"), (2, "bf16-overlap"), (4, "baseline"), (4, "bf16-overlap")]
    assert mod.configs([1, 2], ["baseline"], ["python", "t.py"]) == [(1, "asis"), (2, "asis")]


def test_efficiency_is_samples_per_rank_against_one_rank_and_the_interval_is_across_runs():
    mod = load()
    # the 4x H200 ladder of session 8: one GPU 11.93 steps/s, 4 ranks baseline 10.85 (batch 32 a rank)
    results = [run(1, "single", 11.93, 381.8, 1), run(4, "baseline", 10.85, 1388.8, 1),
               run(4, "baseline", 10.95, 1401.6, 2), run(1, "single", 11.91, 381.1, 2)]
    rows = mod.table(results, [(1, "single"), (4, "baseline")])
    one, four = rows
    assert one["efficiency"] == 1.0 and one["steps_per_s"] == pytest.approx(11.92)
    assert four["runs"] == 2 and four["steps_per_s"] == pytest.approx(10.90)
    assert four["efficiency"] == pytest.approx(1395.2 / (4 * 381.45), abs=1e-3)  # 91%
    assert four["ci"][0] < 10.85 and four["ci"][1] > 10.95
    text = mod.render(rows)
    assert "  4  baseline          2     10.90" in text and "91%" in text
    assert "the article's 8-GPU ViT-L kept NVLink 92%, PCIe/SHM 17%" in text


def test_a_configuration_whose_runs_failed_reads_failed_not_a_number():
    mod = load()
    rows = mod.table([run(1, "single", 11.9, 380.0), {"round": 1, "nproc": 2, "preset": "baseline", "rc": 1,
                                                      "error": "boom"}], [(1, "single"), (2, "baseline")])
    assert rows[1]["steps_per_s"] is None and rows[1]["efficiency"] is None
    assert "failed" in mod.render(rows).splitlines()[2]
