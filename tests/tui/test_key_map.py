"""Issue 46 point 6: every key an htop/nvitop user presses first answers, even if only to say
where its feature is (F2, F4, F5, F9, P, M, T, H, u, l did nothing and said nothing; on the
ranks tab n/N/e/b/f/k too); the palette names `t` as help does (Theme); a sort toast is never
stale (after `i` it still showed the order before)."""

from __future__ import annotations

import asyncio
from pathlib import Path

from test_tui_keys_state import notices
from test_tui_one_screen import app_on, scripted_state

from ddptop.tui.screens.confirm_screen import ConfirmScreen
from ddptop.tui.screens.settings_screen import SettingsScreen

FIRST_KEYS = ("f2", "f4", "f5", "f9", "P", "M", "T", "H", "u", "l")
RANKS_TAB_KEYS = ("n", "N", "e", "b", "f", "k")


def test_every_key_an_htop_user_tries_first_answers(tmp_path: Path) -> None:
    async def main() -> dict[str, str]:
        app = app_on(scripted_state(), tmp_path)
        said: dict[str, str] = {}
        async with app.run_test(size=(120, 40)) as pilot:
            app.refresh_views()
            await pilot.pause()
            for key in FIRST_KEYS + RANKS_TAB_KEYS:
                app.clear_notifications()
                await pilot.press(key)
                await pilot.pause()
                if app.screen is not app.screen_stack[0]:  # a screen answered (settings, a question)
                    said[key] = type(app.screen).__name__
                    await pilot.press("escape")
                    await pilot.pause()
                else:
                    said[key] = " | ".join(notices(app))
        return said

    said = asyncio.run(main())
    silent = [k for k, v in said.items() if not v]
    assert not silent, said
    assert said["f2"] == SettingsScreen.__name__ and said["f9"] == ConfirmScreen.__name__
    assert "sorted by p50" in said["P"]
    assert "memory" in said["M"] and "k (kill)" in said["k"]


def test_the_palette_names_theme_as_help_does() -> None:
    from ddptop.tui.keys import BINDINGS, run_commands

    help_name = next(b.description for b in BINDINGS if getattr(b, "key", "") == "t")

    class Stub:
        def viewer_state(self):  # noqa: ANN202
            from ddptop.tui.keys import ViewerState
            return ViewerState(read_only=False, live=True, can_detach=False)

        def __getattr__(self, name: str):  # noqa: ANN204
            return lambda *a: None

    titles = {c.title for c in run_commands(Stub())}  # type: ignore[arg-type]
    assert help_name == "Theme" and "Theme" in titles


def test_a_sort_toast_says_the_order_now_after_i(tmp_path: Path) -> None:
    async def main() -> tuple[list[str], list[str], str]:
        app = app_on(scripted_state(), tmp_path)
        async with app.run_test(size=(120, 40)) as pilot:
            app.refresh_views()
            await pilot.press("f6")
            await pilot.pause()
            first = [n for n in notices(app) if n.startswith("ranks sorted by")]
            await pilot.press("i")
            await pilot.pause()
            from ddptop.tui.widgets.rank_table import RankTable
            return first, [n for n in notices(app) if n.startswith("ranks sorted by")], \
                app.query_one(RankTable).sort_label()

    first, toasts, label = asyncio.run(main())
    assert len(first) == 1 and len(toasts) == 1 and toasts != first, (first, toasts)
    assert f"sorted by {label} " in toasts[0]  # the order the table has now
