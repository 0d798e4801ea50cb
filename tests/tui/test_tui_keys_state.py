"""Issue 31, "must show" 3: the keys an htop/nvitop user tries (a one-screen help that lists
the current tab's keys, h/F1, F3 and /, F6, F10, the palette's quit that asks as q does and
holds our actions only) and the viewer's state on screen: a badge for read-only, detached,
paused and finished, and a footer offering only what the viewer may do then."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from pathlib import Path

from test_tui_one_screen import app_on, screen, scripted_state
from test_web import LiveSession

from ddptop.tui.app import DdpTopApp
from ddptop.tui.screens.choice_screen import ChoiceScreen
from ddptop.tui.screens.confirm_screen import ConfirmScreen
from ddptop.tui.screens.help_screen import HelpScreen
from ddptop.tui.widgets.rank_table import RankTable


@dataclass
class DetachedSession(LiveSession):
    """A supervised run this viewer attached to after it was detached."""

    owner: bool = False
    detached: bool = True

    async def detach(self) -> None:
        pass


def notices(app: DdpTopApp) -> list[str]:
    return [str(n.message) for n in app._notifications]


def footer(app: DdpTopApp) -> str:
    return screen(app).splitlines()[-1]


def test_help_fits_one_screen_at_80x24_and_lists_the_ranks_tab_keys(tmp_path: Path) -> None:
    async def main() -> None:
        app = app_on(scripted_state(), tmp_path)
        async with app.run_test(size=(80, 24)) as pilot:
            app.refresh_views()
            await pilot.press("question_mark")
            await pilot.pause()
            assert isinstance(app.screen, HelpScreen)
            text = screen(app)
            box = app.screen.query_one("#help-box")
            assert box.region.bottom <= 24 and box.max_scroll_y == 0  # one screen, nothing to scroll
            entries = app.screen.entries()
            for key, what in entries:  # every row is on the screen, whole or ending in …
                row = f"{key} " if key else what
                assert row.strip() in text, row
            keys = {k for k, _ in entries}
            for key in ("<", ">", "i I", "⏎", "[", "]", "f6", "/ f3", "h f1 ?", "q f10 ^c"):
                assert key in keys, key
            assert "windows last 50 = each rank's last 50 steps" in text  # the legend on top
            await pilot.press("escape", "4", "f1")  # the logs tab's help lists the logs' keys
            await pilot.pause()
            assert isinstance(app.screen, HelpScreen) and ("f", "Rank") in app.screen.entries()
            await pilot.press("h")  # h closes it again
            assert not isinstance(app.screen, HelpScreen)

    asyncio.run(main())


def test_f3_and_slash_search_the_logs_and_say_where_search_works_elsewhere(tmp_path: Path) -> None:
    async def main() -> None:
        app = app_on(scripted_state(), tmp_path)
        async with app.run_test(size=(80, 24)) as pilot:
            app.refresh_views()
            await pilot.press("slash")
            await pilot.pause()
            assert any("search is in the logs tab" in n for n in notices(app))
            await pilot.press("4", "f3")
            await pilot.pause()
            assert app.focused is not None and app.focused.id == "log-search"

    asyncio.run(main())


def test_f6_sorts_the_ranks_with_the_arrow_on_the_sorted_column(tmp_path: Path) -> None:
    async def main() -> None:
        app = app_on(scripted_state(ranks=4), tmp_path)
        async with app.run_test(size=(120, 40)) as pilot:
            app.refresh_views()
            table = app.query_one(RankTable)
            await pilot.press("f6", "f6", "f6", "f6", "f6")  # rank -> where -> step -> p50 -> p95 -> own
            await pilot.pause()
            assert table.sort_key == "own" and table.sort_descending
            header = str(table.query_one("#rank-header").render())
            assert "own ms↓" in header and "↓" not in table.border_title and "▲" not in header
            assert table.row_texts()[0].split()[0] == "▲1"  # the most own work first
            assert any("ranks sorted by own ms ↓" in n for n in notices(app))

    asyncio.run(main())


def test_f10_quits_like_q_asking_first_while_an_owned_run_is_live(tmp_path: Path) -> None:
    async def main() -> None:
        app = app_on(scripted_state(), tmp_path)
        async with app.run_test(size=(80, 24)) as pilot:
            await pilot.press("f10")
            await pilot.pause()
            assert isinstance(app.screen, ConfirmScreen)
            await pilot.press("escape")
        ended = app_on(scripted_state(), tmp_path / "ended", live=False)
        async with ended.run_test(size=(80, 24)) as pilot:
            await pilot.press("f10")
            await pilot.pause()
        assert not ended.is_running

    asyncio.run(main())


def test_the_palette_holds_our_actions_and_its_quit_asks_like_q(tmp_path: Path) -> None:
    async def main() -> None:
        app = app_on(scripted_state(), tmp_path)
        async with app.run_test(size=(80, 24)) as pilot:
            titles = [c.title for c in app.get_system_commands(app.screen)]
            for ours in ("Quit", "Help", "Sort ranks", "Search logs", "Filter logs by rank", "Pause display",
                         "Capture", "Stop run"):
                assert ours in titles, ours
            assert not {"Keys", "Maximize", "Screenshot"} & set(titles)
            await pilot.press("ctrl+p")
            await pilot.pause()
            await pilot.press(*"quit")
            await pilot.pause(0.3)
            await pilot.press("enter")
            await pilot.pause()
            assert isinstance(app.screen, ConfirmScreen)  # as q asks: a run of ours is live
            assert app.is_running

    asyncio.run(main())


async def _seen(app: DdpTopApp, keys: tuple[str, ...] = ()) -> tuple[str, str]:
    async with app.run_test(size=(80, 24)) as pilot:
        app.refresh_views()
        await pilot.pause()
        for key in keys:
            await pilot.press(key)
            await pilot.pause()
        app.refresh_views()
        await pilot.pause()
        return screen(app).splitlines()[0], footer(app)


def test_badges_and_footers_in_read_only_detached_paused_and_finished_states(tmp_path: Path) -> None:
    live = ("x Stop run", "c Capture", "s Settings")

    head, foot = asyncio.run(_seen(app_on(scripted_state(), tmp_path / "own")))
    assert "[" not in head and all(k in foot for k in live)  # a run of ours, live: everything

    head, foot = asyncio.run(_seen(app_on(scripted_state(), tmp_path / "ro", read_only=True)))
    assert "[read-only]" in head and "q Quit" in foot and "? Help" in foot
    assert not any(k in foot for k in live)

    state = scripted_state()
    app = app_on(state, tmp_path / "det")
    app.workbench.sessions[-1] = DetachedSession(state, app.workbench.config, tmp_path / "det" / "run")
    head, foot = asyncio.run(_seen(app))
    assert "[detached]" in head and "x Stop run" in foot  # not a watcher: it may still stop it

    head, foot = asyncio.run(_seen(app_on(scripted_state(), tmp_path / "paused"), ("space",)))
    assert "[paused]" in head and "(frozen)" in head

    state = scripted_state()
    state.finish("completed", 1_000_000.0)
    app = app_on(state, tmp_path / "done", live=False)
    head, foot = asyncio.run(_seen(app, ("x", "c")))
    assert "[finished]" in head and "● completed" in head
    assert "Stop run" not in foot and "Capture" not in foot and "s Settings" in foot
    said = notices(app)
    assert "no live run to stop" in said and "no live run to capture" in said  # a refused key says why


def test_quit_on_a_detached_run_offers_detach_or_stop(tmp_path: Path) -> None:
    async def main() -> None:
        state = scripted_state()
        app = app_on(state, tmp_path)
        app.workbench.sessions[-1] = DetachedSession(state, app.workbench.config, tmp_path / "run")
        async with app.run_test(size=(80, 24)) as pilot:
            await pilot.press("q")
            await pilot.pause()
            assert isinstance(app.screen, ChoiceScreen)

    asyncio.run(main())
