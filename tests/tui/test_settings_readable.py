"""Issue 46 point 7: settings readable at 80x24. A row's own help is cut at 80 columns, so the
focused field's whole description is on a detail line (wrapped, what is wrong with its text
too); every field has a description (capture_memory and the cost_ab* fields had none); the
screen is built once and kept, so opening it again does not rebuild its ~250 widgets."""

from __future__ import annotations

import asyncio
from pathlib import Path

from test_tui_one_screen import app_on, screen, scripted_state

from ddptop.tui.screens.settings_screen import SettingsScreen, help_text, knob_names


def test_every_field_has_a_description() -> None:
    for script in (False, True):
        missing = [n for n in knob_names(script) if not help_text(n)]
        assert not missing, missing


def test_the_focused_fields_whole_description_is_readable_at_80x24(tmp_path: Path) -> None:
    async def main() -> tuple[str, str, str]:
        app = app_on(scripted_state(), tmp_path)
        async with app.run_test(size=(80, 24)) as pilot:
            app.refresh_views()
            await pilot.pause()
            await pilot.press("s")
            await pilot.pause()
            settings = app.screen
            assert isinstance(settings, SettingsScreen)
            settings.query_one("#knob-cost_ab_arms").focus()
            await pilot.pause()
            arms = screen(app)
            field = settings.query_one("#knob-steps")
            field.focus()
            await pilot.pause()
            await pilot.press("x")  # "100x": not a number; the detail line says so
            await pilot.pause()
            bad = screen(app)
            await pilot.press("escape")
            await pilot.pause()
            await pilot.press("s")
            await pilot.pause()
            assert app.screen is settings  # the same screen, kept
            steps = settings.query_one("#knob-steps")
            return arms, bad, str(steps.value)

    arms, bad, steps = asyncio.run(main())
    flat = " ".join(arms.split())
    assert help_text("cost_ab_arms") in flat  # whole, not cut at ~20 characters
    detail = " ".join(" ".join(bad.splitlines()[-3:-1]).split())  # the two lines above the footer
    assert detail.startswith("steps:") and "is not a whole number" in detail, detail
    assert "x" not in steps  # reopened: the run's config again, not the half-typed text
