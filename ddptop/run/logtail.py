"""Follows the files a run writes (rank logs, torchrun's log) and returns new lines. A file
is read only where it is a regular file, opened without blocking and without following a link
at its name (run/untrusted): a FIFO put in a log's place never stalls the monitor."""

from __future__ import annotations

from pathlib import Path

from ddptop.run.untrusted import read_bytes

MAX_READ = 1 << 20  # per file per poll: a chatty rank cannot stall the loop
MAX_LINE = 4096  # characters kept of one line (the file on disk keeps all of it)


class LogTail:
    def __init__(self) -> None:
        self._offsets: dict[Path, int] = {}
        self._partial: dict[Path, bytes] = {}

    def read(self, path: Path) -> list[str]:
        """New complete lines of `path` since the last call (empty if unreadable)."""
        offset = self._offsets.get(path, 0)
        data = read_bytes(path, MAX_READ, offset)
        if not data:
            return []
        self._offsets[path] = offset + len(data)
        data = self._partial.pop(path, b"") + data
        # a progress bar redraws with \r: each redraw is a line of its own for display
        *lines, rest = data.replace(b"\r\n", b"\n").replace(b"\r", b"\n").split(b"\n")
        if len(rest) > MAX_LINE:  # output with no newline for megabytes: show it in pieces
            lines.append(rest)
            rest = b""
        if rest:
            self._partial[path] = rest
        out = []
        for line in lines:
            text = line.decode("utf-8", "replace")
            out.append(text if len(text) <= MAX_LINE else text[:MAX_LINE] + f" … ({len(text) - MAX_LINE} more)")
        return [line for line in out if line]


def rank_log_files(log_dir: Path) -> dict[int, list[Path]]:
    """torchrun --log-dir layout: <log_dir>/<rdzv_id>/attempt_<n>/<local_rank>/std{out,err}.log"""
    found: dict[int, list[Path]] = {}
    for path in sorted(log_dir.glob("*/attempt_*/*/std*.log")):
        if path.parent.name.isdigit():
            found.setdefault(int(path.parent.name), []).append(path)
    return found
