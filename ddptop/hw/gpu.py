"""GPU readings: the NVML sampler, the `nvidia-smi topo -m` matrix, and a psutil fallback.
The only module that imports pynvml (lazily); no torch, no textual. Without NVML it says why.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

# NVML_TOPOLOGY_* level -> nvidia-smi label. INTERNAL (same board) prints like PIX there.
ANCESTOR_LABELS = {0: "PIX", 10: "PIX", 20: "PXB", 30: "PHB", 40: "NODE", 50: "SYS"}
P2P_STATUS_OK = 0
MAX_NVLINKS = 36  # NVML_NVLINK_MAX_LINKS in current NVML; devices answer for fewer

LEGEND = """Legend:

  X    = Self
  SYS  = Connection traversing PCIe as well as the SMP interconnect between NUMA nodes (e.g., QPI/UPI)
  NODE = Connection traversing PCIe as well as the interconnect between PCIe Host Bridges within a NUMA node
  PHB  = Connection traversing PCIe as well as a PCIe Host Bridge (typically the CPU)
  PXB  = Connection traversing multiple PCIe bridges (without traversing the PCIe Host Bridge)
  PIX  = Connection traversing at most a single PCIe bridge
  NV#  = Connection traversing a bonded set of # NVLinks"""


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
        return GpuSample(t=now, gpus=gpus, available=True, reason=self.reason)

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


def mask_to_ranges(mask: Iterable[int] | None) -> str | None:
    """CPU/NUMA bitmask words (64 bits each, as NVML returns them) -> "0-63,128-191"."""
    if mask is None:
        return None
    ids = [w * 64 + b for w, word in enumerate(mask) for b in range(64) if int(word) >> b & 1]
    if not ids:
        return None
    spans: list[list[int]] = []
    for i in ids:
        if spans and i == spans[-1][1] + 1:
            spans[-1][1] = i
        else:
            spans.append([i, i])
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in spans)


# ---------------------------------------------------------------------------- samples


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

    def gpu_of_pid(self) -> dict[int, int]:
        """pid -> GPU index, to map processes (and so ranks) to GPUs."""
        return {p.pid: g.index for g in self.gpus for p in g.processes}

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def format_value(value: Any, fmt: str = "{}") -> str:
    """The single place a missing reading turns into "N/A"."""
    return "N/A" if value is None else fmt.format(value)


# ---------------------------------------------------------------------------- topology


@dataclass(frozen=True)
class TopoReading:
    """Plain NVML readings for one GPU: everything the matrix is built from."""

    index: int
    name: str
    pci_bus_id: str | None
    nvlink_states: tuple[int | None, ...] = ()  # per link: 1 active, 0 inactive, None unknown
    nvlink_remote_bus: tuple[str | None, ...] = ()  # per link: remote PCI bus id, None unknown
    ancestor: dict[int, int | None] = field(default_factory=dict)  # other -> NVML_TOPOLOGY_*
    p2p_nvlink: dict[int, int | None] = field(default_factory=dict)  # other -> P2P status
    cpu_affinity: str | None = None
    numa_affinity: str | None = None
    gpu_numa_id: int | None = None
    pcie_gen: int | None = None
    pcie_width: int | None = None
    pcie_max_gen: int | None = None
    pcie_max_width: int | None = None

    @property
    def active_links(self) -> int:
        return sum(1 for s in self.nvlink_states if s)


@dataclass(frozen=True)
class TopologyMatrix:
    """GPU x GPU link labels as `nvidia-smi topo -m` prints them (X, NV#, PIX, PXB, PHB,
    NODE, SYS, N/A), with the per-GPU facts of its right-hand columns."""

    gpus: tuple[TopoReading, ...]
    links: tuple[tuple[str, ...], ...]
    available: bool = True
    reason: str = ""

    def link(self, i: int, j: int) -> str:
        return self.links[i][j]

    def nvlinks(self, i: int, j: int) -> int:
        m = re.fullmatch(r"NV(\d+)", self.links[i][j])
        return int(m[1]) if m else 0

    def to_dict(self) -> dict[str, Any]:
        return {
            "available": self.available,
            "reason": self.reason,
            "gpus": [
                {k: v for k, v in asdict(g).items() if k not in ("ancestor", "p2p_nvlink")}
                | {"active_nvlinks": g.active_links}
                for g in self.gpus
            ],
            "links": [list(row) for row in self.links],
        }


def link_class(label: str) -> str:
    """Coarse class of a topology label: self, nvlink, pcie-switch (PIX/PXB), pcie-host
    (PHB/NODE), cross-numa (SYS) or unknown. Pairs with nccl.transport_class for advice."""
    if label == "X":
        return "self"
    if label.startswith("NV"):
        return "nvlink"
    return {"PIX": "pcie-switch", "PXB": "pcie-switch", "PHB": "pcie-host", "NODE": "pcie-host",
            "SYS": "cross-numa"}.get(label, "unknown")  # fmt: skip


