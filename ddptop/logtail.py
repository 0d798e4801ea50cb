"""Follows the files a run writes (rank logs, torchrun's log) and returns new lines."""

from __future__ import annotations

from pathlib import Path

MAX_READ = 1 << 20  # per file per poll: a chatty rank cannot stall the loop


class LogTail:
    def __init__(self) -> None:
        self._offsets: dict[Path, int] = {}
        self._partial: dict[Path, bytes] = {}

    def read(self, path: Path) -> list[str]:
        """New complete lines of `path` since the last call (empty if unreadable)."""
        offset = self._offsets.get(path, 0)
        try:
            with open(path, "rb") as f:
                f.seek(offset)
                data = f.read(MAX_READ)
        except OSError:
            return []
        if not data:
            return []
        self._offsets[path] = offset + len(data)
        data = self._partial.pop(path, b"") + data
        *lines, rest = data.split(b"\n")
        if rest:
            self._partial[path] = rest
        return [line.decode("utf-8", "replace").rstrip("\r") for line in lines]


def rank_log_files(log_dir: Path) -> dict[int, list[Path]]:
    """torchrun --log-dir layout: <log_dir>/<rdzv_id>/attempt_<n>/<local_rank>/std{out,err}.log"""
    found: dict[int, list[Path]] = {}
    for path in sorted(log_dir.glob("*/attempt_*/*/std*.log")):
        if path.parent.name.isdigit():
            found.setdefault(int(path.parent.name), []).append(path)
    return found
