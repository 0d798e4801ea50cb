"""The width the CLI's plain-text output fits: the terminal's, 80 columns when stdout is not
a terminal (a pipe, a file, CI), as `ls` and git do. I/O only to ask; the tables are
ddptop.model.report's."""

from __future__ import annotations

import os
import shutil
import sys
from typing import TextIO

DEFAULT_COLUMNS = 80


def output_width(stream: TextIO | None = None) -> tuple[int, bool]:
    """(columns, is a terminal) of `stream` (stdout): COLUMNS when set, else the terminal's
    own, else DEFAULT_COLUMNS."""
    stream = stream or sys.stdout
    try:
        tty = stream.isatty()
    except (AttributeError, ValueError):
        tty = False
    if not tty:
        return _columns_env() or DEFAULT_COLUMNS, False
    return _columns_env() or shutil.get_terminal_size((DEFAULT_COLUMNS, 24)).columns, True


def _columns_env() -> int | None:
    try:
        value = int(os.environ.get("COLUMNS", ""))
    except ValueError:
        return None
    return value if value > 0 else None
