"""Reading files that others may have put or swapped where ddptop looks (a shared runs dir,
a run dir in a world-writable place, a capture's summary): never a blocking open (a FIFO),
never through a symlink at the last component (a swap to /dev/zero or another's file), only
regular files, a bounded number of bytes, and JSON of bounded depth checked before it is
parsed. Every failure is None (or an empty read), never an exception and never a hang."""

from __future__ import annotations

import json
import os
import re
import stat
from pathlib import Path
from typing import Any

JSON_MAX = 1 << 20  # a summary.json or config.json ddptop writes is a few KB
JSON_DEPTH = 64  # ddptop's own files nest a handful of levels
_FLAGS = os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC
_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"', re.DOTALL)
_BRACKET = re.compile(rb"[\[\]{}]")


def open_regular(path: str | Path, follow: bool = False) -> int | None:
    """A read-only descriptor of `path` if it is a regular file reached without following a
    symlink at its last component (`follow`: a link the user named is followed); None
    otherwise (FIFO, device, link, missing). The open never blocks (O_NONBLOCK), and reads of
    a regular file are unaffected by that flag."""
    try:
        fd = os.open(path, _FLAGS & ~os.O_NOFOLLOW if follow else _FLAGS)
    except OSError:
        return None
    try:
        if stat.S_ISREG(os.fstat(fd).st_mode):
            return fd
    except OSError:
        pass
    os.close(fd)
    return None


def read_bytes(path: str | Path, limit: int, offset: int = 0) -> bytes | None:
    """Up to `limit` bytes of the regular file `path` from `offset`; None where it is not one."""
    fd = open_regular(path)
    if fd is None:
        return None
    try:
        return os.pread(fd, limit, offset)
    except OSError:
        return None
    finally:
        os.close(fd)


def read_text(path: str | Path, limit: int = JSON_MAX) -> str | None:
    """The regular file `path` as text (bytes that are not UTF-8 replaced) if it holds at most
    `limit` bytes; None otherwise."""
    data = read_bytes(path, limit + 1)
    if data is None or len(data) > limit:
        return None
    return data.decode("utf-8", "replace")


def json_depth(data: bytes, limit: int = JSON_DEPTH) -> int:
    """How deep the arrays and objects of `data` nest (brackets inside strings left out),
    counted without parsing; stops counting at `limit` + 1."""
    depth = deepest = 0
    for match in _BRACKET.finditer(_STRING.sub(b'""', data)):
        if match.group() in (b"[", b"{"):
            depth += 1
            if depth > deepest:
                deepest = depth
                if deepest > limit:
                    break
        else:
            depth -= 1
    return deepest


def read_json_object(path: str | Path, limit: int = JSON_MAX, depth: int = JSON_DEPTH) -> dict[str, Any] | None:
    """The JSON object in the regular file `path`; None when it is not one, larger than
    `limit` bytes, nested deeper than `depth`, or not valid JSON (a 5,000-digit integer too)."""
    data = read_bytes(path, limit + 1)
    if data is None or len(data) > limit or json_depth(data, depth) > depth:
        return None
    try:
        value = json.loads(data)
    except (ValueError, RecursionError):
        return None
    return value if isinstance(value, dict) else None
