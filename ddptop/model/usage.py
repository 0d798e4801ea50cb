"""Usage errors shared by every command: one line on stderr, exit code 2."""

from __future__ import annotations

import argparse
from typing import NoReturn

from ddptop.model.exit_codes import USAGE_EXIT

__all__ = ["USAGE_EXIT", "OneLineParser", "UsageError"]


class UsageError(Exception):
    """A mistake in what the user typed; message is one line."""


class OneLineParser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # one line, not argparse's usage block
        raise UsageError(message)
