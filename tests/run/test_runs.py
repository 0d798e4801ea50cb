"""ddptop.run.runs: reading earlier runs from the runs directory, the comparison table
(speedup vs the reference run) and its Markdown export. Pure apart from files."""

from __future__ import annotations

import json
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from ddptop.model.config import RunConfig, preset_config
from ddptop.run.runs import (
    HEADERS,
    RunRow,
    build_table,
    export_markdown,
    load_runs,
    markdown,
    merge_rows,
    pick_reference,
    row_from_summary,
)


def summary(run_id: str, preset: str, steps_per_s: float | None, status: str = "completed",
            model: str = "tiny_vit", backend: str = "gloo") -> dict:
    base = preset_config("view", RunConfig(nproc=2))
    config = (base.with_changes(preset="custom") if preset == "custom"
              else preset_config(preset, base)).to_dict()
    return {"run_id": run_id, "preset": preset, "config": config, "world_size": 2,
            "backend": backend, "model": model, "status": status, "steps_per_s": steps_per_s,
            "samples_per_s": None if steps_per_s is None else steps_per_s * 64,
            "step_ms_p50": None if steps_per_s is None else 1000 / steps_per_s}


def write_run(runs_dir: Path, data: dict, with_summary: bool = True) -> Path:
    run_dir = runs_dir / data["run_id"]
    run_dir.mkdir(parents=True)
    (run_dir / "config.json").write_text(json.dumps({**data["config"], "_launch": {"run_id": data["run_id"]}}))
    if with_summary:
        (run_dir / "summary.json").write_text(json.dumps(data))
    return run_dir


def row(run_id: str, preset: str, rate: float | None, mine: bool = True, **kw: object) -> RunRow:
    return row_from_summary(summary(run_id, preset, rate, **kw), this_session=mine)


def test_load_runs_reads_summaries_and_config_only_runs(tmp_path: Path) -> None:
    write_run(tmp_path, summary("20260101-100000-baseline-aaaa", "baseline", 10.0))
    write_run(tmp_path, summary("20260101-110000-view-bbbb", "view", 12.5), with_summary=False)
    (tmp_path / "20260101-120000-junk").mkdir()  # neither file: not a run
    (tmp_path / "runs-20260101.md").write_text("an export, not a run")
    rows = load_runs(tmp_path)
    assert [r.run_id for r in rows] == ["20260101-100000-baseline-aaaa", "20260101-110000-view-bbbb"]
    assert rows[0].steps_per_s == 10.0 and rows[0].status == "completed"
    assert rows[0].settings == "bucket 2000MB"
    assert rows[1].status == "no summary" and rows[1].preset == "view"
    assert rows[1].settings == "bucket 2000MB, static, view"
    assert load_runs(tmp_path / "missing") == []


def test_summary_with_unknown_config_fields_still_lists() -> None:
    data = summary("20260101-100000-baseline-aaaa", "baseline", 10.0)
    data["config"]["a_knob_from_the_future"] = 3
    assert row_from_summary(data).settings == "bucket 2000MB"
    assert row_from_summary({"run_id": "x"}).status == "?"


def test_speedup_is_relative_to_the_first_baseline_of_this_session() -> None:
    rows = merge_rows(
        [row("20260102-100000-view-c", "view", 12.0), row("20260102-090000-baseline-b", "baseline", 8.0)],
        [row("20260101-090000-baseline-a", "baseline", 4.0, mine=False)],
    )
    assert [r.run_id for r in rows] == ["20260101-090000-baseline-a", "20260102-090000-baseline-b",
                                        "20260102-100000-view-c"]
    table = build_table(rows)
    assert table.reference_id == "20260102-090000-baseline-b"
    assert table.speedups["20260102-100000-view-c"] == 1.5
    assert table.speedups["20260101-090000-baseline-a"] == 0.5
    cells = {r.run_id: dict(zip(HEADERS, table.cells(r))) for r in rows}
    assert cells["20260102-090000-baseline-b"]["speedup"] == "1.00x (ref)"
    assert cells["20260102-100000-view-c"]["speedup"] == "1.50x"
    assert cells["20260101-090000-baseline-a"]["run"].endswith(" *")  # an earlier session's run
    # The user can pick another reference.
    chosen = build_table(rows, "20260102-100000-view-c")
    assert chosen.speedups["20260102-090000-baseline-b"] == 8.0 / 12.0


