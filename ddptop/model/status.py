"""What state a run and a rank are in: str-valued enums, so a status compares equal to its
word ("running"), hashes like it (dict lookups keyed by the word keep working), prints as it
and goes into JSON as it. A viewer's copy of the state may hold the plain word (the viewer
codec decodes strings): `is_live` takes either.

Pure: no imports beyond the standard library.
"""

from __future__ import annotations

from collections.abc import Callable
from enum import Enum
from typing import Any


class _Word(str, Enum):
    """A status that is its word wherever a str is expected."""

    def __str__(self) -> str:
        return str(self.value)

    def __hash__(self) -> int:
        return hash(self.value)


class RunStatus(_Word):
    STARTING = "starting"
    RUNNING = "running"
    COMPLETED = "completed"
    FAILED = "failed"
    STOPPED = "stopped"

    @property
    def is_live(self) -> bool:
        return run_is_live(self)

    @property
    def is_terminal(self) -> bool:
        return not run_is_live(self)


class RankStatus(_Word):
    STARTING = "starting"
    RUNNING = "running"
    DONE = "done"  # said goodbye: its script finished
    STOPPED = "stopped"
    LOST = "lost"  # crashed, or its connection dropped without a goodbye
    FAILED = "failed"
    CRASHED = "crashed"  # its goodbye said so
    EXITED = "exited"

    @property
    def is_live(self) -> bool:
        return rank_is_live(self)


RUN_LIVE = (RunStatus.STARTING, RunStatus.RUNNING)
RUN_TERMINAL = (RunStatus.COMPLETED, RunStatus.FAILED, RunStatus.STOPPED)
RANK_LIVE = (RankStatus.STARTING, RankStatus.RUNNING)


def run_is_live(status: str) -> bool:
    """The run has not ended (a RunStatus, or its word as a viewer's copy holds it)."""
    return status in RUN_LIVE


def rank_is_live(status: str) -> bool:
    """The rank is starting or running (a RankStatus, or its word)."""
    return status in RANK_LIVE


def rank_in_loop(status: str) -> bool:
    """The rank may still be in its training loop: live, or lost (its connection dropped
    without a goodbye, its process perhaps still running). One that said goodbye is not."""
    return rank_is_live(status) or status == RankStatus.LOST


def rank_status(word: str) -> str:
    """A rank's goodbye reason as its RankStatus; a word ddptop does not know stays as it came."""
    try:
        return RankStatus(word)
    except ValueError:
        return word


def run_status(word: str) -> str:
    """A run's status word as its RunStatus (one ddptop does not know stays as it came)."""
    try:
        return RunStatus(word)
    except ValueError:
        return word


class StatusField:
    """A dataclass field that keeps whatever word is assigned as its enum member (`convert`),
    so a state holds a RunStatus/RankStatus whether the collector, a test or the viewer codec
    (which decodes plain words) wrote it. Annotated `str` where it is used: the viewer codec
    builds its wire form from the annotation and sends the word."""

    def __init__(self, default: str, convert: Callable[[str], str]) -> None:
        self._default, self._convert = default, convert
        self._attr = ""

    def __set_name__(self, owner: type, name: str) -> None:
        self._attr = "_" + name

    def __get__(self, obj: Any, objtype: Any = None) -> str:
        if obj is None:  # the dataclass asks the class for the field's default
            return self._default
        return obj.__dict__.get(self._attr, self._default)

    def __set__(self, obj: Any, value: str) -> None:
        obj.__dict__[self._attr] = self._convert(value)
