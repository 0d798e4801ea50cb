"""Usage errors shared by every command: one line on stderr, exit code 2."""

from __future__ import annotations

import argparse
from typing import NoReturn

USAGE_EXIT = 2


class UsageError(Exception):
    """A mistake in what the user typed; message is one line."""


class OneLineParser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # one line, not argparse's usage block
        raise UsageError(message)
