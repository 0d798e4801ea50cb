"""Reading why a run failed: torchrun's own report, the per-rank `error.json` files that
torchrun's `@record` writes, and a rank's last words on stderr. Pure text parsing: the
session reads the files."""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace

_ENTRY = re.compile(r"^\s*\[\d+\]:\s*$")
_FIELD = re.compile(r"^\s*(rank|exitcode|traceback)\s*:\s*(.*)$")
_END = re.compile(r"^\s*(-{20,}|={20,})")


@dataclass(frozen=True)
class RootCause:
    rank: int | None
    exitcode: int | None
    message: str


def parse_failures(text: str) -> list[RootCause]:
    """Every failure torchrun reported ("Failures:" and "Root Cause" entries), in order."""
    out: list[RootCause] = []
    entry: dict[str, str] | None = None
    trace: list[str] = []

    def close() -> None:
        if entry is not None and "rank" in entry:
            out.append(_cause(entry, trace))

    for line in text.splitlines():
        if _ENTRY.match(line):
            close()
            entry, trace = {}, []
        elif entry is not None and _END.match(line):
            close()
            entry, trace = None, []
        elif entry is not None:
            field = _FIELD.match(line)
            if field and field.group(1) not in entry:
                entry[field.group(1)] = field.group(2).strip()
                if field.group(1) == "traceback":
                    trace = [field.group(2).strip()]
            elif "traceback" in entry and line.strip():
                trace.append(line.strip())
    close()
    return out


def _cause(entry: dict[str, str], trace: list[str]) -> RootCause:
    rank = re.match(r"(\d+)", entry.get("rank", ""))
    code = re.match(r"(-?\d+)", entry.get("exitcode", ""))
    message = trace[-1] if trace else ""  # the traceback's last line is the exception
    if message.startswith("To enable traceback"):
        message = ""
    return RootCause(int(rank.group(1)) if rank else None, int(code.group(1)) if code else None, message)


def parse_root_cause(text: str) -> RootCause | None:
    """torchrun's "Root Cause (first observed failure)" entry, if the text has one."""
    at = text.find("Root Cause (first observed failure):")
    causes = parse_failures(text[at:]) if at >= 0 else []
    return causes[0] if causes else None


@dataclass(frozen=True)
class ErrorFile:
    """What a rank's `error.json` says: its exception's line and when it was raised."""

    message: str
    timestamp: float | None  # seconds since the epoch (torch writes whole seconds)


def parse_error_file(text: str) -> ErrorFile | None:
    """torch.distributed.elastic's error file: {"message": {"message": "XError: ...",
    "extraInfo": {"py_callstack": ..., "timestamp": "1700000000"}}}, or the flat form
    {"message": "...", "timestamp": N} that C++ errors use. None if it is neither."""
    try:
        data = json.loads(text)
    except ValueError:
        return None
    if not isinstance(data, dict) or "message" not in data:
        return None
    message, stamp = data["message"], data.get("timestamp")
    if isinstance(message, dict):
        stamp = (message.get("extraInfo") or {}).get("timestamp") if isinstance(
            message.get("extraInfo"), dict) else None
        message = message.get("message", "")
    if not isinstance(message, str):
        return None
    try:
        when: float | None = float(stamp) if stamp is not None else None
    except (TypeError, ValueError):
        when = None
    if when is not None and not math.isfinite(when):
        when = None
    # the exception's own line; gloo's messages go on with "At:" and a C++ stack
    first = next((line.strip() for line in message.splitlines() if line.strip()), "")
    return ErrorFile(first[:300], when)


_EXCEPTION = re.compile(r"^(?:\[rank\d+\]:\s*)?((?:[\w.]+\.)?[A-Z]\w*(?:Error|Exception|Interrupt|Exit)\b.*)$")


def _last_match(pattern: re.Pattern[str], lines: Iterable[str]) -> str:
    found = ""
    for line in lines:
        m = pattern.match(line.strip())
        if m:
            found = m.group(1)
    return found[:300]


def last_exception(lines: Iterable[str]) -> str:
    """The last `SomeError: message` line a rank printed (its uncaught exception), or ""."""
    return _last_match(_EXCEPTION, lines)


