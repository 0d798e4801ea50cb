"""`ddptop sweep` and `ddptop tune` on a user's own script (issue 19): 2 gloo ranks on the CPU,
a DDP script that never mentions ddptop and has no step limit of its own, each run stopped at
an agreed step after warmup + --steps, the DDP arguments in effect read back from the rank's
DDP object."""

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ddptop.analysis.advisor import recommend_from_sweep
from ddptop.commands.sweep_table import build_rows, in_effect, markdown_table
from ddptop.commands.tune import run_tune
from ddptop.commands.tune_report import command_line
from ddptop.commands.tune_search import Trial, point_read_back, preset_point
from ddptop.model.config import RunConfig, preset_config

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "endless_ddp.py"
WARMUP, STEPS = 3, 20

# preset -> what its run's DDP must have had, read back by the instrument
IN_EFFECT = {
    "asis": {"static_graph": False, "gradient_as_bucket_view": False, "bucket_cap_mb": 25.0,
             "comm_hook": "allreduce (DDP's own)"},  # gloo_timing off: DDP keeps its C++ all-reduce
    "static": {"static_graph": True, "gradient_as_bucket_view": False, "bucket_cap_mb": 2000.0,
               "comm_hook": "allreduce (DDP's own)"},
    "bf16": {"static_graph": True, "gradient_as_bucket_view": True, "bucket_cap_mb": 2000.0,
             "comm_hook": "bf16_compress_hook"},
    "overlap": {"static_graph": True, "gradient_as_bucket_view": True, "bucket_cap_mb": 100.0,
                "comm_hook": "allreduce (DDP's own)"},
}


def last_json(stdout: str) -> dict:
    return json.loads(stdout.strip().splitlines()[-1])


@pytest.mark.e2e
@pytest.mark.slow  # the suite stays under 10 min on 2 cores: `pytest -m slow` runs it (covered: tests/commands/test_sweep.py's rows and recommendation)
def test_sweep_runs_each_preset_on_the_users_script_for_exactly_the_asked_steps(tmp_path):
    res = subprocess.run(
        [sys.executable, "-m", "ddptop", "sweep", "--nproc", "2", "--presets", ",".join(IN_EFFECT),
         "--steps", str(STEPS), "--warmup", str(WARMUP), "--runs-dir", str(tmp_path), "--json",
         "--", sys.executable, str(SCRIPT)],
        capture_output=True, text=True, timeout=240)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    data = last_json(res.stdout)
    assert "**Recommendation (measured):**" in res.stdout and "| preset" in res.stdout
    assert data["command"] == [sys.executable, str(SCRIPT)] and data["reference"] == "asis"
    assert [r["preset"] for r in data["rows"]] == list(IN_EFFECT)
    for row in data["rows"]:
        assert row["status"] == "completed", row
        summary = json.loads((Path(row["run_dir"]) / "summary.json").read_text())
        assert summary["command"] == [sys.executable, str(SCRIPT)] and not summary["error"], summary["error"]
        logs = "\n".join(p.read_text() for p in Path(row["run_dir"]).glob("logs/*/attempt_0/*/stderr.log"))
        for rank in summary["ranks"]:
            # warmup + exactly STEPS optimizer steps, then stopped cleanly at the agreed step
            assert (rank["steps"], rank["last_step"], rank["status"]) == (WARMUP + STEPS, WARMUP + STEPS - 1, "done")
            info = rank["info"]
            assert {k: info[k] for k in IN_EFFECT[row["preset"]]} == IN_EFFECT[row["preset"]], (row["preset"], info)
            assert info["ddp_asked"] == "static_graph=False, gradient_as_bucket_view=False, bucket_cap_mb=25"
            assert (info["ddp_set"] == "nothing (as is)") == (row["preset"] == "asis")
            assert f"stops after step {WARMUP + STEPS - 1}, the run's {STEPS} steps after warmup are done" in logs
        assert row["in_effect"] == {**IN_EFFECT[row["preset"]], "autocast": "none"}
        assert row["exposed_comm_share"] is not None and row["samples_per_s"]  # the total: only where timed
    sweep_dir = Path(data["dir"])
    assert (sweep_dir / "sweep.md").read_text().count("\n| ") == 2 + len(IN_EFFECT)
    assert "bucket 100MB, static, view" in (sweep_dir / "sweep.md").read_text()


@pytest.mark.e2e
@pytest.mark.slow  # the suite stays under 10 min on 2 cores: `pytest -m slow` runs it (covered: tune's search in tests/commands/test_tune*.py)
def test_tune_on_the_users_script_finishes_within_its_budget_with_a_verdict(tmp_path):
    budget = 60
    t0 = time.monotonic()
    res = subprocess.run(
        [sys.executable, "-m", "ddptop", "tune", "--nproc", "2", "--budget", str(budget), "--steps", "8",
         "--warmup", "2", "--runs-dir", str(tmp_path), "--json", "--", sys.executable, str(SCRIPT)],
        capture_output=True, text=True, timeout=budget + 60)
    wall = time.monotonic() - t0
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    data = last_json(res.stdout)
    assert wall <= budget + 10, wall  # the budget, plus ddptop's own start and the report
    trials = data["trials"]
    assert trials[0]["config"] == "asis" and trials[0]["source"] == "baseline"
    assert all(t["status"] == "completed" for t in trials)
    # a second run starts only when the longest run so far still fits in what is left (a
    # loaded machine can make the first one take half the budget: then it must say so)
    if trials[0]["wall_s"] < budget / 2 - 5:
        assert len(trials) >= 2, trials
    else:
        assert len(trials) >= 2 or "give a larger --budget" in res.stdout, res.stdout[-2000:]
    assert data["best"] is not None and "**Recommendation (measured):**" in res.stdout
    assert data["best"]["command"].startswith("ddptop --nproc 2 ")
    assert data["best"]["command"].endswith(f"-- {sys.executable} {SCRIPT}")
    # the search starts from what the script's DDP really had
    assert trials[0]["point"] == {"comm_hook": "none", "powersgd_rank": 1, "bucket_cap_mb": 25.0,
                                  "static_graph": False, "gradient_as_bucket_view": False}


