"""Calling into torch without adding a line to the script's stderr.

Registering NCCL's completion hook makes torch print, once per process, straight to file
descriptor 2 from C++ (`Warning: ProcessGroupNCCL OnCompletion hook will be deprecated in
favor of Flight Recorder ...`): Python's `warnings` never sees it, so only the descriptor can
hold it back. `call_without` points fd 2 at a pipe for the length of one call, then writes back
every line that does not carry the given text, in order: what another thread wrote in that
instant is kept, only torch's line about ddptop's own call is dropped (issue 42: a run's rank
stderr holds what the plain run's holds).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def call_without(fn: Callable[[], T], text: str, fd: int = 2) -> T:
    """`fn()`, with any line containing `text` that it writes to `fd` dropped."""
    try:
        sys.stderr.flush()
        saved = os.dup(fd)
        read_end, write_end = os.pipe()
    except (OSError, ValueError, AttributeError):
        return fn()
    os.set_blocking(read_end, False)
    try:
        os.dup2(write_end, fd)
        os.close(write_end)
        try:
            return fn()
        finally:
            os.dup2(saved, fd)
            kept = drop_lines(_drain(read_end), text.encode())
            if kept:
                os.write(fd, kept)
    finally:
        os.close(saved)
        os.close(read_end)


def _drain(read_end: int) -> bytes:
    chunks = []
    while True:
        try:
            chunk = os.read(read_end, 1 << 16)
        except BlockingIOError:
            break
        if not chunk:
            break
        chunks.append(chunk)
    return b"".join(chunks)


def drop_lines(data: bytes, text: bytes) -> bytes:
    """`data` without the lines that hold `text` (pure)."""
    return b"".join(line for line in data.splitlines(keepends=True) if text not in line)
