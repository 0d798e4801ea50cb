"""`ddptop sweep --repeat N` (issue 47): one row per preset over its runs (median, interval
across runs, runs count, speedup interval) from synthetic summaries, the usage error, and a
real CPU sweep whose runs went interleaved."""

from __future__ import annotations

import json

import pytest
from test_sweep import summary

from ddptop.analysis.advisor import recommend_from_sweep
from ddptop.commands import sweep
from ddptop.commands.sweep import expect_before, main_sweep
from ddptop.commands.sweep_table import build_rows, fold_runs, markdown_table, render_markdown
from ddptop.model.config import RunConfig, preset_config


def runs(preset, rates, cis=None, **kw):
    out = []
    for i, rate in enumerate(rates):
        s = summary(preset, rate, **kw) | {"run_id": f"r-{preset}-{i}"}
        if rate is None:
            s |= {"status": "failed", "error": "rank 1 died"}
        s["steps_per_s_ci"] = cis[i] if cis else None
        out.append(s)
    return out


def test_a_row_per_preset_gives_the_median_the_interval_across_runs_and_the_runs():
    rows = fold_runs([runs("baseline", [10.0, 11.0, 9.0], comm_ms=40.0),
                      runs("overlap", [12.0, None, 13.0])])
    base, over = rows
    assert base["steps_per_s"] == 10.0 and (base["runs"], base["runs_total"]) == (3, 3)
    lo, hi = base["steps_per_s_ci"]
    assert (lo + hi) / 2 == pytest.approx(10.0) and (hi - lo) / 2 == pytest.approx(4.303 / 3 ** 0.5, rel=1e-3)
    assert over["steps_per_s"] == 12.5 and (over["runs"], over["runs_total"]) == (2, 3)
    assert over["status"] == "completed" and over["error"] == "run 2: failed: rank 1 died"
    assert over["run_rates"] == [12.0, None, 13.0]
    assert over["speedup"] == pytest.approx(1.25)
    assert over["speedup_ci"] == pytest.approx((over["steps_per_s_ci"][0] / hi, over["steps_per_s_ci"][1] / lo))
    table = markdown_table(rows).splitlines()
    cols = [c.strip() for c in table[0].strip("|").split("|")]
    assert cols[4:7] == ["runs", "steps/s median", "steps/s 95% CI across runs (t)"]
    assert cols[-1] == "speedup 95% CI"
    cells = [c.strip() for c in table[3].strip("|").split("|")]
    assert cells[4] == "2/3" and cells[5] == "12.50"
    md = render_markdown(rows, recommend_from_sweep(rows), "sweep x")
    assert "- overlap: completed: run 2: failed: rank 1 died" in md


def test_a_preset_left_with_one_run_keeps_its_per_step_interval_and_says_so():
    rows = fold_runs([runs("baseline", [10.0, 11.0, 9.0], cis=[(9.5, 10.5), (10.5, 11.5), (8.5, 9.5)]),
                      runs("overlap", [12.0, None, None], cis=[(11.5, 12.5), None, None])])
    assert rows[1]["runs"] == 1 and rows[1]["steps_per_s_ci"] == (11.5, 12.5)
    reason = recommend_from_sweep(rows).reason
    assert "across runs" in reason and "from per-step times for 1 (one completed run)" in reason


def test_one_run_each_reads_as_before():
    """--repeat 1 keeps the table it always had: no runs column, the per-step interval."""
    rows = build_rows([summary("baseline", 10.0), summary("overlap", 12.0)])
    assert "runs" not in markdown_table(rows) and all("speedup_ci" not in r for r in rows)


def test_repeat_below_one_is_a_usage_error(tmp_path, capsys):
    assert main_sweep(["--repeat", "0", "--nproc", "2", "--runs-dir", str(tmp_path / "runs")]) == 2
    err = capsys.readouterr().err
    assert err == "ddptop: error: --repeat must be at least 1, got 0\n"
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())


def test_expectations_are_taken_from_the_links_and_environment_before_the_runs(monkeypatch):
    """The GPUs' links come from NVML (faked at that edge: 4 GPUs, every pair NVLink); the
    environment is the sweep's own."""
    monkeypatch.setattr(sweep, "_hw_links", lambda world: {"nvlink"})
    monkeypatch.delenv("NCCL_P2P_DISABLE", raising=False)
    configs = [preset_config(p, RunConfig(nproc=4)) for p in ("single", "baseline", "overlap", "bf16", "bf16-overlap")]
    nvlink = expect_before(configs)
    assert nvlink["path"] == "nvlink" and "4 ranks expected over NVLink" in nvlink["basis"]
    assert {e["preset"]: e["faster"] for e in nvlink["presets"]} == {"overlap": True, "bf16": False,
                                                                     "bf16-overlap": False}
    monkeypatch.setenv("NCCL_P2P_DISABLE", "1")
    shm = expect_before(configs)
    assert shm["path"] == "shm" and {e["preset"]: e["faster"] for e in shm["presets"]} == {"bf16-overlap": True}
    gloo = expect_before([c.with_changes(backend="gloo") for c in configs])
    assert gloo["path"] is None and gloo["presets"] == []


