"""GPU readings from NVML: the one wrapper every NVML call goes through, sampling every GPU
and reading what the topology matrix is built from (ddptop.hw.topology). The only module that
imports pynvml (lazily); no torch, no textual. Without NVML it says why.
"""

from __future__ import annotations

import os
import time
from typing import Any

from ddptop.hw.samples import GpuProcess, GpuSample, GpuStat
from ddptop.hw.topology import TopologyMatrix, TopoReading, mask_to_ranges, topology_from_readings

MAX_NVLINKS = 36  # NVML_NVLINK_MAX_LINKS in current NVML; devices answer for fewer


# ---------------------------------------------------------------------------- NVML wrapper


class Nvml:
    """One NVML session. Initialises on first use; every call that fails (not supported,
    function missing, driver error, even a pynvml binding bug) returns None instead of raising.
    `module` lets tests inject a fake pynvml."""

    def __init__(self, module: Any | None = None) -> None:
        self._nv = module
        self._started = False
        self._available = False
        self._reason = ""
        self._handles: list[Any] | None = None
        self._driver: str | None = None  # asked of NVML once
        self._links: dict[int, tuple[int, ...]] = {}
        self.errors: dict[str, str] = {}  # first failure per NVML function, for diagnostics

    # -- lifecycle

    def _start(self) -> bool:
        if self._started:
            return self._available
        self._started = True
        if self._nv is None:
            try:
                import pynvml  # noqa: PLC0415 - lazy: importing is cheap, but ddptop must run without it

                self._nv = pynvml
            except ImportError:
                self._reason = "NVML not available: nvidia-ml-py (pynvml) is not installed"
                return False
        try:
            self._nv.nvmlInit()
        except Exception as err:  # any NVML failure means "no NVML here", never a traceback
            self._reason = _init_reason(err)
            return False
        self._available = True
        self._reason = "NVML available"
        return True

    @property
    def available(self) -> bool:
        return self._start()

    @property
    def reason(self) -> str:
        self._start()
        return self._reason

    def close(self) -> None:
        if self._started and self._available:
            self.call("nvmlShutdown")
        self._started = self._available = False
        self._handles = None

    def __enter__(self) -> Nvml:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- calls

    def call(self, name: str, *args: Any) -> Any | None:
        """NVML function `name`, or None if NVML, the function or the value is not available."""
        if not self._start():
            return None
        fn = getattr(self._nv, name, None)
        if fn is None:
            self.errors.setdefault(name, "function not in this pynvml")
            return None
        try:
            return fn(*args)
        except Exception as err:  # NotSupported, FunctionNotFound, ctypes errors alike
            self.errors.setdefault(name, f"{type(err).__name__}: {err}")
            return None

    def const(self, name: str, default: int) -> int:
        value = getattr(self._nv, name, default) if self._start() else default
        # pynvml defines NVML_P2P_CAPS_INDEX_READ as `0,` (a tuple), which breaks the call.
        if isinstance(value, tuple):
            value = value[0] if value else default
        return value if isinstance(value, int) else default

    def device_count(self) -> int:
        return len(self._device_handles())

    def _device_handles(self) -> list[Any]:
        if self._handles is None:
            count = self.call("nvmlDeviceGetCount") or 0
            handles = [self.call("nvmlDeviceGetHandleByIndex", i) for i in range(count)]
            self._handles = [h for h in handles if h is not None]
        return self._handles

    def driver_version(self) -> str | None:
        return _text(self.call("nvmlSystemGetDriverVersion"))

    # -- sampling

    def sample(self) -> GpuSample:
        """One timestamped snapshot of every GPU."""
        now = time.time()
        if not self.available:
            return GpuSample(t=now, gpus=(), available=False, reason=self.reason)
        gpus = tuple(self._sample_gpu(i, h) for i, h in enumerate(self._device_handles()))
        if self._driver is None:
            self._driver = self.driver_version() or ""
        return GpuSample(t=now, gpus=gpus, available=True, reason=self.reason, driver=self._driver or None)

    def _sample_gpu(self, index: int, h: Any) -> GpuStat:
        util = self.call("nvmlDeviceGetUtilizationRates", h)
        mem = self.call("nvmlDeviceGetMemoryInfo", h)
        limit = self.call("nvmlDeviceGetEnforcedPowerLimit", h)
        if limit is None:
            limit = self.call("nvmlDeviceGetPowerManagementLimit", h)
        tx, rx = self._nvlink_throughput(h)
        return GpuStat(
            index=index,
            name=_text(self.call("nvmlDeviceGetName", h)) or f"GPU{index}",
            uuid=_text(self.call("nvmlDeviceGetUUID", h)),
            pci_bus_id=self._bus_id(h),
            util_pct=_attr(util, "gpu"),
            mem_used=_attr(mem, "used"),
            mem_total=_attr(mem, "total"),
            power_w=_scale(self.call("nvmlDeviceGetPowerUsage", h), 1e-3),
            power_limit_w=_scale(limit, 1e-3),
            temp_c=self.call("nvmlDeviceGetTemperature", h, self.const("NVML_TEMPERATURE_GPU", 0)),
            sm_clock_mhz=self.call("nvmlDeviceGetClockInfo", h, self.const("NVML_CLOCK_SM", 1)),
            pcie_tx_kbs=self.call("nvmlDeviceGetPcieThroughput", h,
                                  self.const("NVML_PCIE_UTIL_TX_BYTES", 0)),
            pcie_rx_kbs=self.call("nvmlDeviceGetPcieThroughput", h,
                                  self.const("NVML_PCIE_UTIL_RX_BYTES", 1)),
            nvlink_active=self._nvlink_active(index, h),
            nvlink_tx_kib=tx,
            nvlink_rx_kib=rx,
            processes=self._processes(h),
        )  # fmt: skip

    def _bus_id(self, h: Any) -> str | None:
        return _text(_attr(self.call("nvmlDeviceGetPciInfo", h), "busId"))

    def _nvlink_states(self, index: int, h: Any) -> list[int | None]:
        # Which link ids a device answers for is fixed; find them once, not every sample.
        if index not in self._links:
            answered = [
                link
                for link in range(MAX_NVLINKS)
                if self.call("nvmlDeviceGetNvLinkState", h, link) is not None
            ]
            self._links[index] = tuple(answered)
        return [self.call("nvmlDeviceGetNvLinkState", h, link) for link in self._links[index]]

    def _nvlink_active(self, index: int, h: Any) -> int | None:
        states = self._nvlink_states(index, h)
        return sum(1 for s in states if s) if states else None

    def _nvlink_throughput(self, h: Any) -> tuple[int | None, int | None]:
        ids = [
            self.const("NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX", 138),
            self.const("NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX", 139),
        ]
        values = self.call("nvmlDeviceGetFieldValues", h, ids)
        if values is None:
            return None, None
        out: list[int | None] = []
        for v in list(values)[:2]:
            ok = getattr(v, "nvmlReturn", 1) == 0
            out.append(_attr(getattr(v, "value", None), "ullVal") if ok else None)
        return (out + [None, None])[0], (out + [None, None])[1]

    def _processes(self, h: Any) -> tuple[GpuProcess, ...]:
        procs = self.call("nvmlDeviceGetComputeRunningProcesses", h) or []
        return tuple(GpuProcess(pid=int(p.pid), used_mem=_attr(p, "usedGpuMemory")) for p in procs)

    # -- topology

    def topology(self) -> TopologyMatrix:
        """The `nvidia-smi topo -m` matrix from NVML readings."""
        if not self.available:
            return TopologyMatrix((), (), available=False, reason=self.reason)
        return topology_from_readings(self.topology_readings(), reason=self.reason)

    def topology_readings(self) -> list[TopoReading]:
        handles = self._device_handles()
        return [self._topo_reading(i, h, handles) for i, h in enumerate(handles)]

    def _topo_reading(self, index: int, h: Any, handles: list[Any]) -> TopoReading:
        others = [(j, o) for j, o in enumerate(handles) if j != index]
        nvlink_index = self.const("NVML_P2P_CAPS_INDEX_NVLINK", 2)
        states = self._nvlink_states(index, h)
        remote = [
            _text(_attr(self.call("nvmlDeviceGetNvLinkRemotePciInfo", h, link), "busId"))
            for link in self._links[index]
        ]
        words = max(1, ((os.cpu_count() or 64) + 63) // 64)
        node = self.const("NVML_AFFINITY_SCOPE_NODE", 0)
        cpus = self.call("nvmlDeviceGetCpuAffinityWithinScope", h, words, node)
        if cpus is None:
            cpus = self.call("nvmlDeviceGetCpuAffinity", h, words)
        numa_id = self.call("nvmlDeviceGetNumaNodeId", h)
        return TopoReading(
            index=index,
            name=_text(self.call("nvmlDeviceGetName", h)) or f"GPU{index}",
            pci_bus_id=self._bus_id(h),
            nvlink_states=tuple(states),
            nvlink_remote_bus=tuple(remote),
            ancestor={j: self.call("nvmlDeviceGetTopologyCommonAncestor", h, o) for j, o in others},
            p2p_nvlink={j: self.call("nvmlDeviceGetP2PStatus", h, o, nvlink_index) for j, o in others},
            cpu_affinity=mask_to_ranges(cpus),
            numa_affinity=mask_to_ranges(self.call("nvmlDeviceGetMemoryAffinity", h, 1, node)),
            gpu_numa_id=numa_id if isinstance(numa_id, int) and numa_id >= 0 else None,
            pcie_gen=self.call("nvmlDeviceGetCurrPcieLinkGeneration", h),
            pcie_width=self.call("nvmlDeviceGetCurrPcieLinkWidth", h),
            pcie_max_gen=self.call("nvmlDeviceGetMaxPcieLinkGeneration", h),
            pcie_max_width=self.call("nvmlDeviceGetMaxPcieLinkWidth", h),
        )  # fmt: skip


GpuSource = Nvml  # the name the rest of ddptop may use for "where GPU readings come from"


def _init_reason(err: BaseException) -> str:
    kind = type(err).__name__
    if kind == "NVMLError_LibraryNotFound":
        return "NVML not available: libnvidia-ml.so.1 not found"
    if kind == "NVMLError_DriverNotLoaded":
        return "NVML not available: the NVIDIA driver is not loaded"
    return f"NVML not available: {err or kind}"


def _text(value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, bytes):
        return value.decode(errors="replace")
    return str(value)


def _attr(obj: Any, name: str) -> Any | None:
    value = getattr(obj, name, None) if obj is not None else None
    # NVML marks "not available" with all-ones; pynvml passes some of them through.
    if isinstance(value, int) and value in (2**64 - 1, 2**32 - 1):
        return None
    return value


def _scale(value: Any, factor: float) -> float | None:
    return None if value is None else value * factor
