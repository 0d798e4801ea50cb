"""Issue 21's usability fixes, driven through the pilot with scripted state: destructive
keys ask first and Ctrl-C behaves like `q`; the settings screen says what is wrong with
what was typed; the alert row keeps its place; the selected rank keeps its phase bar."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from rich.style import Style
from test_web import LiveSession
from textual.color import Color
from textual.strip import Strip
from textual.widgets import Input, Label, RichLog

from ddptop.model.config import RunConfig
from ddptop.model.snapshot import snapshot
from ddptop.model.state import RunState, Stall
from ddptop.tui.app import DdpTopApp
from ddptop.tui.screens.confirm_screen import ConfirmScreen
from ddptop.tui.screens.settings_screen import SettingsScreen
from ddptop.tui.synthetic import StaticSession, synthetic_state, synthetic_workbench
from ddptop.tui.widgets.lines_view import LinesView
from ddptop.tui.widgets.log_view import LogView
from ddptop.tui.widgets.rank_table import RankTable
from ddptop.tui.widgets.run_alerts import ALERT_ROWS, RunAlerts


def live_app(tmp_path: Path, live: bool = True) -> tuple[DdpTopApp, StaticSession, list[str]]:
    """The app on a scripted 2-rank run (live or ended); its restarts are recorded, not run."""
    state = synthetic_state(2)
    bench = synthetic_workbench(state, tmp_path)
    if live:
        bench.sessions[-1] = LiveSession(state, state.config,  # type: ignore[call-overload]
                                         tmp_path / state.run_id)
    app = DdpTopApp(bench, autostart=False, refresh_s=3600)
    restarts: list[str] = []
    app.restart = lambda config=None, reason="": restarts.append(reason)  # type: ignore[method-assign]
    return app, bench.sessions[-1], restarts


def synthetic_app(tmp_path: Path, ranks: int, **kwargs: object) -> tuple[DdpTopApp, RunState]:
    """The app on a scripted run of `ranks` ranks (synthetic_state's options), not started."""
    state = synthetic_state(ranks, **kwargs)  # type: ignore[arg-type]
    return DdpTopApp(synthetic_workbench(state, tmp_path), autostart=False, refresh_s=3600), state


def screen_text(app: DdpTopApp) -> str:
    return "\n".join(strip.text for strip in app.screen._compositor.render_strips())


def notices(app: DdpTopApp) -> list[str]:
    return [str(n.message) for n in app._notifications]


# --- 1. destructive keys ask first ----------------------------------------------------------


def test_x_asks_before_stopping_a_live_run_and_n_cancels(tmp_path: Path) -> None:
    async def main() -> None:
        app, session, _ = live_app(tmp_path)
        async with app.run_test(size=(80, 24)) as pilot:
            await pilot.press("x")
            await pilot.pause()
            assert isinstance(app.screen, ConfirmScreen)
            assert "Stop the live run?" in app.screen.question
            await pilot.press("n")  # changed our mind
            await pilot.pause()
            assert app.screen is app.screen_stack[0]
            assert session.stops is None and app.workbench.is_live()

            await pilot.press("x")
            await pilot.press("y")
            await pilot.pause()
            assert app.screen is app.screen_stack[0]
            assert session.stops == ["stopped by user"]

    asyncio.run(main())


def test_a_refresh_tick_while_the_app_exits_is_harmless(tmp_path: Path) -> None:
    """A refresh that falls between exit() and the end of the app finds no views (CI caught
    `NoMatches: RunHeader` from the timer in that gap after `q`)."""

    async def main() -> None:
        app, _, _ = live_app(tmp_path, live=False)
        async with app.run_test(size=(80, 24)) as pilot:
            await pilot.press("q")  # nothing live: quits at once
        app.refresh_views(force_runs=True)  # the views are gone: raised NoMatches before

    asyncio.run(main())


def test_shift_r_asks_before_restarting_a_live_run_but_not_an_ended_one(tmp_path: Path) -> None:
    """R, not n (issue 31: n is 'next match' in the logs, and on the ranks tab it offered to
    restart the run)."""
    async def main() -> None:
        app, _, restarts = live_app(tmp_path)
        async with app.run_test(size=(80, 24)) as pilot:
            await pilot.press("n")  # nothing on the ranks tab
            await pilot.pause()
            assert app.screen is app.screen_stack[0]
            await pilot.press("R")
            await pilot.pause()
            assert isinstance(app.screen, ConfirmScreen)
            await pilot.press("escape")
            await pilot.pause()
            assert app.screen is app.screen_stack[0] and restarts == []
            await pilot.press("R")
            await pilot.press("y")
            await pilot.pause()
            assert restarts == ["run again"]

        app, _, restarts = live_app(tmp_path, live=False)
        async with app.run_test(size=(80, 24)) as pilot:
            await pilot.press("R")  # nothing live to lose: no question
            await pilot.pause()
            assert app.screen is app.screen_stack[0] and restarts == ["run again"]
            await pilot.press("x")
            await pilot.pause()
            assert app.screen is app.screen_stack[0]
            assert "no live run to stop" in notices(app)

    asyncio.run(main())


def test_ctrl_c_asks_like_q_instead_of_textuals_notice(tmp_path: Path) -> None:
    async def main() -> None:
        app, session, _ = live_app(tmp_path)
        async with app.run_test(size=(80, 24)) as pilot:
            await pilot.press("ctrl+c")
            await pilot.pause()
            assert isinstance(app.screen, ConfirmScreen)
            assert "Stop it and quit ddptop?" in app.screen.question
            assert not any("to quit" in n for n in notices(app))  # not Textual's hint
            await pilot.press("n")
            await pilot.pause()
            assert app.is_running and session.stops is None

        app, _, _ = live_app(tmp_path, live=False)
        async with app.run_test(size=(80, 24)) as pilot:
            await pilot.press("ctrl+c")  # nothing live: leaves at once, as `q` does
            await pilot.pause()
            assert not app.is_running

    asyncio.run(main())


# --- 2. the settings screen says what is wrong with what was typed -------------------------


def test_settings_keep_letters_typed_in_number_fields_mark_them_and_say_why(tmp_path: Path) -> None:
    results: list[RunConfig | None] = []

    async def main() -> None:
        app, _, _ = live_app(tmp_path, live=False)
        async with app.run_test(size=(80, 24)) as pilot:
            screen = SettingsScreen(RunConfig(nproc=2, steps=400, warmup=2, workers=0))
            await app.push_screen(screen, results.append)
            await pilot.pause()
            steps, help_line = screen.query_one("#knob-steps", Input), screen.query_one("#help-steps")
            steps.focus()
            steps.value = ""
            await pilot.press("1", "2", "x")
            await pilot.pause()
            assert steps.value == "12x"  # kept, not dropped
            assert steps.has_class("bad")
            assert "steps: '12x' is not a whole number" in str(help_line.render())
            await pilot.press("ctrl+s")  # refused, with the same reason
            await pilot.pause()
            assert app.screen is screen
            assert "'12x' is not a whole number" in str(screen.query_one("#settings-error").render())
            assert not any("valid" in n for n in notices(app))

            steps.value = ""
            await pilot.pause()
            assert "steps is empty: type a whole number" in str(help_line.render())
            await pilot.press("ctrl+s")
            await pilot.pause()
            assert app.screen is screen
            assert "steps is empty" in str(screen.query_one("#settings-error").render())

            await pilot.press("5", "0")
            await pilot.pause()
            assert not steps.has_class("bad") and "optimizer steps" in str(help_line.render())

            lr = screen.query_one("#knob-lr", Input)
            lr.value = "0.1e"
            await pilot.pause()
            assert lr.has_class("bad")
            assert "lr: '0.1e' is not a number" in str(screen.query_one("#help-lr").render())
            lr.value = "0.05"

            env = screen.query_one("#knob-nccl_env", Input)
            env.value = "garbage"
            await pilot.pause()
            assert env.has_class("bad")
            assert "NAME=VALUE" in str(screen.query_one("#help-nccl_env").render())
            await pilot.press("ctrl+s")
            await pilot.pause()
            said = str(screen.query_one("#settings-error").render())
            assert "nccl_env wants NAME=VALUE pairs" in said and "'garbage'" in said
            assert "not a valid dict" not in said
            env.value = "NCCL_ALGO=Ring"
            await pilot.pause()
            assert not env.has_class("bad")
            await pilot.press("ctrl+s")
            await pilot.pause()
            assert app.screen is not screen

    asyncio.run(main())
    (config,) = results
    assert config is not None and (config.steps, config.lr, config.nccl_env) == (
        50, 0.05, {"NCCL_ALGO": "Ring"})


def test_settings_focused_field_stands_out(tmp_path: Path) -> None:
    def contrast(a: Color, b: Color) -> int:
        return abs(a.r - b.r) + abs(a.g - b.g) + abs(a.b - b.b)

    async def main() -> None:
        app, _, _ = live_app(tmp_path, live=False)
        async with app.run_test(size=(120, 40)) as pilot:
            screen = SettingsScreen(RunConfig(nproc=2))
            await app.push_screen(screen)
            await pilot.pause()
            steps, seed = screen.query_one("#knob-steps", Input), screen.query_one("#knob-seed", Input)
            steps.focus()
            await pilot.pause()
            focused, other = steps.background_colors[1], seed.background_colors[1]
            assert contrast(focused, other) >= 60, (focused, other)
            row_names = [lbl for lbl in screen.query(".knob-name") if str(lbl.render()) in ("steps", "seed")]
            bold = {str(lbl.render()): bool(lbl.styles.text_style.bold) for lbl in row_names}
            assert bold == {"steps": True, "seed": False}

    asyncio.run(main())


# --- 3. the alert slot keeps its height -----------------------------------------------------


def test_alerts_that_come_and_go_do_not_move_the_views(tmp_path: Path) -> None:
    state = synthetic_state(4, slow_rank=None)  # nothing to say at first
    assert state.straggler() is None and not state.notes

    async def main() -> None:
        app = DdpTopApp(synthetic_workbench(state, tmp_path), autostart=False, refresh_s=3600)
        async with app.run_test(size=(80, 24)) as pilot:
            def table_top() -> int:
                return app.query_one(RankTable).region.y

            app.refresh_views()
            await pilot.pause()
            quiet = table_top()
            assert app.query_one(RunAlerts).region.height == ALERT_ROWS
            assert "▲" not in str(app.query_one(RunAlerts).render())

            state.notes.append("exposed comm only: nccl_timing is off")
            app.refresh_views()
            await pilot.pause()
            assert "exposed comm only" in screen_text(app) and table_top() == quiet

            # A stall (two lines) on top of the note: the slot keeps its rows, counts the rest.
            state.stall = Stall(since=time.time() - 12, bound_s=10.0, last_steps={r: 9 for r in range(4)},
                                suspects=[2], stacks={})
            app.refresh_views()
            await pilot.pause()
            text = screen_text(app)
            assert "STALLED" in text and "(+1 more)" in text and table_top() == quiet

            state.stall = None
            state.notes.clear()
            app.refresh_views()
            await pilot.pause()
            assert "STALLED" not in screen_text(app) and table_top() == quiet

    asyncio.run(main())


# --- 4. the selected rank keeps its phase bar -----------------------------------------------


def test_the_selected_rank_row_keeps_its_phase_bar_colours(tmp_path: Path) -> None:
    def cells(strip: Strip) -> list[tuple[str, Style]]:
        return [(ch, seg.style or Style()) for seg in strip for ch in seg.text]

    async def main() -> None:
        app = DdpTopApp(synthetic_workbench(synthetic_state(2), tmp_path), autostart=False,
                        refresh_s=3600)
        async with app.run_test(size=(120, 40)) as pilot:
            app.refresh_views()
            await pilot.pause()
            body = app.query_one("#rank-rows", LinesView)
            assert body.has_focus and body.cursor == 0
            selected = cells(body.render_line(0))
            await pilot.press("down")  # rank 1 selected: rank 0's row as everyone else sees it
            await pilot.pause()
            assert body.cursor == 1
            plain = cells(body.render_line(0))
            assert "".join(c for c, _ in selected) == "".join(c for c, _ in plain)
            bar = [i for i, (c, _) in enumerate(plain) if c == "█"]
            assert len(bar) >= 8
            bar_colours = {plain[i][1].color for i in bar}
            assert len(bar_colours) >= 3  # data, forward, backward, ... each its own colour
            # the selection changes the background only: every block keeps its phase colour
            assert [selected[i][1].color for i in bar] == [plain[i][1].color for i in bar]
            assert selected[0][1].bgcolor != plain[0][1].bgcolor  # and it is still seen

    asyncio.run(main())


# --- sorting the rank table (htop's < and >, i inverts, a click on a title) ------------------


def _rank_order(app: DdpTopApp) -> list[int]:
    rows = app.query_one(RankTable).row_texts()
    return [int(row[:4].strip(" ▲")) for row in rows]


def test_sorting_by_p50_puts_the_slowest_rank_first_and_i_inverts(tmp_path: Path) -> None:
    async def main() -> None:
        app, state = synthetic_app(tmp_path, 4, slow_rank=2)
        async with app.run_test(size=(120, 40)) as pilot:
            app.refresh_views()
            await pilot.pause()
            assert _rank_order(app) == [0, 1, 2, 3]
            table = app.query_one(RankTable)
            for _ in range(3):  # rank -> host/device -> step -> p50
                await pilot.press("greater_than_sign")
            await pilot.pause()
            assert table.sort_key == "p50" and table.sort_descending
            order = _rank_order(app)
            assert order[0] == 2 and order[0] == snapshot(state, time.time()).slowest
            header = str(table.query_one("#rank-header").render())
            assert "p50 ms↓" in header and table.sort_label() == "p50 ms ↓"  # the arrow on the column, not the title
            await pilot.press("i")
            await pilot.pause()
            assert _rank_order(app)[-1] == 2
            await pilot.press("less_than_sign", "less_than_sign", "less_than_sign")
            await pilot.pause()
            assert table.sort_key == "rank" and _rank_order(app) == [0, 1, 2, 3]

    asyncio.run(main())


def test_a_click_on_a_column_title_sorts_by_it(tmp_path: Path) -> None:
    async def main() -> None:
        app, state = synthetic_app(tmp_path, 4, slow_rank=3)
        async with app.run_test(size=(120, 40)) as pilot:
            app.refresh_views()
            await pilot.pause()
            header = app.query_one("#rank-header")
            # inside "own ms": the slow rank's own work is the most (its step p50 is the
            # others', who wait for it in the all-reduce)
            x = str(header.render()).index("own ms") + 1
            await pilot.click(header, offset=(x, 0))
            await pilot.pause()
            assert _rank_order(app)[0] == 3
            await pilot.click(header, offset=(x, 0))  # the same title again: inverted
            await pilot.pause()
            assert _rank_order(app)[-1] == 3

    asyncio.run(main())


# --- searching and filtering the logs -------------------------------------------------------


def test_slash_searches_the_logs_highlights_matches_and_n_moves_between_them(tmp_path: Path) -> None:
    async def main() -> None:
        state = synthetic_state(2)
        state.logs.clear()
        for i in range(30):
            state.add_log(i % 2, f"step {i} loss 0.{i:02d}")
        state.add_log(0, "node0:1 NCCL INFO Channel 00 : 0[0] -> 1[1] via P2P/CUMEM")
        state.add_log(1, "UserWarning: grad strides do not match bucket view strides")
        state.add_log(1, "RuntimeError: CUDA error: an illegal memory access")
        app = DdpTopApp(synthetic_workbench(state, tmp_path), autostart=False, refresh_s=3600)
        async with app.run_test(size=(120, 40)) as pilot:
            await pilot.press("4")  # the logs tab
            app.refresh_views()
            await pilot.pause()
            view = app.query_one(LogView)
            await pilot.press("slash", *"loss 0.1", "enter")
            await pilot.pause()
            assert view.search == "loss 0.1"
            matches = view.matches
            assert sorted(view._shown[i][1] for i in matches) == [f"step {i} loss 0.{i:02d}" for i in range(10, 20)]
            assert view.match_index == 0
            log = app.query_one("#log", RichLog)
            highlighted = [s for s in log.lines[matches[0]] if s.style and s.style.bgcolor is not None]
            assert "".join(s.text for s in highlighted) == "loss 0.1"
            assert "match 1 of 10" in str(app.query_one("#log-hint", Label).render())
            await pilot.press("n", "n")
            assert view.match_index == 2
            await pilot.press("N")
            assert view.match_index == 1
            await pilot.press("escape")  # search cleared: n goes back to the app (run again)
            assert view.search == "" and view.matches == []

            await pilot.press("k")  # NCCL lines only
            await pilot.pause()
            assert [line for _, line in view._shown] == [
                "node0:1 NCCL INFO Channel 00 : 0[0] -> 1[1] via P2P/CUMEM"]
            await pilot.press("k", "k")  # warnings, then errors
            await pilot.pause()
            assert [line for _, line in view._shown] == ["RuntimeError: CUDA error: an illegal memory access"]
            await pilot.press("k")  # all lines
            await pilot.press("f", "f", "f")  # all -> ddptop -> r0 -> r1 ... the ddptop filter
            await pilot.pause()

    asyncio.run(main())


def test_an_empty_log_filter_says_so(tmp_path: Path) -> None:
    async def main() -> None:
        state = synthetic_state(2)
        state.logs.clear()
        state.add_log(0, "hello from rank 0")
        app = DdpTopApp(synthetic_workbench(state, tmp_path), autostart=False, refresh_s=3600)
        async with app.run_test(size=(120, 40)) as pilot:
            await pilot.press("4")
            app.refresh_views()
            await pilot.pause()
            await pilot.press("f", "f", "f")  # all ranks -> ddptop -> r0 -> r1, which said nothing
            await pilot.pause()
            log = app.query_one("#log", RichLog)
            assert [strip.text for strip in log.lines] == ["(no lines from r1 yet)"]

    asyncio.run(main())


def test_the_phase_bar_grows_with_the_terminal(tmp_path: Path) -> None:
    async def widths() -> list[int]:
        out = []
        for size in ((80, 24), (120, 40), (200, 60)):
            app, state = synthetic_app(tmp_path, 2)
            async with app.run_test(size=size) as pilot:
                app.refresh_views()
                await pilot.pause()
                out.append(app.query_one(RankTable).bar_width())
        return out

    w80, w120, w200 = asyncio.run(widths())
    assert 8 <= w80 < w120 < w200 and w200 - w120 >= 70


def test_ctrl_s_asks_before_ending_a_live_run_and_n_keeps_it(tmp_path: Path) -> None:
    async def main() -> None:
        app, session, restarts = live_app(tmp_path)
        async with app.run_test(size=(120, 40)) as pilot:
            await pilot.press("s")
            await pilot.pause()
            assert isinstance(app.screen, SettingsScreen)
            await pilot.press("ctrl+s")
            await pilot.pause()
            assert isinstance(app.screen, ConfirmScreen) and "Stop the live run" in app.screen.question
            await pilot.press("n")  # changed our mind: the run goes on, nothing restarted
            await pilot.pause()
            assert app.screen is app.screen_stack[0] and app.workbench.is_live()
            await pilot.press("s")
            await pilot.pause()
            await pilot.press("ctrl+s")
            await pilot.pause()
            await pilot.press("y")
            await pilot.pause()
            assert len(restarts) == 1

    asyncio.run(main())


def test_a_capture_over_before_the_viewer_came_is_not_news_but_a_new_one_is(tmp_path: Path) -> None:
    """On attach, an old 'capture 1 done' popped up again (issue 21)."""
    from ddptop.analysis.capture import Capture
    from ddptop.tui.messages import CaptureEnded

    async def main() -> list[CaptureEnded]:
        app, state = synthetic_app(tmp_path, 2)
        state.captures[1] = Capture(1, 10, 3, "torch", str(tmp_path), status="done")
        seen: list = []
        async with app.run_test(size=(120, 40), message_hook=seen.append) as pilot:
            app.refresh_views()  # the first sight of the run: capture 1 is history
            await pilot.pause()
            state.captures[2] = Capture(2, 20, 3, "torch", str(tmp_path), status="recording")
            app.refresh_views()
            state.captures[2].status = "done"
            app.refresh_views()  # this one ended while we watched: news
            await pilot.pause()
        return [m for m in seen if isinstance(m, CaptureEnded)]

    ended = asyncio.run(main())
    assert [(m.capture_id, m.status) for m in ended] == [(2, "done")]


def test_the_footer_fits_80_columns_on_every_tab_and_screen(tmp_path: Path) -> None:
    """Priority keys only (issue 21: at 80x24 the footer was cut to 'c Captu▏'); the rest
    are in ? and the palette (ctrl+p)."""

    def footer(app: DdpTopApp) -> str:
        return [strip.text for strip in app.screen._compositor.render_strips()][-1]

    async def main() -> dict[str, str]:
        app, _ = synthetic_app(tmp_path, 2)
        seen = {}
        async with app.run_test(size=(80, 24)) as pilot:
            app.refresh_views()
            for tab in "123456":
                await pilot.press(tab)
                await pilot.pause()
                seen[tab] = footer(app)
            await pilot.press("1", "enter")
            await pilot.pause()
            seen["detail"] = footer(app)
            await pilot.press("escape", "s")
            await pilot.pause()
            seen["settings"] = footer(app)
        return seen

    seen = asyncio.run(main())
    for where, line in seen.items():
        assert "▏" not in line and line.rstrip().endswith(("? Help", "Next rank", "esc Cancel")), (where, line)
    assert "⏎ Detail" in seen["1"] and "/ Search" in seen["4"] and "e Export" in seen["3"]
