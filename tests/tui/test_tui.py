"""The Textual front end: real 2-rank CPU runs driven through the pilot (ranks
appear and step, settings apply and restart, the runs table compares, quitting
leaves no process), a capture window from the `c` key, layout with scripted state at 80x24 and 64 ranks, and the
import boundary (the UI never imports torch)."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace

import psutil
import pytest
from rich.text import Text
from waiting import poll

from ddptop.commands.trace import read_trace
from ddptop.model.config import PRESETS, RunConfig, preset_config
from ddptop.tui.app import DdpTopApp
from ddptop.tui.factory import build_app
from ddptop.tui.messages import CaptureEnded, RunEnded, RunStarted, SettingsApplied
from ddptop.tui.render import fit_columns, wrap_text
from ddptop.tui.screens.confirm_screen import ConfirmScreen
from ddptop.tui.screens.help_screen import HelpScreen
from ddptop.tui.screens.settings_screen import SettingsScreen, knob_names
from ddptop.tui.synthetic import synthetic_gpu_sample, synthetic_state, synthetic_workbench
from ddptop.tui.widgets.captures_panel import CapturesPanel
from ddptop.tui.widgets.gpu_panel import GpuPanel
from ddptop.tui.widgets.lines_view import LinesView
from ddptop.tui.widgets.log_view import LogView
from ddptop.tui.widgets.rank_table import RankTable
from ddptop.tui.widgets.runs_panel import RunsPanel

FIXTURES = Path(__file__).parents[1] / "fixtures"
START_TIMEOUT = 60.0  # torch import in two ranks on a 2-core box: ~8 s, more under load


def screen_text(app: DdpTopApp) -> str:
    return "\n".join(strip.text for strip in app.screen._compositor.render_strips())


async def wait_for(pilot, predicate: Callable[[], bool], timeout: float, what: str) -> None:  # noqa: ANN001
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")
        await pilot.pause(0.2)


def cpu_config(preset: str = "baseline", steps: int = 400) -> RunConfig:
    return preset_config(preset, RunConfig(nproc=2, steps=steps, warmup=2, workers=0))


def step_of(app: DdpTopApp, rank: int) -> int:
    """The step the ranks table shows for `rank` (read from the screen's rows)."""
    row = app.query_one(RankTable).row_texts()[rank].split()
    return int(row[2]) if row[2].isdigit() else -1


def alive_of(pids: list[int]) -> list[int]:
    """The pids still running (zombies and gone ones do not count)."""
    alive = []
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                alive.append(pid)
        except psutil.NoSuchProcess:
            pass
    return alive


def no_processes_left(pids: list[int]) -> bool:
    return not alive_of(pids)


# --- real runs ---------------------------------------------------------------------------


@pytest.mark.e2e
@pytest.mark.slow  # the suite stays under 10 min on 2 cores: `pytest -m slow` runs it (covered: test_user_settings' ctrl+s restart, test_restart_race)
def test_live_run_then_settings_restart_then_runs_table(tmp_path: Path) -> None:
    seen: list[object] = []

    async def main() -> None:
        app = build_app(cpu_config(steps=400), tmp_path)
        async with app.run_test(size=(120, 40), message_hook=seen.append) as pilot:
            bench = app.workbench
            await wait_for(pilot, lambda: len(app.query_one(RankTable).row_texts()) == 2,
                           10, "a row per rank")
            await wait_for(pilot, lambda: min(step_of(app, 0), step_of(app, 1)) > 0,
                           START_TIMEOUT, "both ranks stepping")
            first = [step_of(app, 0), step_of(app, 1)]
            await wait_for(pilot, lambda: step_of(app, 0) > first[0] and step_of(app, 1) > first[1],
                           20, "step counts rising")
            assert "vm/cpu" in screen_text(app) or "/cpu" in screen_text(app)
            assert "running" in screen_text(app)

            # Settings: keyboard only. The preset select has focus; pick `view`.
            await pilot.press("s")
            assert isinstance(app.screen, SettingsScreen)
            names = list(PRESETS)
            await pilot.press("enter")
            for _ in range(names.index("view") - names.index("baseline")):
                await pilot.press("down")
            await pilot.press("enter")
            await pilot.pause()
            assert app.screen.query_one("#knob-preset").value == "view"
            assert app.screen.query_one("#knob-static_graph").value is True
            steps_input = app.screen.query_one("#knob-steps")
            steps_input.value = "120"  # keep the second run short
            await pilot.press("ctrl+s")
            await pilot.pause()
            assert isinstance(app.screen, ConfirmScreen)  # the live run ends: asked first
            await pilot.press("y")
            await pilot.pause()
            assert not isinstance(app.screen, (SettingsScreen, ConfirmScreen))

            await wait_for(pilot, lambda: len(bench.sessions) == 2, 40, "a second run")
            first_run, second_run = bench.sessions
            assert first_run.state.status == "stopped"  # stopped cleanly, not failed
            assert second_run.config.preset == "view" and second_run.config.steps == 120
            assert second_run.config.static_graph and second_run.config.gradient_as_bucket_view
            await wait_for(pilot, lambda: second_run.state.status == "completed",
                           START_TIMEOUT + 30, "the second run to complete")

            await pilot.press("3")
            await pilot.pause(0.3)
            table = app.query_one(RunsPanel).table
            assert table.row_count == 2
            headers = [str(c.label) for c in table.columns.values()]
            assert "speedup" in headers
            speed = [str(table.get_row_at(i)[headers.index("speedup")]) for i in range(2)]
            assert speed[0] == "1.00x (ref)"  # the baseline run is the reference
            assert speed[1].endswith("x") and float(speed[1].rstrip("x")) > 0

            # Export the comparison as Markdown into the runs directory.
            await pilot.press("e")
            await pilot.pause()
            exported = list(tmp_path.glob("runs-*.md"))
            assert len(exported) == 1
            text = exported[0].read_text()
            assert "speedup" in text.splitlines()[0]
            assert first_run.run_id in text and second_run.run_id in text

            await pilot.press("q")  # nothing live: quits without asking
            await pilot.pause()
        assert not app.is_running

    asyncio.run(main())
    assert any(isinstance(m, SettingsApplied) for m in seen)
    assert sum(isinstance(m, RunStarted) for m in seen) == 2
    ended = [m for m in seen if isinstance(m, RunEnded)]
    assert [m.status for m in ended] == ["stopped", "completed"]
    summaries = [json.loads((d / "summary.json").read_text()) for d in sorted(tmp_path.iterdir())
                 if d.is_dir()]
    assert [s["preset"] for s in summaries] == ["baseline", "view"]


# slow-marked: test_pty's x-then-q stops a real run from a real terminal, and
# test_tui_keys_state checks that quit asks from the key and the palette
@pytest.mark.e2e
@pytest.mark.slow
def test_quit_asks_then_stops_the_run_and_leaves_no_process(tmp_path: Path) -> None:
    async def main() -> list[int]:
        app = build_app(cpu_config(steps=100000), tmp_path)
        async with app.run_test(size=(80, 24)) as pilot:
            state = app.workbench.current.state
            await wait_for(pilot, lambda: all(rs.last_step > 5 for rs in state.ranks.values()),
                           START_TIMEOUT, "both ranks stepping")
            # the whole tree of this run: its supervisor, torchrun, both ranks (and any
            # DataLoader workers)
            pids = [p.pid for p in app.workbench.current.processes()]
            assert len(pids) >= 4

            await pilot.press("q")
            assert isinstance(app.screen, ConfirmScreen)
            await pilot.press("n")  # changed our mind: the run goes on
            await pilot.pause()
            assert not isinstance(app.screen, ConfirmScreen) and app.workbench.is_live()

            await pilot.press("q")
            await pilot.press("y")
            await wait_for(pilot, lambda: not app.is_running, 40, "the app to exit")
        assert state.status == "stopped"
        return pids

    pids = asyncio.run(main())
    poll(lambda: no_processes_left(pids), 10)
    assert alive_of(pids) == []


@pytest.mark.e2e
def test_c_captures_the_next_three_steps_on_every_rank(tmp_path: Path) -> None:
    seen: list[object] = []

    async def main() -> None:
        app = build_app(cpu_config(steps=100000), tmp_path)
        async with app.run_test(size=(120, 40), message_hook=seen.append) as pilot:
            state = app.workbench.current.state
            await wait_for(pilot, lambda: all(rs.last_step > 5 for rs in state.ranks.values()),
                           START_TIMEOUT, "both ranks stepping")
            await pilot.press("c")
            await wait_for(pilot, lambda: len(state.captures) == 1, 10, "the capture request")
            # each snapshot from the supervisor brings new objects: look the capture up again
            await wait_for(pilot, lambda: state.captures[1].status in ("done", "failed"), 60,
                           "the capture")
            cap = state.captures[1]
            assert cap.status == "done", cap.error
            assert cap.count == 3
            await pilot.press("6")
            await pilot.pause(0.2)
            app.refresh_views()
            await pilot.pause()
            text = app.query_one(CapturesPanel).text()
            assert f"#1  steps {cap.steps}  torch  done" in text
            assert sorted(cap.files) == [0, 1]
            for rank in (0, 1):
                (path,) = cap.files[rank]  # one trace file per rank
                assert Path(path).is_file() and read_trace(path)["traceEvents"]
                assert f"r{rank} {path}" in text
                steps = cap.summary["ranks"][str(rank)]["steps"]
                assert steps == list(range(cap.start, cap.start + 3))  # exactly 3 consecutive
                assert f"r{rank}  comm " in text and f"steps {cap.steps} (3)" in text
            await pilot.press("q")
            await pilot.press("y")
            await wait_for(pilot, lambda: not app.is_running, 40, "the app to exit")

    asyncio.run(main())
    ended = [m for m in seen if isinstance(m, CaptureEnded)]
    assert [(m.capture_id, m.status) for m in ended] == [(1, "done")]


# --- scripted state: layout and views ------------------------------------------------------


def synthetic_app(n_ranks: int, tmp_path: Path, **state_kw: object) -> tuple[DdpTopApp, object]:
    state = synthetic_state(n_ranks, **state_kw)
    return DdpTopApp(synthetic_workbench(state, tmp_path), autostart=False, refresh_s=3600), state


def test_eight_ranks_fit_in_80x24_and_64_scroll(tmp_path: Path) -> None:
    async def main() -> None:
        app, _ = synthetic_app(8, tmp_path)
        async with app.run_test(size=(80, 24)) as pilot:
            app.refresh_views()
            await pilot.pause()
            text = screen_text(app)
            for r in range(8):
                assert f"node0/cuda:{r}" in text, f"rank {r} not visible at 80x24"
            assert "▲1" in text  # the slowed rank is marked slowest
            assert "exposed" in text  # comm timing present: the exposed comm part in the legend
            assert all(len(line) <= 80 for line in text.splitlines())

        app, _ = synthetic_app(64, tmp_path)
        async with app.run_test(size=(80, 24)) as pilot:
            app.refresh_views()
            await pilot.pause()
            body = app.query_one("#rank-rows", LinesView)
            assert len(body.lines) == 64
            assert body.max_scroll_y > 0
            assert "node7/cuda:7" not in screen_text(app)
            await pilot.press("end")
            await pilot.pause()
            assert "node7/cuda:7" in screen_text(app)

    asyncio.run(main())


def test_gpu_panel_with_nvml_sample_and_without(tmp_path: Path) -> None:
    async def main() -> None:
        app, state = synthetic_app(4, tmp_path)
        state.gpu_unavailable = "NVML library not found"
        async with app.run_test(size=(120, 40)) as pilot:
            await pilot.press("2")
            app.refresh_views()
            await pilot.pause()
            text = screen_text(app)
            assert "no NVML: NVML library not found" in text
            assert "CPU %" in text and "RSS" in text

            # A sample shaped like the recorded NVML snapshot (fields read by name).
            snap = json.loads((FIXTURES / "gpu" / "nvml_snapshot.json").read_text())
            gpus = [SimpleNamespace(**{**g, "util_pct": 87, "mem_used": 40 * 2**30,
                                       "processes": [SimpleNamespace(pid=20000 + g["index"])]})
                    for g in snap["gpus"]]
            state.gpu = SimpleNamespace(t=1.0, gpus=gpus, driver=snap["driver"])
            state.gpu_history.extend([synthetic_gpu_sample(4, t=0.0), state.gpu])
            app.refresh_views()
            await pilot.pause()
            text = screen_text(app)
            assert "no NVML" not in text
            assert "NVIDIA H200" in text and "87 %" in text and "34 C" in text
            assert "124/700 W" in text  # power from power_mw / power_limit_mw
            assert "18 links" in text  # NVLink from the per-link states
            table = app.query_one(GpuPanel).query_one("#gpu-table")
            ranks_col = [str(c.label) for c in table.columns.values()].index("ranks")
            assert [str(table.get_row_at(i)[ranks_col]) for i in range(4)] == ["0", "1", "2", "3"]

    asyncio.run(main())


def test_settings_screen_has_every_knob_validates_and_marks_custom(tmp_path: Path) -> None:
    results: list[RunConfig | None] = []

    async def main() -> None:
        app, _ = synthetic_app(2, tmp_path)
        async with app.run_test(size=(80, 24)) as pilot:
            screen = SettingsScreen(cpu_config())
            await app.push_screen(screen, results.append)
            await pilot.pause()
            for name in knob_names():
                assert screen.query(f"#knob-{name}"), f"no control for {name}"
            # Hand-tuning a DDP knob means the config is no longer the preset.
            screen.query_one("#knob-bucket_cap_mb").value = "50"
            await pilot.pause()
            assert screen.query_one("#knob-preset").value == "custom"
            # A bad value stays on the screen with a one-line reason.
            screen.query_one("#knob-steps").value = "0"
            await pilot.press("ctrl+s")
            await pilot.pause()
            assert app.screen is screen
            assert "steps must be at least 1" in str(screen.query_one("#settings-error").render())
            screen.query_one("#knob-steps").value = "50"
            # nccl_env takes communication settings, not a way to load code into the ranks
            for bad in ("LD_PRELOAD=/tmp/x.so", "PYTHONPATH=/tmp/evil"):
                screen.query_one("#knob-nccl_env").value = bad
                await pilot.press("ctrl+s")
                await pilot.pause()
                assert app.screen is screen
                assert "is not allowed" in str(screen.query_one("#settings-error").render())
            screen.query_one("#knob-nccl_env").value = "NCCL_ALGO=Ring"
            await pilot.press("ctrl+s")
            await pilot.pause()
            assert app.screen is not screen

    asyncio.run(main())
    (config,) = results
    assert config is not None
    assert (config.preset, config.bucket_cap_mb, config.steps) == ("custom", 50.0, 50)
    assert config.nccl_env == {"NCCL_ALGO": "Ring"}


def test_logs_filter_by_rank_and_highlight_nccl(tmp_path: Path) -> None:
    async def main() -> None:
        app, _ = synthetic_app(3, tmp_path)
        async with app.run_test(size=(120, 40)) as pilot:
            await pilot.press("4")
            app.refresh_views()
            await pilot.pause()
            log = app.query_one(LogView).query_one("#log")
            lines = [strip.text for strip in log.lines]
            assert any(line.strip().startswith("r2 │") for line in lines)
            nccl = [s for s in log.lines if "NCCL INFO" in s.text]
            assert nccl and any(seg.style and seg.style.bold for s in nccl for seg in s)
            view = app.query_one(LogView)
            view.query_one("#log-filter").value = 1
            await pilot.pause()
            lines = [strip.text.strip() for strip in log.lines if strip.text.strip()]
            assert lines and all(line.startswith("r1 │") for line in lines)

    asyncio.run(main())


def test_help_palette_and_themes(tmp_path: Path) -> None:
    async def main() -> None:
        app, _ = synthetic_app(2, tmp_path)
        async with app.run_test(size=(80, 24)) as pilot:
            app.refresh_views()
            for tab, key, what in (("1", "q", "Quit"), ("1", "s", "Settings"), ("3", "e", "Export"),
                                   ("4", "f", "Rank")):
                await pilot.press(tab, "question_mark")
                assert isinstance(app.screen, HelpScreen)
                assert "ddptop help" in screen_text(app)
                assert (key, what) in [(k.split()[0], w) for k, w in app.screen.entries() if k], what
                await pilot.press("escape")
            await pilot.press("1")
            assert not isinstance(app.screen, HelpScreen)
            await pilot.press("ctrl+p")
            await pilot.pause()
            assert type(app.screen).__name__ == "CommandPalette"
            await pilot.press("escape")
            dark = app.theme
            await pilot.press("t")
            assert app.theme != dark and "light" in app.theme
            app.refresh_views()
            await pilot.pause()
            assert "▲1" in screen_text(app)
            await pilot.press("q")  # no live run: exits at once
            await pilot.pause()
        assert not app.is_running

    asyncio.run(main())


def test_wrap_text_breaks_at_spaces_and_after_slashes_and_keeps_styles() -> None:
    """What the captures, logs and wiring views wrap with (issue 21: capture paths ended
    `…/rank0.t` at 80 columns and did not scroll)."""
    line = Text.assemble(("    files ", "dim"),
                         "r0 /scratch/ddptop/runs/20260101-120000-overlap-demo/captures/1/rank0.trace.json.gz")
    rows = wrap_text(line, 40)
    assert [r.plain for r in rows] == ["    files r0 /scratch/ddptop/runs/",
                                       "        20260101-120000-overlap-demo/",
                                       "        captures/1/rank0.trace.json.gz"]
    assert rows[0].spans[0].style == "dim"
    assert wrap_text(line, 200) == [line]  # what fits is left alone
    long = wrap_text(Text("see " + "x" * 50 + " end"), 20, hang=4)  # a word wider than a row
    assert all(r.cell_len <= 20 for r in long)
    assert "".join(r.plain[4:] if i else r.plain for i, r in enumerate(long)) == "see " + "x" * 50 + " end"


def test_fit_columns_drops_in_order_and_takes_back_what_fits_again() -> None:
    widths = {"run": 20, "rate": 6, "status": 9, "model": 8, "settings": 40}
    headers = list(widths)
    assert fit_columns(headers, widths, 200, ["model", "settings"]) == headers
    # settings goes (too wide), then model fits again; the order stays the table's
    assert fit_columns(headers, widths, 60, ["model", "settings", "status"]) == ["run", "rate", "status", "model"]
    assert fit_columns(headers, widths, 30, ["model", "settings", "status"]) == ["run", "rate"]


# --- boundaries -----------------------------------------------------------------------------


def test_ui_modules_do_not_import_torch_and_cli_does_not_import_textual() -> None:
    code = (
        "import sys\n"
        "import ddptop.cli\n"
        "assert 'textual' not in sys.modules, 'ddptop.cli imported textual'\n"
        "import ddptop.tui.app, ddptop.run.workbench, ddptop.run.runs, ddptop.tui.synthetic\n"
        "bad = sorted(m for m in sys.modules if m == 'torch' or m.startswith('torch.'))\n"
        "assert not bad, bad\n"
        "print('ok')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"


@pytest.mark.e2e
# SIGHUP is slow-marked: test_pty's terminal-close test sends a real SIGHUP to an owned TUI
@pytest.mark.parametrize("sig", ["SIGTERM", pytest.param("SIGHUP", marks=pytest.mark.slow)])
def test_signal_to_the_tui_stops_the_run_cleanly(tmp_path: Path, sig: str) -> None:
    import os
    import signal

    async def main() -> tuple[list[int], str]:
        app = build_app(cpu_config(steps=100000), tmp_path)
        async with app.run_test(size=(80, 24)) as pilot:
            state = app.workbench.current.state
            await wait_for(pilot, lambda: all(rs.last_step > 3 for rs in state.ranks.values()),
                           START_TIMEOUT, "both ranks stepping")
            pids = [p.pid for p in app.workbench.current.processes()]
            signum = getattr(signal, sig)
            assert signum in app._signals  # else the signal would kill the test process itself
            os.kill(os.getpid(), signum)
            await wait_for(pilot, lambda: not app.is_running, 40, "the app to exit")
        return pids, state.status

    pids, status = asyncio.run(main())
    assert status == "stopped"
    poll(lambda: not alive_of(pids), 10)
    assert alive_of(pids) == []
