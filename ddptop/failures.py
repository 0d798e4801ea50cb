"""Reading why a run failed from torchrun's own report. Pure text parsing."""

from __future__ import annotations

import re
from dataclasses import dataclass

_ROOT = re.compile(r"Root Cause \(first observed failure\):(.*?)(?:={20,}|\Z)", re.S)
_RANK = re.compile(r"^\s*rank\s*:\s*(\d+)", re.M)
_EXIT = re.compile(r"^\s*exitcode\s*:\s*(-?\d+)", re.M)
_TRACE = re.compile(r"^\s*traceback\s*:\s*(.*)", re.M | re.S)


@dataclass(frozen=True)
class RootCause:
    rank: int | None
    exitcode: int | None
    message: str


def parse_root_cause(text: str) -> RootCause | None:
    """torchrun's "Root Cause (first observed failure)" block, if the text has one."""
    match = _ROOT.search(text)
    if not match:
        return None
    block = match.group(1)
    rank = _RANK.search(block)
    code = _EXIT.search(block)
    trace = _TRACE.search(block)
    # The traceback runs to the end of the block; its last line is the exception.
    trace_lines = [x.strip() for x in trace.group(1).splitlines() if x.strip()] if trace else []
    message = trace_lines[-1] if trace_lines else ""
    if message.startswith("To enable traceback"):
        message = ""
    return RootCause(
        rank=int(rank.group(1)) if rank else None,
        exitcode=int(code.group(1)) if code else None,
        message=message,
    )
