"""The ranks' cost blocks read back at the run's end: a rank is trusted for its own file only."""

from __future__ import annotations

import json

from ddptop.analysis.cost_ab import analyse, run_summary
from ddptop.model.config import RunConfig
from ddptop.model.report import cost_lines
from ddptop.run.cost_files import read_cost_blocks


def blocks(rank: int, groups: int = 30) -> dict:
    out = []
    for g in range(1, groups + 1):
        for arm, ms in (("on", 10.2), ("off", 10.0), ("aa", 10.0 + 0.01 * (g % 3 - 1))):
            out.append({"group": g, "arm": arm, "steps": 1, "ms": ms + 0.001 * g, "cpu_ms": 5.0, "hook_ms": 0.1})
    return {"rank": rank, "blocks": out}


def test_each_rank_file_is_read_and_a_forged_or_broken_one_is_left_out_and_said(tmp_path):
    d = tmp_path / "cost_ab"
    d.mkdir()
    (d / "rank0.json").write_text(json.dumps(blocks(0)))
    (d / "rank1.json").write_text(json.dumps(blocks(0)))  # says it is rank 0
    (d / "rank2.json").write_text("{not json")
    (d / "rank7.json").write_text(json.dumps(blocks(7)))  # outside a world of 4
    (d / "rank3.json").write_text(json.dumps({"rank": 3, "blocks": [1, 2]}))
    (d / ".rank4.json.tmp").write_text("half")
    results, problems = read_cost_blocks(tmp_path, world_size=4)
    assert [r["rank"] for r in results] == [0]
    assert sorted(p.split(" left out")[0] for p in problems) == [
        "cost_ab/rank1.json", "cost_ab/rank2.json", "cost_ab/rank3.json", "cost_ab/rank7.json"]
    assert any("outside the world of 4" in p for p in problems)


def test_no_directory_is_nothing_to_read(tmp_path):
    assert read_cost_blocks(tmp_path, world_size=2) == ([], [])


def test_the_summary_and_its_closing_lines_say_each_arm_with_its_verdict():
    run_cost = run_summary(analyse([blocks(0), blocks(1)]))
    assert run_cost is not None
    cost = run_cost.to_dict()
    assert cost["groups"] == 30 and cost["step_ms"] > 10.0
    assert [a["arm"] for a in cost["arms"]] == ["on", "aa"]
    on = cost["arms"][0]
    assert abs(on["ms_per_step"]["median"] - 0.2) < 1e-9
    assert "typical_ratio" not in on  # one-step blocks: it would repeat the ratio
    assert "NOT within 0.5%" in on["verdict"]  # a 2% cost
    json.dumps(cost, allow_nan=False)  # strict JSON
    lines = cost_lines({"cost": cost})
    assert lines[0].startswith("ddptop's own cost (engaged vs bypassed inside this run, 30 groups")
    assert "the figures above are the engaged steps', 1 in 3 of the measured steps" in lines[0]
    assert lines[1].startswith("  on   +200 us a step per rank [+200, +200], ratio 0.98")
    assert run_summary([]) is None and cost_lines({"cost": None}) == []


def test_a_run_cost_travels_to_a_viewer_with_the_rest_of_the_state():
    from ddptop.model.state import RunState
    from ddptop.viewer_wire import viewer_protocol as vp

    state = RunState(run_id="r", world_size=2, config=RunConfig())
    state.cost = run_summary(analyse([blocks(0), blocks(1)]))
    back = vp.load_state(vp.dump_state(state))
    assert back.cost == state.cost and back.summary()["cost"] == state.summary()["cost"]


def test_a_malformed_block_is_said_and_never_raised_into_the_runs_end():
    from ddptop.run.cost_files import cost_of

    good = blocks(0)
    cost, problem = cost_of([good, blocks(1)], 0.5)
    assert cost is not None and problem is None
    for bad in ({"group": 1, "arm": "on", "steps": 1}, {"group": "x", "arm": "on", "steps": 1, "ms": 1},
                {"group": 1, "arm": "zz", "steps": 1, "ms": 1}, {"group": 1, "arm": "on", "steps": 1, "ms": None}):
        cost, problem = cost_of([good, {"rank": 1, "blocks": [bad]}], 0.5)
        assert cost is None and problem.startswith("ddptop's cost not measured: a rank's cost blocks are malformed")
    assert cost_of([], 0.5) == (None, None)
