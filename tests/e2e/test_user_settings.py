"""DDP settings on a user's own script (issue 19): what reaches its DDP() call, conflicts said
in one line, the summary and header showing what the script asked for and what ddptop changed,
and the TUI's settings screen for a script run (only the knobs that reach it; ctrl+s restarts
the same command). 2 gloo ranks on the CPU, a script that never mentions ddptop."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import pytest
from test_tui import wait_for

from ddptop.model.config import RunConfig, preset_config
from ddptop.model.report import final_report, script_ddp_lines
from ddptop.tui.app import DdpTopApp
from ddptop.tui.factory import build_app
from ddptop.tui.screens.settings_screen import SettingsScreen, knob_names
from ddptop.tui.synthetic import synthetic_state, synthetic_workbench
from ddptop.tui.widgets.run_header import script_ddp_text

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "endless_ddp.py"
DEMO_ONLY = ("model", "batch_size", "steps", "seed", "data", "workers", "lr", "ddp", "grad_accum",
             "delay_rank", "delay_ms", "fail_rank", "fail_step")


def script_config(preset: str = "asis", **changes: object) -> RunConfig:
    return preset_config(preset, RunConfig(**{"nproc": 2, "script": True, "warmup": 2, **changes}))


# ---------------------------------------------------------------------------- pure parts


def summary_with(infos: list[dict]) -> dict:
    return {"command": ["python", "train.py"], "ranks": [{"rank": i, "info": info} for i, info in enumerate(infos)]}


def test_the_summary_says_what_the_script_asked_what_ddptop_set_and_what_was_in_effect():
    info = {"static_graph": True, "gradient_as_bucket_view": False, "bucket_cap_mb": 25.0,
            "comm_hook": "bf16_compress_hook", "ddp_asked": "static_graph=False, gradient_as_bucket_view=False, "
            "bucket_cap_mb=25", "ddp_set": "static_graph False->True, comm_hook none->bf16"}
    (line,) = script_ddp_lines(summary_with([info, info]))
    assert line == ("DDP (every rank): the script asked static_graph=False, gradient_as_bucket_view=False, "
                    "bucket_cap_mb=25; ddptop set static_graph False->True, comm_hook none->bf16; in effect "
                    "static_graph=True, gradient_as_bucket_view=False, bucket_cap_mb=25, hook bf16_compress_hook")
    other = {**info, "bucket_cap_mb": 50.0}
    lines = script_ddp_lines(summary_with([info, other]))
    assert [line.split(":")[0] for line in lines] == ["DDP (rank 0)", "DDP (rank 1)"]
    # ddptop's own trainer, or a script that built no DDP: nothing to say
    assert script_ddp_lines({"command": None, "ranks": [{"rank": 0, "info": info}]}) == []
    assert script_ddp_lines(summary_with([{"model": "Net"}])) == []


def test_the_header_shows_what_ddptop_changed_or_what_the_script_asked():
    state = synthetic_state(2)
    state.command = ["python", "train.py"]
    assert script_ddp_text(state) == ()  # not read yet
    state.ranks[0].info.update(ddp_set="nothing (as is)", ddp_asked="static_graph=False")
    assert [t for t, _ in script_ddp_text(state)] == ["  DDP as the script asked ", "static_graph=False"]
    state.ranks[0].info.update(ddp_set="bucket_cap_mb 25->100")
    assert [t for t, _ in script_ddp_text(state)] == ["  ddptop changed ", "bucket_cap_mb 25->100"]


def test_a_script_config_applies_only_what_a_preset_or_the_user_sets():
    assert script_config("asis").applied == ()
    assert script_config("overlap").applied == ("static_graph", "gradient_as_bucket_view", "bucket_cap_mb")
    # a script's warmup is not bounded by the trainer's steps: its steps count after warmup
    assert script_config(warmup=500, script_steps=10).warmup == 500
    # the demo's fields are not a script's settings
    assert not set(DEMO_ONLY) & set(knob_names(script=True))
    assert "ddp_apply" not in knob_names() and "script" not in knob_names()


# ---------------------------------------------------------------------------- settings screen


def test_the_settings_screen_for_a_script_shows_only_what_reaches_it_and_marks_what_ddptop_sets(tmp_path):
    results: list[RunConfig | None] = []

    async def main() -> None:
        bench = synthetic_workbench(synthetic_state(2), tmp_path)
        app = DdpTopApp(bench, autostart=False, refresh_s=3600)
        async with app.run_test(size=(100, 40)) as pilot:
            screen = SettingsScreen(script_config("asis", script_steps=30))
            await app.push_screen(screen, results.append)
            await pilot.pause()
            for name in DEMO_ONLY:
                assert not screen.query(f"#knob-{name}"), f"demo-only {name} shown for a script"
            for name in ("nproc", "warmup", "script_steps", "static_graph", "bucket_cap_mb", "comm_hook", "nccl_env"):
                assert screen.query(f"#knob-{name}"), f"no control for {name}"
            presets = [value for _, value in screen.query_one("#knob-preset")._options]
            assert presets[0] == "asis" and "single" not in presets and "amp" not in presets
            whose = {n: str(screen.query_one(f"#whose-{n}").render()) for n in ("static_graph", "bucket_cap_mb")}
            assert whose == {"static_graph": "script's", "bucket_cap_mb": "script's"}
            # a preset sets its knobs; a knob changed by hand is set too, and the run is custom
            screen.query_one("#knob-preset").value = "overlap"
            await pilot.pause()
            assert str(screen.query_one("#whose-bucket_cap_mb").render()) == "set"
            assert str(screen.query_one("#whose-comm_hook").render()) == "script's"
            screen.query_one("#knob-comm_hook").value = "bf16"
            await pilot.pause()
            assert str(screen.query_one("#whose-comm_hook").render()) == "set"
            assert str(screen.query_one("#whose-autocast").render()) == "script's"
            assert screen.query_one("#knob-preset").value == "custom"
            await pilot.press("ctrl+s")
            await pilot.pause()
            assert app.screen is not screen

    asyncio.run(main())
    (config,) = results
    assert config is not None and config.script and config.script_steps == 30
    assert config.applied == ("static_graph", "gradient_as_bucket_view", "bucket_cap_mb", "comm_hook")
    assert (config.preset, config.comm_hook, config.bucket_cap_mb) == ("custom", "bf16", 100.0)


# ---------------------------------------------------------------------------- real runs


@pytest.mark.e2e
def test_a_script_with_its_own_comm_hook_keeps_it_timed_and_the_run_says_so_once(tmp_path):
    res = subprocess.run(
        [sys.executable, "-m", "ddptop", "--nproc", "2", "--headless", "--json", "--preset", "bf16",
         "--set", "autocast=bf16", "--steps", "10", "--warmup", "2", "--runs-dir", str(tmp_path),
         "--", sys.executable, str(SCRIPT), "--own-hook"],
        capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    summary = json.loads(res.stdout.strip().splitlines()[-1])
    hook_notes = [n for n in summary["notes"] if "registers its own comm hook" in n]
    assert len(hook_notes) == 1, summary["notes"]
    assert "(averaged_allreduce): ddptop keeps it and does not apply comm_hook=bf16" in hook_notes[0]
    assert any("autocast=bf16 asked, but the script's forward runs with autocast none" in n
               for n in summary["notes"]), summary["notes"]
    for rank in summary["ranks"]:
        info = rank["info"]
        assert (rank["steps"], rank["status"]) == (12, "done")
        assert info["comm_hook"] == "averaged_allreduce" and "comm_hook" not in info["ddp_set"]
        assert info["static_graph"] and info["bucket_cap_mb"] == 2000  # the rest of the preset applied
        assert rank["comm_ms_p50"] > 0 and rank["comm_timed_steps"] > 0  # the user's hook is timed
    assert "the script asked static_graph=False" in res.stdout and "in effect static_graph=True" in res.stdout
    assert "note: rank " in res.stdout and "Traceback" not in res.stderr


@pytest.mark.e2e
def test_static_graph_on_a_script_whose_graph_changes_is_said_and_blamed_not_silent(tmp_path):
    res = subprocess.run(
        [sys.executable, "-m", "ddptop", "--nproc", "2", "--headless", "--json", "--preset", "static",
         "--steps", "10", "--warmup", "2", "--runs-dir", str(tmp_path),
         "--", sys.executable, str(SCRIPT), "--changing-graph"],
        capture_output=True, text=True, timeout=120)
    assert res.returncode == 1, res.stdout[-3000:] + res.stderr[-3000:]
    summary = json.loads(res.stdout.strip().splitlines()[-1])
    notes = " | ".join(summary["notes"])
    assert "static_graph=True set by ddptop on a DDP built with find_unused_parameters=True" in notes
    assert "static_graph=True, set by ddptop, does not fit this script: its graph changes" in notes
    assert summary["status"] == "failed" and "graph has changed" in summary["error"]


@pytest.mark.e2e
def test_static_graph_on_a_script_that_accumulates_under_no_sync_from_its_first_step_runs_static(tmp_path):
    # HF Trainer and Lightning accumulate under no_sync() from step one: static_graph=True put
    # into DDP() fails that first backward (reducer's expect_autograd_hooks_ assert, found on
    # 2x H200); ddptop sets it at the first forward DDP syncs, and says when it is in effect
    accum = Path(__file__).resolve().parents[1] / "scripts" / "accum_ddp.py"
    res = subprocess.run(
        [sys.executable, "-m", "ddptop", "--nproc", "2", "--headless", "--json", "--preset", "overlap",
         "--steps", "6", "--warmup", "2", "--runs-dir", str(tmp_path),
         "--", sys.executable, str(accum), "--steps", "1000", "--accum", "2"],
        capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    summary = json.loads(res.stdout.strip().splitlines()[-1])
    assert summary["status"] == "completed" and "expect_autograd_hooks_" not in res.stdout + res.stderr
    for rank in summary["ranks"]:
        info = rank["info"]
        assert (rank["steps"], info["static_graph"], info["bucket_cap_mb"]) == (8, True, 100)
        assert "static_graph False->True" in info["ddp_set"]


def rank_info(session) -> dict:  # noqa: ANN001
    return next((rs.info for rs in session.state.ranks.values() if "ddp_set" in rs.info), {})


@pytest.mark.e2e
def test_settings_ctrl_s_restarts_the_same_command_with_the_new_ddp_arguments(tmp_path):
    cmd = [sys.executable, str(SCRIPT)]

    async def main() -> None:
        app = build_app(script_config("asis"), tmp_path, cmd)
        async with app.run_test(size=(120, 40)) as pilot:
            bench = app.workbench
            first = bench.current
            await wait_for(pilot, lambda: first.state.current_step >= 3, 60, "the script stepping")
            assert rank_info(first)["ddp_set"] == "nothing (as is)"
            await pilot.press("s")
            screen = app.screen
            assert isinstance(screen, SettingsScreen) and not screen.query("#knob-model")
            screen.query_one("#knob-static_graph").value = True
            screen.query_one("#knob-bucket_cap_mb").value = "50"
            screen.query_one("#knob-script_steps").value = "8"  # the second run ends by itself
            await pilot.pause()
            await pilot.press("ctrl+s")
            await pilot.pause()
            await pilot.press("y")  # the first run is live: ctrl+s asks before ending it
            await wait_for(pilot, lambda: len(bench.sessions) == 2, 40, "a second run")
            second = bench.sessions[1]
            await wait_for(pilot, lambda: second.state.status == "completed", 90, "the second run to complete")
            assert first.state.status == "stopped"
            assert second.state.command == cmd
            info = rank_info(second)
            assert info["ddp_set"] == "static_graph False->True, bucket_cap_mb 25->50"
            assert (info["static_graph"], info["bucket_cap_mb"], info["gradient_as_bucket_view"]) == (True, 50, False)
            assert {rs.steps for rs in second.state.ranks.values()} == {2 + 8}
            summary = json.loads((Path(second.run_dir) / "summary.json").read_text())
            assert summary["config"]["ddp_apply"] == "static_graph,bucket_cap_mb"
            assert "ddptop set static_graph False->True, bucket_cap_mb 25->50" in final_report(summary, "")
            await pilot.press("3")
            await pilot.pause(0.3)
            table = app.query_one("#runs-table")
            assert table.row_count == 2
            headers = [str(c.label) for c in table.columns.values()]
            speed = [str(table.get_row_at(i)[headers.index("speedup")]) for i in range(2)]
            assert speed[0] == "1.00x (ref)" and float(speed[1].rstrip("x")) > 0, speed
            await pilot.press("q")
            await pilot.pause()

    asyncio.run(main())


@pytest.mark.e2e
def test_a_script_that_reports_tokens_gets_tokens_per_s_in_its_summary_and_the_sweep_table(tmp_path):
    res = subprocess.run(
        [sys.executable, "-m", "ddptop", "--nproc", "2", "--headless", "--json", "--steps", "10", "--warmup", "2",
         "--runs-dir", str(tmp_path), "--", sys.executable, str(SCRIPT), "--tokens", "32"],
        capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    summary = json.loads(res.stdout.strip().splitlines()[-1])
    # 32 tokens a sample, reported once a step through Probe.tick(tokens=...); samples from the batch
    assert summary["tokens_per_s"] == pytest.approx(32 * summary["samples_per_s"], rel=0.02)
    assert [r["steps"] for r in summary["ranks"]] == [12, 12]  # tick() and the instrument: one count
    assert " tokens/s  step p50" in res.stdout
    from ddptop.commands.sweep_table import build_rows, markdown_table

    assert "tokens/s" in markdown_table(build_rows([{**summary, "status": "completed"}]))
