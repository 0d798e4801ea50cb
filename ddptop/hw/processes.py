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
        pids = [pid for pid in pids if self._read(psutil, pid, out) is not None]
        kids_of = _children_map(psutil) if children and pids else {}
        for pid in pids if children else ():
            family[pid] = [k for k in _descendants(kids_of, pid) if self._read(psutil, k, out) is not None]
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


def _children_map(psutil: Any) -> dict[int, list[int]]:
    """ppid -> pids, from one pass over the process table (psutil's children() makes a pass
    per call: one per rank, every second, on a server of thousands of processes)."""
    out: dict[int, list[int]] = {}
    for proc in psutil.process_iter(["ppid"]):
        ppid = proc.info.get("ppid")
        if ppid is not None:
            out.setdefault(ppid, []).append(proc.pid)
    return out


def _descendants(kids_of: dict[int, list[int]], pid: int) -> list[int]:
    out: list[int] = []
    todo = list(kids_of.get(pid, ()))
    while todo and len(out) < 1024:
        kid = todo.pop(0)
        out.append(kid)
        todo += kids_of.get(kid, ())
    return out


def process_stats(
    pids: Iterable[int], tracker: ProcessStats | None = None
) -> dict[int, tuple[float, int]]:
    """pid -> (cpu_percent, rss_bytes); pids that are gone are left out. CPU % is since the
    previous call with the same `tracker` (0.0 on the first)."""
    return (tracker or ProcessStats()).stats(pids)