@pytest.mark.e2e
@pytest.mark.slow  # four runs (~35 s on 2 cores); the folding and the advice over it are covered above
def test_real_sweep_repeats_each_preset_interleaved(tmp_path, capsys):
    rc = main_sweep(["--nproc", "2", "--presets", "baseline,overlap", "--repeat", "2", "--steps", "24",
                     "--warmup", "2", "--runs-dir", str(tmp_path), "--set", "workers=0"])
    out = capsys.readouterr().out
    assert rc == 0, out
    progress = [ln.split()[1] for ln in out.splitlines() if ln.startswith("[")]
    assert progress == ["baseline", "overlap", "overlap", "baseline"]  # round 2 reversed
    (sweep_dir,) = tmp_path.glob("sweep-*")
    data = json.loads((sweep_dir / "sweep.json").read_text())
    assert data["repeat"] == 2 and "interleaved" in data["order"]
    assert [(r["round"], r["preset"]) for r in data["runs"]] == [(1, "baseline"), (1, "overlap"),
                                                                (2, "overlap"), (2, "baseline")]
    started = [r["run_id"][:15] for r in data["runs"]]  # run ids begin with their start, to the second
    assert started == sorted(set(started))  # they ran in that order, one after another
    for row in data["rows"]:
        assert (row["runs"], row["runs_total"], row["status"]) == (2, 2, "completed")
        rates = [r["steps_per_s"] for r in data["runs"] if r["preset"] == row["preset"]]
        assert row["run_rates"] == rates and row["steps_per_s"] == pytest.approx(sum(rates) / 2)
        lo, hi = row["steps_per_s_ci"]
        assert lo <= min(rates) and max(rates) <= hi  # t with 1 df: wider than the two runs
        assert len(row["run_dirs"]) == 2
    over = data["rows"][1]
    # n/a only when baseline's interval reaches 0 (two runs, t with 1 df), which bounds no ratio
    assert over["speedup_ci"] is not None or data["rows"][0]["steps_per_s_ci"][0] == 0
    if over["speedup_ci"]:
        assert over["speedup_ci"][0] <= over["speedup"] <= over["speedup_ci"][1]
    assert "steps/s 95% CI across runs (t)" in out and "each preset ran 2 times" in out
    assert data["expected"]["presets"] == [] and data["expected"]["path"] is None  # gloo: nothing foreseen
    assert (sweep_dir / "expected.json").exists() and (sweep_dir / "sweep.md").read_text() in out


def test_an_interrupted_sweep_says_the_run_it_cut_and_the_runs_it_never_started():
    """A 3x3 sweep stopped in its ninth run has no run left unstarted, yet it did not finish:
    the note said `0 of 9 run(s) not run` beside a row reading 2/3 (GPU, 2026-11-27)."""
    from ddptop.commands.batch_run import SweepResult

    configs = [preset_config(p, RunConfig(nproc=4)) for p in ("baseline", "overlap", "bf16")]
    done = [summary("baseline", 10.0)] * 3 + [summary("overlap", 11.0)] * 3 + [summary("bf16", 12.0)] * 2
    cut = SweepResult(summaries=[*done, summary("bf16", None, status="stopped")], interrupted=True)
    notes = sweep.sweep_notes(cut, [], configs, None, repeat=3)
    assert "interrupted: 1 run(s) stopped part-way, 0 of 9 run(s) not run" in notes
    early = SweepResult(summaries=done[:4], interrupted=True)
    assert "interrupted: 5 of 9 run(s) not run" in sweep.sweep_notes(early, [], configs, None, repeat=3)
    one = SweepResult(summaries=[summary("baseline", 10.0)], interrupted=True)
    assert "interrupted: 2 of 3 run(s) not run" in sweep.sweep_notes(one, [], configs, None)


def test_a_sweep_with_the_wait_but_no_total_says_so_rather_than_no_comm_at_all():
    """A GPU sweep by default (nccl_timing off) has exposed comm in its table and no total: its
    note said `comm share and exposed comm are n/a` under a column of exposed figures."""
    from ddptop.commands.batch_run import SweepResult

    configs = [preset_config("baseline", RunConfig(nproc=4))]
    rows = [{"preset": "baseline", "comm_share": None, "exposed_comm_ms": 6.3}]
    notes = sweep.sweep_notes(SweepResult(), rows, configs, None)
    assert any(n.startswith("comm share is n/a: the all-reduce total is not timed") for n in notes)
    assert not any("exposed comm are n/a" in n for n in notes)
    rows = [{"preset": "baseline", "comm_share": None, "exposed_comm_ms": None}]
    assert "comm share and exposed comm are n/a: the runs reported no comm timings" in sweep.sweep_notes(
        SweepResult(), rows, configs, None)


def test_a_runs_progress_line_gives_the_exposed_wait_where_the_total_is_not_timed():
    from ddptop.commands.batch_run import progress_line

    exposed_only = {"status": "completed", "steps_per_s": 10.0, "step_ms_p50": 100.0,
                    "ranks": [{"rank": 0, "exposed_comm_ms_mean": 7.0, "step_ms_mean": 100.0}]}
    assert "exposed comm 7%" in progress_line(exposed_only) and "comm n/a" not in progress_line(exposed_only)
    assert "comm n/a" in progress_line({"status": "completed", "steps_per_s": 10.0, "ranks": [{"rank": 0}]})