# ---------------------------------------------------------------------------- pure parts


def script_summary(preset: str, rate: float, info: dict) -> dict:
    config = preset_config(preset, RunConfig(script=True)).script_dict()
    return {"preset": preset, "config": config, "command": ["python", "train.py"], "status": "completed",
            "steps_per_s": rate, "world_size": 2, "ranks": [{"rank": 0, "info": info}]}


def test_rows_describe_what_the_scripts_ddp_had_and_measure_against_asis():
    asis = script_summary("asis", 10.0, {"static_graph": False, "gradient_as_bucket_view": False,
                                         "bucket_cap_mb": 25.0, "comm_hook": "my_hook", "ddp_set": "nothing (as is)"})
    bf16 = script_summary("bf16", 12.0, {"static_graph": True, "gradient_as_bucket_view": True,
                                         "bucket_cap_mb": 2000.0, "comm_hook": "bf16_compress_hook"})
    rows = build_rows([bf16, asis])
    assert [r["speedup"] for r in rows] == [pytest.approx(1.2), pytest.approx(1.0)]
    assert rows[0]["settings"] == "bucket 2000MB, static, view, hook bf16_compress"
    assert rows[1]["settings"] == "bucket 25MB, hook my" and rows[1]["ddp_set"] == "nothing (as is)"
    assert "speedup vs asis" in markdown_table(rows)
    assert in_effect({"ranks": []}) == "-"


def test_a_script_sweep_won_by_a_compression_hook_says_it_is_lossy_and_names_the_fastest_lossless():
    plain = {"static_graph": True, "gradient_as_bucket_view": True, "bucket_cap_mb": 100.0, "comm_hook": "allreduce"}
    rows = build_rows([
        script_summary("asis", 10.0, {**plain, "static_graph": False, "bucket_cap_mb": 25.0}),
        script_summary("bf16", 14.0, {**plain, "bucket_cap_mb": 2000.0, "comm_hook": "bf16_compress_hook"}),
        script_summary("overlap", 12.0, plain),
    ])
    advice = recommend_from_sweep(rows)
    assert advice.preset == "bf16" and advice.lossy
    assert "1.40x asis" in advice.reason and "lossy: check that accuracy holds" in advice.reason
    assert "Fastest lossless: overlap (1.20x asis)" in advice.reason


def test_tune_points_and_command_lines_for_a_script():
    s = script_summary("asis", 10.0, {"static_graph": True, "gradient_as_bucket_view": False,
                                      "bucket_cap_mb": 50.0, "comm_hook": "powerSGD_hook"})
    assert point_read_back(s) == {"comm_hook": "powersgd", "powersgd_rank": 1, "bucket_cap_mb": 50.0,
                                  "static_graph": True, "gradient_as_bucket_view": False}
    # a knob the preset does not set is set explicitly: the script would keep its own value
    cmd = command_line(preset_point("static"), 2, [], ["python", "train.py", "--lr", "0.1"])
    assert cmd == ("ddptop --nproc 2 --preset static --set comm_hook=none --set gradient_as_bucket_view=false "
                   "-- python train.py --lr 0.1")


def test_a_script_tune_starts_from_asis_and_never_starts_a_run_past_its_budget(tmp_path):
    now = [0.0]
    ran: list[RunConfig] = []

    def runner(config, tune_dir):
        now[0] += 20.0
        ran.append(config)
        info = {"static_graph": False, "gradient_as_bucket_view": False, "bucket_cap_mb": 25.0,
                "comm_hook": "allreduce (ddptop's timed)"}
        return {"status": "completed", "steps_per_s": 5.0 + len(ran), "command": ["x"],
                "ranks": [{"rank": 0, "info": info}]}, "", False

    base = preset_config("asis", RunConfig(script=True, script_steps=10))
    result = run_tune(base, tmp_path, 70.0, runner=runner, clock=lambda: now[0], out=open("/dev/null", "w"))
    assert now[0] <= 70.0 and len(ran) == 3  # 3 x 20 s; a 4th would end at 80 s
    assert ran[0].preset == "asis" and ran[0].ddp_apply == ""
    assert all(set(c.applied) >= {"comm_hook", "bucket_cap_mb", "static_graph", "gradient_as_bucket_view"}
               for c in ran[1:])
    assert isinstance(result.trials[0], Trial) and result.trials[0].label == "asis"
    assert "held the baseline and 2 of the advisor's 3 presets" in " ".join(result.notes)
