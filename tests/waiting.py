"""Waiting in tests: poll a condition until a deadline, never a bare sleep.

`poll` gives the condition's first truthy value, or its last value at the deadline (the
caller's assert then says what was wrong); `wait_until` raises, naming what it waited for;
`hold` lets time pass on purpose, where a test checks that something does NOT happen over a
period (say why). The only sleeps in the tests' own code are the three below.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")
POLL_S = 0.05  # between two looks at a condition


def poll(cond: Callable[[], T], timeout: float, every: float = POLL_S, alive: Callable[[], bool] = lambda: True) -> T:
    """cond()'s first truthy value within `timeout` s (while `alive()`), else its last value."""
    deadline = time.monotonic() + timeout
    while True:
        value = cond()
        if value or time.monotonic() >= deadline or not alive():
            return value
        time.sleep(every)  # documented wait: between two polls of the condition


def wait_until(cond: Callable[[], T], timeout: float, what: str, every: float = POLL_S) -> T:
    """cond()'s first truthy value; AssertionError naming `what` at the deadline."""
    value = poll(cond, timeout, every)
    if not value:
        raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")
    return value


def hold(seconds: float, why: str) -> None:  # noqa: ARG001 - `why` documents the wait at the call
    """Let `seconds` pass on purpose: the test then checks that something did not happen."""
    time.sleep(seconds)  # documented wait: a period in which nothing may happen