_USAGE = re.compile(r"^(?:run\.py|torchrun|[\w.-]*torch\.distributed\.run): error: (.+)$")


def launcher_usage_error(lines: Iterable[str]) -> str:
    """What torchrun's own argument parser refused (`run.py: error: ambiguous option: ...`),
    or "": then no rank ran, and none is to blame."""
    return _last_match(_USAGE, lines)


def last_words(lines: Iterable[str]) -> str:
    """The line that best says why a rank ended: its last exception line, else its last
    line that is not ddptop's own (`python: can't open file ...`, `Killed`), else ""."""
    lines = list(lines)
    found = last_exception(lines)
    if found:
        return found
    own = ("ddptop:", "[ddptop]")
    return next((line.strip()[:300] for line in reversed(lines)
                 if line.strip() and not line.strip().startswith(own)), "")


def blame(text: str, first_lost: int | None, errors: Mapping[int, ErrorFile] | None = None) -> RootCause | None:
    """The failure to report, from torchrun's report `text`, the rank ddptop lost first and
    the ranks' error files (rank -> ErrorFile). torchrun's "first observed" can be a rank
    that only died because a peer vanished (gloo/NCCL "connection closed"), so prefer, in
    order: a rank killed by a signal other than torchrun's SIGTERM; the first rank that
    ended badly as ddptop saw it (its probe said "crashed" from the exception hook, before
    any teardown, or its connection dropped without a goodbye), unless that rank was only
    terminated by torchrun; the first rank to fail in time by its error file; torchrun's
    root cause. An error file's message is the failure's message."""
    errors = dict(errors or {})
    cause = _pick(text, first_lost, errors)
    if cause is not None and cause.rank in errors and errors[cause.rank].message:
        cause = replace(cause, message=errors[cause.rank].message)
    return cause


def _pick(text: str, first_lost: int | None, errors: dict[int, ErrorFile]) -> RootCause | None:
    causes = parse_failures(text)
    listed = {c.rank for c in causes}
    # torchrun killed before it could report: the error files still say who raised
    causes += [RootCause(rank, None, e.message) for rank, e in sorted(errors.items()) if rank not in listed]
    for cause in causes:
        # SIGTERM is how torchrun ends the survivors, so it says nothing about the cause
        if cause.exitcode is not None and cause.exitcode < 0 and cause.exitcode != -15:
            return cause
    root = parse_root_cause(text)
    erred = [c for c in causes if (c.exitcode is not None and c.exitcode > 0) or c.rank in errors]

    def first_in_time(c: RootCause) -> tuple[float, int, int]:
        stamp = errors[c.rank].timestamp if c.rank in errors else None
        return (math.inf if stamp is None else stamp, 0 if root is not None and c.rank == root.rank else 1,
                causes.index(c))

    if first_lost is not None:
        mine = [c for c in causes if c.rank == first_lost]
        if mine and mine[0].exitcode == -15 and erred:
            # the rank ddptop lost first was only torchrun's SIGTERM: a rank that exited with an
            # error of its own (one that failed before it ever connected, say) is the cause
            return min(erred, key=first_in_time)
        return mine[0] if mine else RootCause(first_lost, None, "")
    if errors:
        return min(erred, key=first_in_time)
    return root


# the signals torchrun meets in practice; the monitor side names them without the signal module
_SIGNALS = {1: "SIGHUP", 2: "SIGINT", 3: "SIGQUIT", 6: "SIGABRT", 9: "SIGKILL", 11: "SIGSEGV", 15: "SIGTERM"}


def launcher_killed(rc: int, text: str, errors: Mapping[int, ErrorFile] | None = None,
                    crashed: Iterable[int] = ()) -> str:
    """torchrun itself ended by a signal (`kill -9`, the OOM killer) with no rank's failure
    in its report, no rank's error file and no rank that crashed of its own accord: its
    ranks were ended by ddptop's sweep when torchrun went, not by a fault, so no rank is to
    blame (`blame` would name the first one whose connection dropped). The run's error
    line then, else "" (a rank is to blame: use `blame`)."""
    if rc >= 0 or parse_failures(text) or errors or any(True for _ in crashed):
        return ""
    name = _SIGNALS.get(-rc, f"signal {-rc}")
    return f"torchrun was killed ({name}); ddptop ended its ranks, which had not failed"
