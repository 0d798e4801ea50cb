"""ChoiceScreen: a question with a few keyed answers; dismisses with the chosen
answer's value, or None on escape."""

from __future__ import annotations

from collections.abc import Sequence

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Button, Static


class ChoiceScreen(ModalScreen[str | None]):
    BINDINGS = [Binding("escape", "choose('')", "Cancel")]

    def __init__(self, question: str, choices: Sequence[tuple[str, str, str]]) -> None:
        """`choices`: (key, label, value); the first is the default (enter)."""
        super().__init__()
        self.question = question
        self.choices = list(choices)
        for key, label, value in self.choices:
            self._bindings.bind(key, f"choose('{value}')", label)
        self._bindings.bind("enter", f"choose('{self.choices[0][2]}')", show=False)

    def compose(self) -> ComposeResult:
        # Same look as ConfirmScreen (its ids carry the styles).
        with Vertical(id="confirm-box"):
            yield Static(self.question, id="confirm-question")
            with Horizontal(id="confirm-buttons"):
                for i, (key, label, value) in enumerate(self.choices):
                    yield Button(f"{label} ({key})", id=f"choice-{value}", compact=True,
                                 variant="error" if value == "stop" else "primary" if i == 0 else "default")
                yield Button("Cancel (esc)", id="choice-", compact=True)

    def on_button_pressed(self, event: Button.Pressed) -> None:
        self.action_choose((event.button.id or "choice-").removeprefix("choice-"))

    def action_choose(self, value: str) -> None:
        self.dismiss(value or None)
