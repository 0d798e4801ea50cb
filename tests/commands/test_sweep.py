"""`ddptop sweep`: the table from synthetic summaries, usage errors, and one real CPU sweep."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from ddptop.analysis.advisor import recommend_from_sweep
from ddptop.commands.sweep import main_sweep
from ddptop.commands.sweep_table import (
    build_rows,
    markdown_table,
    reference_preset,
    render_markdown,
)
from ddptop.model.config import RunConfig, preset_config


def summary(
    preset: str,
    rate: float | None,
    comm_ms: float | None = None,
    status: str = "completed",
    nproc: int = 4,
    p50: float | None = None,
    error: str = "",
) -> dict:
    config = preset_config(preset, RunConfig(nproc=nproc)).to_dict()
    p50 = p50 if p50 is not None else (1000.0 / rate if rate else None)
    rank = {"rank": 0, "step_ms_p50": p50}
    if comm_ms is not None:
        rank |= {"comm_ms_mean": comm_ms, "exposed_comm_ms_mean": comm_ms / 2}
    return {
        "run_id": f"r-{preset}", "preset": preset, "config": config, "world_size": config["nproc"],
        "status": status, "error": error, "steps_per_s": rate,
        "samples_per_s": rate * 32 * config["nproc"] if rate else None, "step_ms_p50": p50,
        "ranks": [rank],
    }  # fmt: skip


def test_speedup_vs_baseline_and_efficiency_vs_single():
    rows = build_rows(
        [
            summary("single", 11.93),
            summary("baseline", 6.06, comm_ms=80.0),
            summary("bf16-overlap", 10.01, comm_ms=20.0),
        ]
    )
    by = {r["preset"]: r for r in rows}
    assert by["single"]["world_size"] == 1 and by["baseline"]["world_size"] == 4
    assert by["baseline"]["speedup"] == pytest.approx(1.0)
    assert by["bf16-overlap"]["speedup"] == pytest.approx(10.01 / 6.06)
    assert by["single"]["efficiency"] == pytest.approx(1.0)
    assert by["bf16-overlap"]["efficiency"] == pytest.approx(10.01 / 11.93)
    # comm share = mean comm_ms / step p50 when the summary has no run-level share
    assert by["baseline"]["comm_share"] == pytest.approx(80.0 / (1000.0 / 6.06))
    assert by["baseline"]["exposed_comm_ms"] == pytest.approx(40.0)
    assert by["bf16-overlap"]["settings"] == "bucket 100MB, static, view, bf16"
    assert by["single"]["settings"] == "no DDP"


def test_run_level_comm_share_wins_and_missing_comm_is_na():
    s = summary("baseline", 5.0, comm_ms=100.0) | {"comm_share": 0.3, "exposed_comm_share": 0.1}
    rows = build_rows([s, summary("overlap", 6.0)])
    assert rows[0]["comm_share"] == 0.3 and rows[0]["exposed_comm_share"] == 0.1
    assert rows[1]["comm_share"] is None and rows[1]["exposed_comm_ms"] is None
    md = markdown_table(rows)
    assert md.splitlines()[3].count("n/a") == 2  # comm share, exposed comm ms


def test_reference_is_first_measured_row_without_baseline_and_failed_rows_are_na():
    rows = build_rows(
        [
            summary("view", None, status="failed", error="rank 1 died"),
            summary("static", 5.0),
            summary("overlap", 7.5),
        ]
    )
    assert reference_preset(rows) == "static"
    assert rows[2]["speedup"] == pytest.approx(1.5) and rows[0]["speedup"] is None
    assert all(r["efficiency"] is None for r in rows)
    md = markdown_table(rows)
    assert "speedup vs static" in md and "efficiency vs single" not in md
    assert "| view " in md and "failed" in md and "1.50x" in md


def test_markdown_table_format():
    rows = build_rows(
        [
            summary("single", 12.0),
            summary("baseline", 6.0, comm_ms=83.3),
            summary("bf16", 9.0, comm_ms=30.0),
        ]
    )
    lines = markdown_table(rows).splitlines()
    assert len(lines) == 2 + 3
    assert all(ln.startswith("| ") and ln.endswith(" |") for ln in lines)
    assert len({len(ln) for ln in lines}) == 1  # padded: reads as plain text too
    cols = [c.strip() for c in lines[0].strip("|").split("|")]
    assert cols == [
        "preset",
        "settings",
        "ranks",
        "status",
        "steps/s",
        "samples/s",
        "step p50 ms",
        "comm share",
        "exposed comm ms",
        "speedup vs baseline",
        "efficiency vs single",
    ]
    rule = [c.strip() for c in lines[1].strip("|").split("|")]
    assert set(rule[0]) == {"-"} and rule[4].endswith(":")  # numbers right-aligned
    bf16 = [c.strip() for c in lines[4].strip("|").split("|")]
    assert bf16[0] == "bf16" and bf16[4] == "9.00" and bf16[7] == "27%" and bf16[9] == "1.50x"
    assert bf16[10] == "75%"


def test_render_markdown_has_recommendation_and_failures():
    rows = build_rows(
        [
            summary("baseline", 6.0),
            summary("bf16", 9.0),
            summary("overlap", None, status="failed", error="exit code 1"),
        ]
    )
    md = render_markdown(rows, recommend_from_sweep(rows), "sweep x", notes=["a note"])
    assert md.startswith("## sweep x\n")
    assert "- overlap: failed: exit code 1" in md and "- a note" in md
    assert "**Recommendation (measured):** bf16 is the fastest configuration" in md and "lossy" in md


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--presets", "baseline,nope"], "unknown preset(s) nope"),
        (["--presets", ","], "--presets is empty"),
        (["--presets", "bf16,bf16"], "listed twice: bf16"),
        (["--set", "bogus=1"], "unknown setting 'bogus'"),
        (["--steps", "0"], "steps must be at least 1"),
        (["--frobnicate"], "unrecognized arguments"),
    ],
)
def test_usage_errors_are_one_line_and_start_nothing(tmp_path, capsys, argv, message):
    runs = tmp_path / "runs"
    assert main_sweep([*argv, "--nproc", "2", "--runs-dir", str(runs)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("ddptop: error: ") and message in err and err.count("\n") == 1
    assert not runs.exists() or not any(runs.iterdir())


def test_sweep_module_does_not_import_torch_or_textual():
    code = "import sys, ddptop.commands.sweep; print('\\n'.join(sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert not {"torch", "textual"} & set(out.stdout.split())


@pytest.mark.e2e
@pytest.mark.slow
def test_real_cpu_sweep_prints_table_and_writes_sweep_json(tmp_path, capsys):
    rc = main_sweep(
        [
            "--nproc",
            "2",
            "--presets",
            "baseline,bf16,overlap",
            "--steps",
            "20",
            "--runs-dir",
            str(tmp_path),
            "--set",
            "workers=0",
        ]
    )
    out = capsys.readouterr().out
    assert rc == 0, out
    assert sum(1 for ln in out.splitlines() if ln.startswith("[")) == 3  # one progress line per run
    table = [ln for ln in out.splitlines() if ln.startswith("| ")]
    assert len(table) == 2 + 3, out
    assert [c.split("|")[1].strip() for c in table[2:]] == ["baseline", "bf16", "overlap"]
    assert "**Recommendation (measured):**" in out
    assert all(float(ln.split("|")[5]) > 0 for ln in table[2:])  # steps/s measured
    (sweep_dir,) = tmp_path.glob("sweep-*")
    data = json.loads((sweep_dir / "sweep.json").read_text())
    assert [r["preset"] for r in data["rows"]] == ["baseline", "bf16", "overlap"]
    assert all(r["status"] == "completed" and r["steps_per_s"] > 0 for r in data["rows"])
    # the wait backward did not hide, in every run; the all-reduce total only where a Python hook
    # times it (bf16's), as gloo_timing is off by default (session 10)
    assert all(r["exposed_comm_share"] is not None for r in data["rows"])
    assert [r["comm_share"] is not None for r in data["rows"]] == [False, True, False]
    assert data["rows"][0]["speedup"] == pytest.approx(1.0) and data["reference"] == "baseline"
    assert data["advice"]["preset"] in ("baseline", "bf16", "overlap") and data["advice"]["reason"]
    if data["advice"]["preset"] == "bf16":
        assert data["advice"]["lossy"] and "lossy" in data["advice"]["reason"]
    assert data["diagnosis"] is None  # gloo: no transports for the advisor's rules
    assert (sweep_dir / "sweep.md").read_text() in out
    run_dirs = sorted(d for d in sweep_dir.iterdir() if d.is_dir())
    assert len(run_dirs) == 3 and all((d / "summary.json").exists() for d in run_dirs)
