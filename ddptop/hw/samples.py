"""GPU samples as plain records: one GPU's readings at one instant, and the timestamped
snapshot of all GPUs that views swap in whole. None means "not available"; `format_value`
is the one place that turns it into "N/A". Pure; no pynvml."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any


@dataclass(frozen=True)
class GpuProcess:
    pid: int
    used_mem: int | None  # bytes


@dataclass(frozen=True)
class GpuStat:
    """One GPU at one instant. None means "not available" on this GPU/driver."""

    index: int
    name: str
    uuid: str | None
    pci_bus_id: str | None
    util_pct: int | None
    mem_used: int | None  # bytes
    mem_total: int | None
    power_w: float | None
    power_limit_w: float | None
    temp_c: int | None
    sm_clock_mhz: int | None
    pcie_tx_kbs: int | None
    pcie_rx_kbs: int | None
    nvlink_active: int | None  # active links
    nvlink_tx_kib: int | None  # cumulative counters; rate = difference of two samples
    nvlink_rx_kib: int | None
    processes: tuple[GpuProcess, ...] = ()


@dataclass(frozen=True)
class GpuSample:
    """An immutable, timestamped snapshot of all GPUs; views swap it in whole."""

    t: float
    gpus: tuple[GpuStat, ...]
    available: bool
    reason: str
    driver: str | None = None  # NVML's driver version (the GPU tab's header)

    def gpu_of_pid(self) -> dict[int, int]:
        """pid -> GPU index, to map processes (and so ranks) to GPUs."""
        return {p.pid: g.index for g in self.gpus for p in g.processes}

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def format_value(value: Any, fmt: str = "{}") -> str:
    """The single place a missing reading turns into "N/A"."""
    return "N/A" if value is None else fmt.format(value)
