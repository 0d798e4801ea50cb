"""Reading why a run failed from torchrun's own report. Pure text parsing."""

from __future__ import annotations

import re
from dataclasses import dataclass

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


def blame(text: str, first_lost: int | None) -> RootCause | None:
    """The failure to report. torchrun's "first observed" can be a rank that only died
    because a peer vanished without a trace (gloo/NCCL "connection closed"), so prefer,
    in order: a rank killed by a signal other than torchrun's SIGTERM, the first rank that ended badly as ddptop saw it
    (its probe said "crashed" from the exception hook, before any teardown, or its
    connection dropped without a goodbye), then torchrun's root cause."""
    causes = parse_failures(text)
    for cause in causes:
        # SIGTERM is how torchrun ends the survivors, so it says nothing about the cause
        if cause.exitcode is not None and cause.exitcode < 0 and cause.exitcode != -15:
            return cause
    if first_lost is not None:
        mine = [c for c in causes if c.rank == first_lost]
        if mine and mine[0].exitcode == -15:
            # the rank ddptop lost first was only torchrun's SIGTERM: a rank that exited with an
            # error of its own (one that failed before it ever connected, say) is the cause
            root = parse_root_cause(text)
            erred = [c for c in causes if c.exitcode is not None and c.exitcode > 0]
            if root is not None and root.exitcode is not None and root.exitcode > 0:
                return root
            if erred:
                return erred[0]
        return mine[0] if mine else RootCause(first_lost, None, "")
    return parse_root_cause(text)
