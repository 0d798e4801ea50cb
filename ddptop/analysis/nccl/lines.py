"""One NCCL log line: the `host:pid:tid [dev] NCCL INFO` prefix split off, and the range
checks every handler applies to the ranks and channels a line names. Pure."""

from __future__ import annotations

import re
from dataclasses import dataclass

from ddptop.analysis.nccl.model import MAX_CHANNEL, MAX_RANK

_PREFIX = re.compile(
    r"(?:^|[\s\]:])(?P<host>[\w.\-]+):(?P<pid>\d+):(?P<tid>\d+) \[(?P<dev>\d+)\] "
    r"NCCL (?P<level>INFO|WARN|TRACE|ABORT)\b ?(?P<msg>.*)$"
)
_BARE = re.compile(r"\bNCCL (?P<level>INFO|WARN)\b ?(?P<msg>.*)$")


@dataclass(frozen=True)
class Line:
    proc: tuple[str, int]  # (host, pid); NO_PROC for bare "NCCL INFO ..." lines
    level: str
    msg: str


# Lines without the host:pid:tid prefix are treated as coming from one unnamed process.
NO_PROC = ("", 0)


def split_line(line: str) -> Line | None:
    """The NCCL line in `line` (after any torchrun or user prefix), or None if it is not NCCL's."""
    m = _PREFIX.search(line)
    if m:
        return Line((m["host"], int(m["pid"])), m["level"], m["msg"])
    m = _BARE.search(line)
    if m:
        return Line(NO_PROC, m["level"], m["msg"])
    return None


class Refused(ValueError):
    """A line names a rank or channel no NCCL job can have."""


def parse_rank(text: str) -> int:
    value = int(text)
    if not -1 <= value < MAX_RANK:
        raise Refused(f"rank {text[:40]}")
    return value


def parse_channel(text: str) -> int:
    value = int(text)
    if not 0 <= value < MAX_CHANNEL:
        raise Refused(f"channel {text[:40]}")
    return value


def int_or_none(text: str | None, default: int | None = None) -> int | None:
    if text is None:
        return default
    try:
        return int(text, 0) if text.startswith("0x") else int(text)
    except ValueError:
        return default
