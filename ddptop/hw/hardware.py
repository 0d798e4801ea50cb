"""What the session samples about the machine each second: NVML GPU readings
when there is NVML, and every rank's CPU% and RSS (psutil) always."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from ddptop.hw.gpu import Nvml
from ddptop.hw.processes import ProcessStats
from ddptop.hw.samples import GpuSample


class HardwareSampler:
    def __init__(self, nvml: Nvml | None = None) -> None:
        self.nvml = nvml or Nvml()
        self.procs = ProcessStats()

    def unavailable(self) -> str:
        """Empty when NVML works, else why not (shown once in the GPU panel)."""
        return "" if self.nvml.available else self.nvml.reason

    def topology(self) -> Any:
        return self.nvml.topology()

    def sample(self, pids: Iterable[int]) -> tuple[GpuSample | None, dict[int, tuple[float, int]],
                                                   dict[int, list[int]]]:
        """NVML's reading, the ranks' and their children's CPU% and RSS, and each rank's
        children (DataLoader workers, subprocesses) by the rank's pid."""
        gpu = self.nvml.sample() if self.nvml.available else None
        stats = self.procs.stats(pids, children=True)
        return gpu, stats, self.procs.children