def topology_from_readings(
    readings: Iterable[TopoReading], reason: str = "NVML available"
) -> TopologyMatrix:
    """Build the matrix. NVLink wins over the PCIe ancestor, as in nvidia-smi: on NVSwitch
    systems NVML reports HOSTBRIDGE as the common ancestor of NVLink-connected GPUs."""
    gpus = tuple(sorted(readings, key=lambda r: r.index))
    bus_to_gpu = {_bus_key(g.pci_bus_id): g.index for g in gpus if g.pci_bus_id}
    direct = [_direct_links(g, bus_to_gpu) for g in gpus]
    fabric = [_fabric_links(g, bus_to_gpu) for g in gpus]
    rows = []
    for a, ga in enumerate(gpus):
        row = []
        for b, gb in enumerate(gpus):
            if a == b:
                row.append("X")
                continue
            row.append(_pair_label(ga, gb, direct[a].get(gb.index, 0), fabric[a], fabric[b]))
        rows.append(tuple(row))
    return TopologyMatrix(gpus=gpus, links=tuple(rows), available=True, reason=reason)


def _bus_key(bus: str | None) -> tuple[int, ...] | None:
    """Bus ids like 00000000:00:06.0 and 0000:00:06.0 name one device; compare as numbers."""
    if not bus:
        return None
    m = re.search(r"(?:([0-9a-fA-F]+):)?([0-9a-fA-F]+):([0-9a-fA-F]+)\.([0-7])", bus)
    if not m:
        return None
    return tuple(int(x, 16) if x else 0 for x in m.groups())


def _direct_links(g: TopoReading, bus_to_gpu: dict[Any, int]) -> dict[int, int]:
    counts: dict[int, int] = {}
    for state, remote in zip(g.nvlink_states, g.nvlink_remote_bus, strict=False):
        peer = bus_to_gpu.get(_bus_key(remote))
        if state and peer is not None and peer != g.index:
            counts[peer] = counts.get(peer, 0) + 1
    return counts


def _fabric_links(g: TopoReading, bus_to_gpu: dict[Any, int]) -> int:
    """Active links that do not end at a known GPU: NVSwitch, or remote end not reported."""
    remotes = list(g.nvlink_remote_bus) + [None] * (len(g.nvlink_states) - len(g.nvlink_remote_bus))
    return sum(1 for s, r in zip(g.nvlink_states, remotes, strict=False)
               if s and bus_to_gpu.get(_bus_key(r)) is None)  # fmt: skip


def _pair_label(a: TopoReading, b: TopoReading, direct: int, fab_a: int, fab_b: int) -> str:
    if direct:
        return f"NV{direct}"
    # Through an NVSwitch every link of a GPU reaches every peer; NVML's P2P status says
    # whether this pair can use them, and nvidia-smi prints the bonded link count.
    if a.p2p_nvlink.get(b.index) == P2P_STATUS_OK and fab_a and fab_b:
        return f"NV{min(fab_a, fab_b)}"
    level = a.ancestor.get(b.index)
    return ANCESTOR_LABELS.get(level, "N/A") if level is not None else "N/A"


def render_topology(matrix: TopologyMatrix, legend: bool = True) -> str:
    """Text like `nvidia-smi topo -m` (tab separated, same columns), then PCIe/NVLink facts."""
    if not matrix.available:
        return matrix.reason
    if not matrix.gpus:
        return "no GPUs found"
    names = [f"GPU{g.index}" for g in matrix.gpus]
    lines = ["\t" + "\t".join([*names, "CPU Affinity", "NUMA Affinity", "GPU NUMA ID"])]
    for g, row in zip(matrix.gpus, matrix.links, strict=True):
        cells = [" X " if c == "X" else c for c in row]
        tail = [format_value(g.cpu_affinity), format_value(g.numa_affinity)]
        # nvidia-smi leaves an empty column before GPU NUMA ID; keep it so columns line up.
        lines.append("\t".join([f"GPU{g.index}", *cells, *tail, "", format_value(g.gpu_numa_id)]))
    if legend:
        lines += ["", LEGEND]
    lines += ["", *(_gpu_fact(g) for g in matrix.gpus)]
    return "\n".join(lines)


def _gpu_fact(g: TopoReading) -> str:
    pcie = f"PCIe gen {format_value(g.pcie_gen)} x{format_value(g.pcie_width)}"
    if g.pcie_max_gen and (g.pcie_max_gen, g.pcie_max_width) != (g.pcie_gen, g.pcie_width):
        pcie += f" (max gen {g.pcie_max_gen} x{format_value(g.pcie_max_width)})"
    links = f"{g.active_links} NVLinks active" if g.nvlink_states else "no NVLink"
    return f"GPU{g.index}: {g.name}, {format_value(g.pci_bus_id)}, {pcie}, {links}"


# ---------------------------------------------------------------------------- psutil fallback


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


# ---------------------------------------------------------------------------- CLI


def main_topo(argv: list[str], source: Nvml | None = None) -> int:
    """`ddptop topo [--json]`: the NVML topology matrix; without NVML, one line and exit 0."""
    ap = argparse.ArgumentParser(prog="ddptop topo", description="GPU topology from NVML.")
    ap.add_argument("--json", action="store_true", help="print the matrix as JSON")
    args = ap.parse_args(argv)
    nvml = source or Nvml()
    try:
        if not nvml.available:
            line = json.dumps({"available": False, "reason": nvml.reason})
            print(line if args.json else nvml.reason)
            return 0
        matrix = nvml.topology()
        print(json.dumps(matrix.to_dict(), indent=2) if args.json else render_topology(matrix))
        return 0
    finally:
        if source is None:
            nvml.close()