def test_no_baseline_means_first_run_and_incomparable_runs_say_why() -> None:
    rows = [row("20260102-090000-view-a", "view", 10.0),
            row("20260102-100000-bf16-b", "bf16", 11.0),
            row("20260102-110000-view-c", "view", 30.0, model="vit_l_32", backend="nccl"),
            row("20260102-120000-view-d", "view", None, status="failed")]
    table = build_table(rows)
    assert pick_reference(rows).run_id == "20260102-090000-view-a"
    assert table.speedups["20260102-100000-bf16-b"] == 1.1
    assert table.speedups["20260102-110000-view-c"] is None
    assert table.cells(rows[2])[HEADERS.index("speedup")] == "other model"
    assert table.cells(rows[3])[HEADERS.index("speedup")] == "-"
    assert build_table([]).reference_id is None


def test_markdown_export_is_a_table_with_every_run(tmp_path: Path) -> None:
    rows = [row("20260102-090000-baseline-a", "baseline", 8.0),
            row("20260102-100000-custom-b", "custom", 10.0)]
    table = build_table(rows)
    path = export_markdown(table, tmp_path, now=0)
    text = path.read_text()
    assert path.parent == tmp_path and path.name.startswith("runs-") and path.suffix == ".md"
    assert text == markdown(table)
    lines = text.splitlines()
    # the one Markdown renderer (model/report.markdown_grid): padded to read as plain text too
    assert [c.strip() for c in lines[0].strip("|").split("|")] == list(HEADERS)
    assert lines[1].count("|") == len(HEADERS) + 1 and set(lines[1]) <= set("|-: ")
    assert [c.strip() for c in lines[3].strip("|").split("|")][HEADERS.index("speedup")] == "1.25x"
    assert "20260102-100000-custom-b" in lines[3]
    assert "relative to run 20260102-090000-baseline-a" in text


@given(st.lists(st.floats(min_value=0.01, max_value=1e4), min_size=1, max_size=8))
def test_reference_speedup_is_one_and_others_are_ratios(rates: list[float]) -> None:
    rows = [row(f"20260102-{i:06d}-view-x", "view", r) for i, r in enumerate(rates)]
    table = build_table(rows)
    assert table.reference_id == rows[0].run_id
    for r, rate in zip(rows, rates):
        assert abs(table.speedups[r.run_id] - rate / rates[0]) < 1e-9


def test_a_run_with_nccl_env_does_not_pass_for_its_preset_in_the_table_and_export(tmp_path):
    """Issue 21: runs with nccl_env overrides looked like plain `baseline`."""
    from ddptop.model.config import RunConfig, preset_config
    from ddptop.run.runs import build_table, markdown, row_from_summary

    plain = preset_config("baseline", RunConfig())
    shm = preset_config("baseline", RunConfig(nccl_env={"NCCL_P2P_DISABLE": "1"}, nccl_timing=True))
    rows = [row_from_summary({"run_id": f"r{i}", "config": c.to_dict(), "steps_per_s": s, "status": "completed"})
            for i, (c, s) in enumerate([(plain, 10.0), (shm, 6.0)])]
    assert rows[0].settings == "bucket 2000MB"
    assert rows[1].settings == "bucket 2000MB; NCCL_P2P_DISABLE=1 nccl_timing"
    text = markdown(build_table(rows))
    assert "bucket 2000MB; NCCL_P2P_DISABLE=1 nccl_timing" in text
