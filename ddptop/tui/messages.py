"""App-wide messages (intents from screens and widgets, and run lifecycle news).
Widget-specific events are nested in their widget classes."""

from __future__ import annotations

from textual.message import Message

from ddptop.model.config import RunConfig


class SettingsApplied(Message):
    """The user applied new settings: stop the current run, start one with `config`."""

    def __init__(self, config: RunConfig) -> None:
        super().__init__()
        self.config = config


class StopRequested(Message):
    """Stop the current run (keep the app open)."""

    def __init__(self, reason: str = "stopped by user") -> None:
        super().__init__()
        self.reason = reason


class RunStarted(Message):
    """A new run was created and its worker started."""

    def __init__(self, run_id: str) -> None:
        super().__init__()
        self.run_id = run_id


class RunEnded(Message):
    """A run's worker finished: `status` is the run's final status, or 'error'."""

    def __init__(self, run_id: str, status: str, error: str = "") -> None:
        super().__init__()
        self.run_id = run_id
        self.status = status
        self.error = error


class CaptureEnded(Message):
    """A capture window reached `done` or `failed`."""

    def __init__(self, run_id: str, capture_id: int, status: str, detail: str = "") -> None:
        super().__init__()
        self.run_id = run_id
        self.capture_id = capture_id
        self.status = status
        self.detail = detail
