"""Per-process CPU % and RSS through psutil: what ddptop shows for each rank, NVML or not."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any


class ProcessStats:
    """Per-process CPU % and RSS via psutil, for when NVML is absent. Keeps the psutil
    Process objects, because cpu_percent is measured between two calls on the same object."""

    def __init__(self) -> None:
        self._procs: dict[int, Any] = {}

    def stats(self, pids: Iterable[int]) -> dict[int, tuple[float, int]]:
        import psutil  # noqa: PLC0415 - only the fallback path needs it

        out: dict[int, tuple[float, int]] = {}
        for pid in pids:
            try:
                proc = self._procs.get(pid) or self._procs.setdefault(pid, psutil.Process(pid))
                out[pid] = (proc.cpu_percent(interval=None), proc.memory_info().rss)
            except (psutil.Error, OSError):
                self._procs.pop(pid, None)  # gone or not ours to read: leave it out
        return out


def process_stats(
    pids: Iterable[int], tracker: ProcessStats | None = None
) -> dict[int, tuple[float, int]]:
    """pid -> (cpu_percent, rss_bytes); pids that are gone are left out. CPU % is since the
    previous call with the same `tracker` (0.0 on the first)."""
    return (tracker or ProcessStats()).stats(pids)
