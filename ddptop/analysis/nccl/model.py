"""What an NCCL_DEBUG=INFO log says, as data: the report and communicator records, the
limits every parser bound follows, NCCL's id tables and the transport labels and classes.
Pure; no I/O, no torch, no textual, no NVML.
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, field
from typing import Any

# Unknown/warning lines are kept for display, but a long live run must not grow without bound.
MAX_KEPT_LINES = 200
KEPT_CHARS = 500  # of each kept line
# No NCCL job has more ranks than this; a line naming more is refused (counted, never drawn).
MAX_RANK = 1 << 20
MAX_CHANNEL = 1 << 12
MAX_MATRIX_RANKS = 64  # a rank x rank text matrix beyond this is unreadable: pairs are counted instead
MAX_LINE_CHARS = 8192  # NCCL's lines are far shorter; longer ones are cut
SHOWN = 8  # rows of each list in the text output
MAX_ENTRIES = 1 << 16  # rank pairs, ranks or tree nodes kept per communicator; communicators: 256
MAX_COMMS = 256
MAX_COLLECTIVE_SHAPES = 10_000

# NCCL's numeric ids, printed by old versions instead of names (enqueue.cc, nccl.h).
ALGORITHMS = ("Tree", "Ring", "CollNetDirect", "CollNetChain", "NVLS", "NVLSTree", "PAT")
PROTOCOLS = ("LL", "LL128", "Simple")
DATATYPES = (
    ("int8", 1), ("uint8", 1), ("int32", 4), ("uint32", 4), ("int64", 8), ("uint64", 8),
    ("float16", 2), ("float32", 4), ("float64", 8), ("bfloat16", 2), ("float8e4m3", 1),
    ("float8e5m2", 1),
)  # fmt: skip

# Which algorithms NCCL implements for each collective (NCCL 2.28); the enabled matrix does not say,
# so NCCL_ALGO=Tree leaves AllGather with nothing and the job fails at its first all-gather.
IMPLEMENTED = {
    "Broadcast": ("Ring",), "Reduce": ("Ring",),
    "AllGather": ("Ring", "CollNetDirect", "NVLS", "PAT"),
    "ReduceScatter": ("Ring", "CollNetDirect", "NVLS", "PAT"),
    "AllReduce": ("Tree", "Ring", "CollNetDirect", "CollNetChain", "NVLS", "NVLSTree"),
}

# Transport classes, fastest first; `transport_class` returns one of these.
CLASS_ORDER = ("nvls", "nvlink", "p2p", "pcie-p2p", "collnet", "shm", "net", "unknown")


# ---------------------------------------------------------------------------- output types


@dataclass(frozen=True)
class RankInfo:
    """One rank of a communicator, as its own init line describes it."""

    rank: int
    host: str = ""
    pid: int | None = None
    cuda_dev: int | None = None
    nvml_dev: int | None = None
    bus_id: str | None = None
    local_rank: int | None = None


@dataclass(frozen=True)
class Transport:
    """How `src` sends to `dst`: the path with the most channels, and any others seen."""

    src: int
    dst: int
    label: str  # short: P2P, P2P/read, SHM, NET/Socket, NET/IB, COLLNET, NVLS
    via: str  # NCCL's full text after "via", e.g. "P2P/CUMEM/read"
    channels: tuple[int, ...]
    others: tuple[str, ...] = ()  # other "via" strings for the same pair

    @property
    def kind(self) -> str:
        return transport_class(self.label)

    @property
    def gdr(self) -> bool:
        return "GDRDMA" in self.via

    @property
    def pxn_rank(self) -> int | None:
        """The rank whose NIC relays this NET send (PXN), from `NET/IB/0(6)/...`, else None."""
        m = re.match(r"\s*NET/[^/]+/\d+\((\d+)\)", self.via)
        return int(m[1]) if m else None


@dataclass(frozen=True)
class TreeNode:
    up: int
    down: tuple[int, ...]


@dataclass(frozen=True)
class Communicator:
    """One NCCL communicator (keyed by commId where the log has it)."""

    key: str
    comm_id: str | None
    nranks: int | None
    nnodes: int | None
    ranks: dict[int, RankInfo]
    transports: dict[tuple[int, int], Transport]
    rings: dict[int, tuple[int, ...]]  # channel -> ring order
    ring_next: dict[int, dict[int, int]]  # channel -> rank -> next rank (GRAPH "Ring" lines)
    trees: dict[int, dict[int, TreeNode]]  # channel -> rank -> node
    channels: dict[str, int]  # coll / collnet / nvls / p2p / p2p_per_peer
    graph_types: tuple[str, ...]  # e.g. "NVL/PIX" from graph search
    collnet: dict[int, str]  # rank -> via string
    nvls: bool
    ring_pxn: int | None = None  # "Connected all rings, use ring PXN p GDR g"
    ring_gdr: int | None = None

    def ring_pairs(self) -> set[tuple[int, int]]:
        """Every (rank, next rank) edge of every ring channel."""
        pairs: set[tuple[int, int]] = set()
        for order in self.rings.values():
            pairs.update(zip(order, order[1:] + order[:1], strict=True))
        for nexts in self.ring_next.values():
            pairs.update(nexts.items())
        return {(a, b) for a, b in pairs if a != b and a >= 0 and b >= 0}


@dataclass(frozen=True)
class CollectiveStat:
    """Calls of one collective shape (op, size, algorithm, protocol, channels)."""

    op: str
    bytes: int | None
    algorithm: str | None
    protocol: str | None
    channels: int | None
    calls: int
    count: int | None = None
    datatype: str | None = None


@dataclass(frozen=True)
class NcclReport:
    version: str | None  # "2.28.9"
    version_full: str | None  # "2.28.9+cuda13.0"
    versions: tuple[str, ...]  # more than one means ranks disagree
    communicators: tuple[Communicator, ...]
    networks: tuple[str, ...]  # "Socket", "IB", ...
    net_devices: tuple[str, ...]
    env: dict[str, str]
    collectives: tuple[CollectiveStat, ...]
    warnings: tuple[str, ...]
    unknown_lines: tuple[str, ...]
    unknown_count: int
    garbled_count: int
    other_count: int  # lines that are not NCCL's (torchrun, user prints)
    nccl_lines: int
    warning_count: int = 0  # all WARN/ABORT lines (`warnings` keeps the first MAX_KEPT_LINES)
    net_failed: tuple[str, ...] = ()  # networks that did not initialise: "IB: No device found"
    gdr_nics: tuple[str, ...] = ()  # "IB mlx5_0: GPU Direct RDMA Enabled"
    algo_matrix: dict[str, dict[str, int]] = field(default_factory=dict)  # func -> proto/algo -> enabled
    refused_count: int = 0  # lines naming impossible ranks or channels
    refused_first: str = ""

    @property
    def primary(self) -> Communicator | None:
        """The communicator worth showing: most ranks, then most transports."""
        if not self.communicators:
            return None
        return max(self.communicators, key=lambda c: (c.nranks or 0, len(c.transports)))

    @property
    def nranks(self) -> int | None:
        return self.primary.nranks if self.primary else None

    @property
    def network(self) -> str | None:
        return self.networks[0] if self.networks else None

    @property
    def transports(self) -> dict[tuple[int, int], Transport]:
        return self.primary.transports if self.primary else {}

    def algorithms(self) -> dict[str, set[str]]:
        """op -> {"RING/SIMPLE", ...} as seen in TUNING lines."""
        seen: dict[str, set[str]] = {}
        for c in self.collectives:
            if c.algorithm:
                seen.setdefault(c.op, set()).add(f"{c.algorithm}/{c.protocol}")
        return seen

    def to_dict(self) -> dict[str, Any]:
        return {
            "version": self.version,
            "version_full": self.version_full,
            "versions": list(self.versions),
            "nranks": self.nranks,
            "network": self.network,
            "networks": list(self.networks),
            "net_devices": list(self.net_devices),
            "env": dict(self.env),
            "communicators": [_comm_dict(c) for c in self.communicators],
            "transports": {_pair(k): _transport_dict(t) for k, t in self.transports.items()},
            "collectives": [asdict(c) for c in self.collectives],
            "warnings": list(self.warnings),
            "unknown_count": self.unknown_count,
            "unknown_lines": list(self.unknown_lines),
            "garbled_count": self.garbled_count,
            "other_count": self.other_count,
            "nccl_lines": self.nccl_lines,
            "warning_count": self.warning_count,
            "net_failed": list(self.net_failed),
            "gdr_nics": list(self.gdr_nics),
            "algo_matrix": {f: dict(v) for f, v in self.algo_matrix.items()},
            "refused_count": self.refused_count,
            "refused_first": self.refused_first,
        }

    def to_json(self, indent: int | None = 2) -> str:
        return json.dumps(self.to_dict(), indent=indent, sort_keys=False)


def _pair(k: tuple[int, int]) -> str:
    return f"{k[0]}->{k[1]}"


def _transport_dict(t: Transport) -> dict[str, Any]:
    d = asdict(t)
    d["kind"] = t.kind
    d["channels"] = list(t.channels)
    d["gdr"] = t.gdr
    d["pxn_rank"] = t.pxn_rank
    return d


def _comm_dict(c: Communicator) -> dict[str, Any]:
    return {
        "key": c.key,
        "comm_id": c.comm_id,
        "nranks": c.nranks,
        "nnodes": c.nnodes,
        "ranks": {str(r): asdict(i) for r, i in sorted(c.ranks.items())},
        "transports": {_pair(k): _transport_dict(t) for k, t in sorted(c.transports.items())},
        "rings": {str(ch): list(o) for ch, o in sorted(c.rings.items())},
        "ring_pairs": sorted(_pair(p) for p in c.ring_pairs()),
        "trees": {
            str(ch): {str(r): {"up": n.up, "down": list(n.down)} for r, n in sorted(nodes.items())}
            for ch, nodes in sorted(c.trees.items())
        },
        "channels": dict(c.channels),
        "graph_types": list(c.graph_types),
        "collnet": {str(r): v for r, v in sorted(c.collnet.items())},
        "nvls": c.nvls,
        "ring_pxn": c.ring_pxn,
        "ring_gdr": c.ring_gdr,
    }


# ---------------------------------------------------------------------------- labels


def transport_label(via: str) -> str:
    """Short label for NCCL's "via" text: P2P/CUMEM/read -> P2P/read, NET/IB/0/GDRDMA -> NET/IB."""
    parts = [p for p in via.strip().split("/") if p]
    if not parts:
        return "?"
    head = parts[0].split()[0].upper()
    if head == "P2P":
        return "P2P/read" if "read" in parts[1:] else "P2P"
    if head in ("NET", "COLLNET") and len(parts) > 1:
        name = re.sub(r"\(.*\)$", "", parts[1])
        return f"{head}/{name}" if head == "NET" else "COLLNET"
    if head.startswith("NVLS"):
        return "NVLS"
    return head


def transport_class(label: str, hw_link: str | None = None) -> str:
    """Coarse class of a transport label for advice: nvlink, pcie-p2p, p2p (link unknown), shm,
    net, collnet, nvls or unknown. `hw_link` is the topology label of the pair (NV18, PIX, SYS...),
    which decides whether a P2P path runs over NVLink or PCIe."""
    head = label.upper()
    if head.startswith("P2P"):
        if hw_link is None:
            return "p2p"
        return "nvlink" if hw_link.upper().startswith("NV") else "pcie-p2p"
    if head.startswith("SHM"):
        return "shm"
    if head.startswith("NET"):
        return "net"
    if head.startswith("COLLNET"):
        return "collnet"
    if head.startswith("NVLS"):
        return "nvls"
    return "unknown"
