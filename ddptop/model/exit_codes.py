"""The one exit-code table: what every ddptop command, viewer and supervisor ends with.
Pure data."""

from __future__ import annotations

USAGE_EXIT = 2  # a mistake in what was typed: one line on stderr, nothing started
EXIT_CODES = {"completed": 0, "failed": 1, "stopped": 130}


def exit_code(status: str) -> int:
    """A run's status as an exit code; anything but completed or stopped is a failure."""
    return EXIT_CODES.get(status, 1)
