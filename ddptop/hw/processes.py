"""Per-process CPU % and RSS through psutil: what ddptop shows for each rank, NVML or not."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any


class ProcessStats:
    """Per-process CPU % and RSS via psutil, of the ranks and their children (DataLoader
    workers, the script's subprocesses). Keeps the psutil Process objects, because
    cpu_percent is measured between two calls on the same object."""

    def __init__(self) -> None:
        self._procs: dict[int, Any] = {}
        self.children: dict[int, list[int]] = {}  # pid -> its descendants' pids, as last seen

    def stats(self, pids: Iterable[int], children: bool = False) -> dict[int, tuple[float, int]]:
        """pid -> (cpu_percent, rss_bytes); with `children`, each pid's descendants too
        (listed in `self.children`)."""
        import psutil  # noqa: PLC0415 - psutil is a dependency; the import costs only here

        out: dict[int, tuple[float, int]] = {}
        family: dict[int, list[int]] = {}
        for pid in pids:
            proc = self._read(psutil, pid, out)
            if proc is None or not children:
                continue
            try:
                kids = [k.pid for k in proc.children(recursive=True)]
            except (psutil.Error, OSError):
                continue
            family[pid] = [k for k in kids if self._read(psutil, k, out) is not None]
        self.children = family
        for pid in set(self._procs) - set(out):
            del self._procs[pid]  # gone: forget it
        return out

    def _read(self, psutil: Any, pid: int, out: dict[int, tuple[float, int]]) -> Any:
        try:
            proc = self._procs.get(pid) or self._procs.setdefault(pid, psutil.Process(pid))
            out[pid] = (proc.cpu_percent(interval=None), proc.memory_info().rss)
            return proc
        except (psutil.Error, OSError):
            self._procs.pop(pid, None)  # gone or not ours to read: leave it out
            return None


def process_stats(
    pids: Iterable[int], tracker: ProcessStats | None = None
) -> dict[int, tuple[float, int]]:
    """pid -> (cpu_percent, rss_bytes); pids that are gone are left out. CPU % is since the
    previous call with the same `tracker` (0.0 on the first)."""
    return (tracker or ProcessStats()).stats(pids)
