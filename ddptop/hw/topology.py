"""The `nvidia-smi topo -m` matrix built from plain NVML readings, its link classes, and its
text. Pure; the readings come from ddptop.hw.gpu (the only module that imports pynvml)."""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

from ddptop.hw.samples import format_value

# NVML_TOPOLOGY_* level -> nvidia-smi label. INTERNAL (same board) prints like PIX there.
ANCESTOR_LABELS = {0: "PIX", 10: "PIX", 20: "PXB", 30: "PHB", 40: "NODE", 50: "SYS"}
P2P_STATUS_OK = 0

LEGEND = """Legend:

  X    = Self
  SYS  = Connection traversing PCIe as well as the SMP interconnect between NUMA nodes (e.g., QPI/UPI)
  NODE = Connection traversing PCIe as well as the interconnect between PCIe Host Bridges within a NUMA node
  PHB  = Connection traversing PCIe as well as a PCIe Host Bridge (typically the CPU)
  PXB  = Connection traversing multiple PCIe bridges (without traversing the PCIe Host Bridge)
  PIX  = Connection traversing at most a single PCIe bridge
  NV#  = Connection traversing a bonded set of # NVLinks"""


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
