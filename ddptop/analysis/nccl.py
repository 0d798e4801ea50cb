"""NCCL_DEBUG=INFO log parser: version, communicators, per-pair transports, rings, trees,
env overrides and TUNING collectives. Pure (lines in, data out); no torch, no textual, no NVML.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import sys
import zlib
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass, field
from typing import Any

from ddptop.model.usage import OneLineParser, UsageError

# Unknown/warning lines are kept for display, but a long live run must not grow without bound.
MAX_KEPT_LINES = 200
KEPT_CHARS = 500  # of each kept line
# No NCCL job has more ranks than this; a line naming more is refused (counted, never drawn).
MAX_RANK = 1 << 20
MAX_CHANNEL = 1 << 12
MAX_MATRIX_RANKS = 64  # a rank x rank text matrix beyond this is unreadable: pairs are counted instead
MAX_FILE_BYTES = 256 << 20  # read per log file by `ddptop nccl` (--max-mb)
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

_PREFIX = re.compile(
    r"(?:^|[\s\]:])(?P<host>[\w.\-]+):(?P<pid>\d+):(?P<tid>\d+) \[(?P<dev>\d+)\] "
    r"NCCL (?P<level>INFO|WARN|TRACE|ABORT)\b ?(?P<msg>.*)$"
)
_BARE = re.compile(r"\bNCCL (?P<level>INFO|WARN)\b ?(?P<msg>.*)$")
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f\ufffd]")
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")

_VERSION = re.compile(r"^NCCL version (?P<full>(?P<num>\d+\.\d+\.\d+)\S*)")
_COMM = re.compile(r"^(?:(?P<fn>\w+) )?comm (?P<ptr>0x[0-9a-fA-F]+) (?P<rest>.*)$")
_KV = re.compile(
    r"\b(rank|nranks|nRanks|cudaDev|nvmlDev|busId|commId|nNodes|localRanks|localRank)\s+(\S+)"
)
_CHANNEL_COUNTS = re.compile(r"(\d+) (coll|collnet|nvls|p2p) channels(?! per peer)")
_P2P_PER_PEER = re.compile(r"(\d+) p2p channels per peer")
_NETWORK = re.compile(r"^Using network (?P<net>.+?)\s*$")
_NET_DEVICES = re.compile(r"^NET/(?P<net>\w+) ?: Using (?P<devs>.+?)\s*$")
_ENV = re.compile(r"^(?P<name>[A-Z][A-Z0-9_]*) set by environment to (?P<value>.*?)\.?\s*$")
_RING_ORDER = re.compile(
    r"^(?:Channel|Ring) (?P<ch>\d+)(?:/(?P<n>\d+))? :(?P<ranks>(?:\s+-?\d+)+)\s*$"
)
_TRANSPORT = re.compile(
    r"^(?:Channel|Ring) (?P<ch>\d+)(?:/(?P<conn>\d+))? : "
    r"(?P<src>\d+)\[(?P<sdev>[0-9a-fA-Fx]+)\] -> (?P<dst>\d+)\[(?P<ddev>[0-9a-fA-Fx]+)\]"
    r"(?: \[(?P<side>send|receive)\])? via (?P<via>\S.*?)\s*$"
)
_COLLNET = re.compile(
    r"^Coll(?:Net)? (?P<ch>\d+)(?:/(?P<conn>\d+))? : (?P<rank>\d+) "
    r"\[(?P<side>send|receive)\] via (?P<via>\S.*?)\s*$"
)
_TREES = re.compile(r"\[(\d+)\] (-?\d+)/(-?\d+)/(-?\d+)->(-?\d+)->(-?\d+)")
_GRAPH_TREE = re.compile(r"^Tree (\d+) : (-?\d+) -> (-?\d+) -> (-?\d+)/(-?\d+)/(-?\d+)\s*$")
_GRAPH_RING = re.compile(r"^Ring (\d+) : (-?\d+) -> (-?\d+) -> (-?\d+)\s*$")
_PATTERN = re.compile(r"^Pattern \d+, crossNic \d+, nChannels (\d+), .*?type (\S+?),")
_TUNING = re.compile(
    r"^(?P<op>\w+): (?P<bytes>\d+) Bytes -> Algo (?P<algo>\w+) proto (?P<proto>\w+)"
    r"(?: channel\{Lo\.\.Hi\}=\{(?P<lo>\d+)\.\.(?P<hi>\d+)\})?"
)
_COLL = re.compile(
    r"^(?P<op>\w+): opCount (?P<opcount>[0-9a-fA-Fx]+) sendbuff \S+ recvbuff \S+ "
    r"count (?P<count>\d+) datatype (?P<dt>\d+) op (?P<redop>\d+) root (?P<root>-?\d+)"
)

_NET_FAILED = re.compile(
    r"^(?:NET/(?P<net>\w+) ?: No device found|Failed to initialize NET plugin (?P<plugin>\w+))"
)
_GDR_NIC = re.compile(
    r"^NET/(?P<net>\w+) ?: GPU Direct RDMA (?P<state>Enabled|Disabled) for HCA \d+ '(?P<nic>[^']*)'"
)
_TORCHRUN = re.compile(r"^\s*\[[\w:-]*\]:")  # torchrun's "[default0]:" before a rank's output line

# NCCL lines that carry nothing we report; recognised so they do not count as unknown.
_NOISE = re.compile(
    r"^(?:ENV/Plugin|NET/Plugin|PROFILER/Plugin|TUNER/Plugin|NET/\w+ ?:|Bootstrap|cudaDriverVersion"
    r"|Comm config|Failed to initialize NET plugin|Initialized NET plugin|Assigned NET plugin"
    r"|RAS |MNNVL |ncclTopo|P2P Chunksize|Check P2P Type|\[Proxy|threadThresholds|CC (?:On|Off)"
    r"|Init timings|Connected all|Topology detection|TOPO/|Could not find real path|===|\+ "
    r"|(?:GPU|NET|CPU|NVS|NIC)/\S+ ?[:(]|ncclP2pSchedule|Algorithm|Protocol|Max NThreads"
    r"|\s*\d+ : (?:GPU|NET|NVS|CPU)/|\s*\w+ \|"
    r"|Setting affinity|[\w.]+\.cc:\d+ -> \d+)"
)


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


# ---------------------------------------------------------------------------- parser


@dataclass
class _Link:
    vias: dict[str, set[tuple[int, int]]] = field(default_factory=dict)  # via -> {(ch, conn)}


@dataclass
class _Comm:
    key: str
    comm_id: str | None = None
    nranks: int | None = None
    nnodes: int | None = None
    ranks: dict[int, RankInfo] = field(default_factory=dict)
    links: dict[tuple[int, int], _Link] = field(default_factory=dict)
    rings: dict[int, tuple[int, ...]] = field(default_factory=dict)
    ring_next: dict[int, dict[int, int]] = field(default_factory=dict)
    trees: dict[int, dict[int, TreeNode]] = field(default_factory=dict)
    channels: dict[str, int] = field(default_factory=dict)
    graph_types: list[str] = field(default_factory=list)
    collnet: dict[int, str] = field(default_factory=dict)
    nvls: bool = False
    ring_pxn: int | None = None
    ring_gdr: int | None = None


class _Refused(ValueError):
    """A line names a rank or channel no NCCL job can have."""


def _rank(text: str) -> int:
    value = int(text)
    if not -1 <= value < MAX_RANK:
        raise _Refused(f"rank {text[:40]}")
    return value


def _channel(text: str) -> int:
    value = int(text)
    if not 0 <= value < MAX_CHANNEL:
        raise _Refused(f"channel {text[:40]}")
    return value


@dataclass(frozen=True)
class _Line:
    proc: tuple[str, int]  # (host, pid); _NO_PROC for bare "NCCL INFO ..." lines
    level: str
    msg: str


# Lines without the host:pid:tid prefix are treated as coming from one unnamed process.
_NO_PROC = ("", 0)


class NcclParser:
    """Incremental parser: `feed` lines as they arrive (from any rank, any order), call
    `report()` for an immutable snapshot. Never raises on input."""

    def __init__(self) -> None:
        self._comms: dict[str, _Comm] = {}
        self._proc_comms: dict[tuple[str, int], list[str]] = {}
        self._ptr_key: dict[tuple[str, int, str], str] = {}
        self._versions: dict[str, str] = {}  # full -> numeric
        self._networks: list[str] = []
        self._net_devices: list[str] = []
        self._env: dict[str, str] = {}
        self._colls: dict[tuple, int] = {}
        self._coll_proc: tuple[str, int] | None = None
        self._warnings: list[str] = []
        self.warning_count = 0
        self._unknown: list[str] = []
        self._net_failed: list[str] = []
        self._gdr_nics: list[str] = []
        self._matrix: dict[str, dict[str, int]] = {}
        self._matrix_cols: tuple[tuple[str, ...], ...] | None = None
        self.refused_count = 0
        self.refused_first = ""
        self.unknown_count = 0
        self.garbled_count = 0
        self.other_count = 0
        self.nccl_lines = 0
        self._handlers = self._make_handlers()

    # -- input

    def feed(self, line: str) -> None:
        line = _ANSI.sub("", line[:MAX_LINE_CHARS].rstrip("\r\n"))
        if _CONTROL.search(line):
            self.garbled_count += 1
            return
        parsed = _split(line)
        if parsed is None:
            if self._matrix_cols is not None and self._on_matrix_row(line):
                self.nccl_lines += 1
            else:
                self.other_count += 1
            return
        self.nccl_lines += 1
        try:
            self._dispatch(parsed)
        except _Refused as exc:
            self.refused_count += 1
            if not self.refused_first:
                self.refused_first = f"{exc}: {parsed.msg.strip()[:160]}"
        except Exception:  # noqa: BLE001 - hostile input: a line the handler could not take is counted, never raised
            self.garbled_count += 1

    def feed_lines(self, lines: Iterable[str]) -> NcclParser:
        for line in lines:
            self.feed(line)
        return self

    # -- dispatch

    def _dispatch(self, line: _Line) -> None:
        msg = line.msg.strip()
        if line.level in ("WARN", "ABORT"):
            self.warning_count += 1
            _keep(self._warnings, msg)
            return
        for trigger, handler in self._handlers:
            if trigger(msg):
                if not handler(line, msg):
                    self.garbled_count += 1
                return
        if _NOISE.match(msg):
            return
        self.unknown_count += 1
        _keep(self._unknown, msg)

    def _make_handlers(self) -> tuple:
        # (cheap trigger, handler): the first trigger that fires owns the line.
        return (
            (lambda m: m.startswith("NCCL version"), self._on_version),
            (lambda m: " Bytes -> Algo" in m, self._on_tuning),
            (lambda m: ": opCount " in m, self._on_coll),
            (lambda m: " coll channels" in m, self._on_channel_counts),
            (
                lambda m: m.startswith(("Channel ", "Ring ")) and ("via" in m or "[" in m),
                self._on_transport,
            ),
            (lambda m: m.startswith("Coll") and " via " in m, self._on_collnet),
            (lambda m: _RING_ORDER.match(m) is not None, self._on_ring_order),
            (lambda m: m.startswith("Ring ") and "->" in m, self._on_graph_ring),
            (lambda m: m.startswith("Trees"), self._on_trees),
            (lambda m: m.startswith("Tree ") and "->" in m, self._on_graph_tree),
            (lambda m: " set by environment to " in m, self._on_env),
            (lambda m: m.startswith("Using network"), self._on_network),
            (lambda m: re.match(r"(?:\w+ )?comm 0x", m) is not None, self._on_comm),
            (lambda m: m.startswith("Pattern "), self._on_pattern),
            (lambda m: m.startswith("NVLS"), self._on_nvls),
            (lambda m: _NET_DEVICES.match(m) is not None, self._on_net_devices),
            (lambda m: m.startswith("Enabled NCCL Func/Proto/Algo Matrix"), self._on_matrix_title),
            (lambda m: m.startswith("Connected all rings"), self._on_rings_connected),
            (lambda m: _NET_FAILED.match(m) is not None, self._on_net_failed),
            (lambda m: _GDR_NIC.match(m) is not None, self._on_gdr_nic),
        )

    # -- handlers: each returns False when the line has the shape's keyword but not its form

    def _on_version(self, line: _Line, msg: str) -> bool:
        m = _VERSION.match(msg)
        if m:
            self._versions.setdefault(m["full"], m["num"])
        return m is not None

    def _on_comm(self, line: _Line, msg: str) -> bool:
        m = _COMM.match(msg)
        if not m:
            return False
        kv = dict(_KV.findall(m["rest"]))
        if "rank" not in kv:
            return True  # other "comm 0x..." chatter (e.g. NVLS setup): nothing to record
        rank = _rank(kv["rank"])
        nranks = _int_or_none(kv.get("nranks") or kv.get("nRanks"))
        if nranks is not None and not 0 < nranks <= MAX_RANK:
            raise _Refused(f"nranks {nranks}")
        comm = self._comm_for_init(line.proc, m["ptr"], kv.get("commId"), nranks)
        if nranks is not None:
            comm.nranks = nranks
        if "nNodes" in kv:
            comm.nnodes = _rank(kv["nNodes"])
        if rank not in comm.ranks and len(comm.ranks) >= MAX_ENTRIES:
            raise _Refused(f"rank {rank} beyond {MAX_ENTRIES} ranks in one communicator")
        old = comm.ranks.get(rank, RankInfo(rank))
        comm.ranks[rank] = RankInfo(
            rank=rank,
            host=line.proc[0] or old.host,
            pid=line.proc[1] if line.proc[0] else old.pid,
            cuda_dev=_int_or_none(kv.get("cudaDev"), old.cuda_dev),
            nvml_dev=_int_or_none(kv.get("nvmlDev"), old.nvml_dev),
            bus_id=kv.get("busId", old.bus_id),
            local_rank=_int_or_none(kv.get("localRank"), old.local_rank),
        )
        return True

    def _on_channel_counts(self, line: _Line, msg: str) -> bool:
        counts = _CHANNEL_COUNTS.findall(msg)
        if not counts:
            return False
        comm = self._comm_of(line.proc, None, msg)
        for n, kind in counts:
            comm.channels[kind] = int(n)
        per_peer = _P2P_PER_PEER.search(msg)
        if per_peer:
            comm.channels["p2p_per_peer"] = int(per_peer[1])
        if comm.channels.get("nvls", 0) > 0:
            comm.nvls = True
        return True

    def _on_transport(self, line: _Line, msg: str) -> bool:
        m = _TRANSPORT.match(msg)
        if not m:
            return False
        src, dst, ch = _rank(m["src"]), _rank(m["dst"]), _channel(m["ch"])
        comm = self._comm_of(line.proc, max(src, dst))
        conn = _channel(m["conn"]) if m["conn"] is not None else 0
        via = m["via"][:200]
        if (src, dst) not in comm.links and len(comm.links) >= MAX_ENTRIES:
            raise _Refused(f"rank pair beyond {MAX_ENTRIES} in one communicator")
        link = comm.links.setdefault((src, dst), _Link())
        if len(link.vias) < 16:
            link.vias.setdefault(via, set()).add((ch, conn))
        if m["sdev"] and not comm.ranks.get(src):
            comm.ranks[src] = RankInfo(src, bus_id=_dev_as_bus(m["sdev"]))
        if m["ddev"] and not comm.ranks.get(dst):
            comm.ranks[dst] = RankInfo(dst, bus_id=_dev_as_bus(m["ddev"]))
        return True

    def _on_collnet(self, line: _Line, msg: str) -> bool:
        m = _COLLNET.match(msg)
        if not m:
            return False
        rank = _rank(m["rank"])
        _channel(m["ch"])
        self._comm_of(line.proc, rank).collnet.setdefault(rank, m["via"][:200])
        return True

    def _on_ring_order(self, line: _Line, msg: str) -> bool:
        m = _RING_ORDER.match(msg)
        order = tuple(_rank(r) for r in m["ranks"].split()[:MAX_RANK])
        comm = self._comm_of(line.proc, max(order))
        comm.rings[_channel(m["ch"])] = order
        if m["n"] is not None:
            comm.channels.setdefault("rings", int(m["n"]))
        return True

    def _on_graph_ring(self, line: _Line, msg: str) -> bool:
        m = _GRAPH_RING.match(msg)
        if not m:
            return False
        ch, _prev, rank, nxt = _channel(m[1]), *(_rank(x) for x in m.groups()[1:])
        self._comm_of(line.proc, max(rank, nxt)).ring_next.setdefault(ch, {})[rank] = nxt
        return True

    def _on_trees(self, line: _Line, msg: str) -> bool:
        found = _TREES.findall(msg)
        if not found:
            return False
        comm = self._comm_of(line.proc, max(_rank(f[4]) for f in found))
        if sum(len(n) for n in comm.trees.values()) >= MAX_ENTRIES:
            raise _Refused(f"tree nodes beyond {MAX_ENTRIES}")
        for ch, d0, d1, d2, rank, up in found:
            down = tuple(_rank(d) for d in (d0, d1, d2) if _rank(d) >= 0)
            comm.trees.setdefault(_channel(ch), {})[_rank(rank)] = TreeNode(_rank(up), down)
        return True

    def _on_graph_tree(self, line: _Line, msg: str) -> bool:
        m = _GRAPH_TREE.match(msg)
        if not m:
            return False
        ch, up, rank, d0, d1, d2 = _channel(m[1]), *(_rank(x) for x in m.groups()[1:])
        down = tuple(d for d in (d0, d1, d2) if d >= 0)
        if sum(len(n) for n in self._comm_of(line.proc, rank).trees.values()) >= MAX_ENTRIES:
            raise _Refused(f"tree nodes beyond {MAX_ENTRIES}")
        self._comm_of(line.proc, rank).trees.setdefault(ch, {})[rank] = TreeNode(up, down)
        return True

    def _on_env(self, line: _Line, msg: str) -> bool:
        m = _ENV.match(msg)
        if m:
            self._env[m["name"]] = m["value"]
        return m is not None

    def _on_network(self, line: _Line, msg: str) -> bool:
        m = _NETWORK.match(msg)
        if m and m["net"] not in self._networks:
            self._networks.append(m["net"])
        return m is not None

    def _on_net_devices(self, line: _Line, msg: str) -> bool:
        m = _NET_DEVICES.match(msg)
        text = f"{m['net']}: {m['devs']}"
        if text not in self._net_devices:
            _keep(self._net_devices, text)
        return True

    def _on_net_failed(self, line: _Line, msg: str) -> bool:
        m = _NET_FAILED.match(msg)
        name = m["net"] or m["plugin"]
        if not any(f.split(":", 1)[0] == name for f in self._net_failed):
            _keep(self._net_failed, f"{name}: {'no device found' if m['net'] else 'plugin failed to initialise'}")
        return True

    def _on_gdr_nic(self, line: _Line, msg: str) -> bool:
        m = _GDR_NIC.match(msg)
        text = f"{m['net']} {m['nic']}: GPU Direct RDMA {m['state'].lower()}"
        if text not in self._gdr_nics:
            _keep(self._gdr_nics, text)
        return True

    def _on_rings_connected(self, line: _Line, msg: str) -> bool:
        m = re.search(r"PXN (\d+) GDR (\d+)", msg)
        if m:
            comm = self._comm_of(line.proc, None)
            comm.ring_pxn, comm.ring_gdr = int(m[1]), int(m[2])
        return True

    def _on_matrix_title(self, line: _Line, msg: str) -> bool:
        # the table itself follows on lines of its own, without NCCL's prefix
        self._matrix_cols = ()
        rest = msg.split(":", 1)[1] if ":" in msg else ""
        if rest.strip():
            self._on_matrix_row(rest)
        return True

    def _on_matrix_row(self, text: str) -> bool:
        """A line of NCCL's `Enabled NCCL Func/Proto/Algo Matrix` table (header or function row)."""
        cells = [c.split() for c in _TORCHRUN.sub("", text).split("|")]
        if len(cells) < 2 or len(cells[0]) != 1:
            return False
        head, groups = cells[0][0], cells[1:]
        if head == "Function":
            if not all(groups) or not all(re.fullmatch(r"[A-Za-z][\w]*", n) for g in groups for n in g):
                return False
            self._matrix_cols = tuple(tuple(g) for g in groups)
            return True
        cols = self._matrix_cols
        if not cols or not re.fullmatch(r"[A-Za-z]\w*", head) or [len(g) for g in groups] != [len(g) for g in cols]:
            return False
        if not all(v.isdigit() and len(v) < 4 for g in groups for v in g):
            return False
        if len(self._matrix) < 32:
            row = self._matrix.setdefault(head, {})
            for names, values in zip(cols, groups, strict=True):
                for name, value in zip(names, values, strict=True):
                    row.setdefault(name, int(value))
        return True

    def _on_pattern(self, line: _Line, msg: str) -> bool:
        m = _PATTERN.match(msg)
        if not m:
            return False
        comm = self._comm_of(line.proc, None)
        if m[2] not in comm.graph_types:
            comm.graph_types.append(m[2])
        return True

    def _on_nvls(self, line: _Line, msg: str) -> bool:
        # "NVLS comm 0x... headRank ..." / "NVLS multicast support is available": NVLink SHARP.
        if "not available" not in msg and "disabled" not in msg.lower():
            self._comm_of(line.proc, None).nvls = True
        return True

    def _on_tuning(self, line: _Line, msg: str) -> bool:
        m = _TUNING.match(msg)
        if not m:
            return False
        channels = None
        if m["lo"] is not None:
            channels = int(m["hi"]) - int(m["lo"]) + 1
        key = (m["op"], int(m["bytes"]), _name(m["algo"], ALGORITHMS),
               _name(m["proto"], PROTOCOLS), channels, None, None)  # fmt: skip
        if key in self._colls or len(self._colls) < MAX_COLLECTIVE_SHAPES:
            self._colls[key] = self._colls.get(key, 0) + 1
        return True

    def _on_coll(self, line: _Line, msg: str) -> bool:
        m = _COLL.match(msg)
        if not m:
            return False
        # Every rank prints COLL lines; count one process so calls are not multiplied by nranks.
        if self._coll_proc is None:
            self._coll_proc = line.proc
        if line.proc != self._coll_proc:
            return True
        dt = int(m["dt"])
        name, size = DATATYPES[dt] if dt < len(DATATYPES) else (f"type{dt}", None)
        count = int(m["count"])
        key = (m["op"], count * size if size else None, None, None, None, count, name)
        if key in self._colls or len(self._colls) < MAX_COLLECTIVE_SHAPES:
            self._colls[key] = self._colls.get(key, 0) + 1
        return True

    # -- communicator bookkeeping

    def _comm_for_init(
        self, proc: tuple[str, int] | None, ptr: str, comm_id: str | None, nranks: int | None
    ) -> _Comm:
        ptr_key = (proc[0], proc[1], ptr) if proc else None
        key = self._ptr_key.get(ptr_key) if ptr_key else None
        if key is None:
            # Without commId (old NCCL) all comms of one size are taken to be the same one.
            key = comm_id or f"nranks={nranks}"
            if ptr_key:
                self._ptr_key[ptr_key] = key
        if key not in self._comms and len(self._comms) >= MAX_COMMS:
            raise _Refused(f"communicator beyond {MAX_COMMS}")
        comm = self._comms.setdefault(key, _Comm(key))
        if comm_id:
            comm.comm_id = comm_id
        if proc:
            keys = self._proc_comms.setdefault(proc, [])
            if key not in keys:
                keys.append(key)
        return comm

    def _comm_of(self, proc: tuple[str, int] | None, max_rank: int | None, msg: str = "") -> _Comm:
        """The communicator a line from `proc` most likely belongs to: the latest one started in
        that process that is big enough for the ranks it names. Lines name no comm, so this is a
        heuristic; it is exact for the usual one-communicator DDP job."""
        ptr = re.match(r"comm (0x[0-9a-fA-F]+)", msg)
        if ptr and proc and (proc[0], proc[1], ptr[1]) in self._ptr_key:
            return self._comms[self._ptr_key[(proc[0], proc[1], ptr[1])]]
        for key in reversed(self._proc_comms.get(proc, []) if proc else []):
            comm = self._comms[key]
            if comm.nranks is None or max_rank is None or max_rank < comm.nranks:
                return comm
        return self._comms.setdefault("", _Comm(""))

    # -- output

    def report(self) -> NcclReport:
        comms = tuple(_freeze(c) for c in self._comms.values() if _has_content(c))
        full = sorted(self._versions)
        return NcclReport(
            version=self._versions[full[0]] if full else None,
            version_full=full[0] if full else None,
            versions=tuple(full),
            communicators=comms,
            networks=tuple(self._networks),
            # a network that said "No device found" did not initialise, whatever else named it
            net_devices=tuple(d for d in self._net_devices
                              if d.split(":", 1)[0] not in {f.split(":", 1)[0] for f in self._net_failed}),
            env=dict(self._env),
            collectives=tuple(
                CollectiveStat(op, b, algo, proto, ch, calls, count, dt)
                for (op, b, algo, proto, ch, count, dt), calls in self._colls.items()
            ),
            warnings=tuple(self._warnings),
            unknown_lines=tuple(self._unknown),
            unknown_count=self.unknown_count,
            garbled_count=self.garbled_count,
            other_count=self.other_count,
            nccl_lines=self.nccl_lines,
            warning_count=self.warning_count,
            net_failed=tuple(self._net_failed),
            gdr_nics=tuple(self._gdr_nics),
            algo_matrix={f: dict(v) for f, v in self._matrix.items()},
            refused_count=self.refused_count,
            refused_first=self.refused_first,
        )


def _split(line: str) -> _Line | None:
    m = _PREFIX.search(line)
    if m:
        return _Line((m["host"], int(m["pid"])), m["level"], m["msg"])
    m = _BARE.search(line)
    if m:
        return _Line(_NO_PROC, m["level"], m["msg"])
    return None


def _keep(store: list[str], text: str) -> None:
    if len(store) < MAX_KEPT_LINES:
        store.append(text[:KEPT_CHARS])


def _int_or_none(text: str | None, default: int | None = None) -> int | None:
    if text is None:
        return default
    try:
        return int(text, 0) if text.startswith("0x") else int(text)
    except ValueError:
        return default


def _dev_as_bus(dev: str) -> str | None:
    # New logs print the NVML device index in brackets, old ones the PCI bus id (hex, e.g. 1b000).
    return None if dev.isdigit() and len(dev) < 4 else dev


def _name(value: str, names: tuple[str, ...]) -> str:
    """Old NCCL printed algorithm/protocol ids; newer ones print names. Normalise to upper case."""
    if value.isdigit() and int(value) < len(names):
        return names[int(value)].upper()
    return value.upper()


def _has_content(c: _Comm) -> bool:
    return bool(c.ranks or c.links or c.rings or c.trees or c.channels or c.collnet)


def _freeze(c: _Comm) -> Communicator:
    nranks = c.nranks
    if nranks is None:
        seen = [r for pair in c.links for r in pair] + list(c.ranks)
        nranks = max(seen) + 1 if seen else None
    return Communicator(
        key=c.key,
        comm_id=c.comm_id,
        nranks=nranks,
        nnodes=c.nnodes,
        ranks=dict(c.ranks),
        transports={pair: _choose(pair, link) for pair, link in sorted(c.links.items())},
        rings=dict(c.rings),
        ring_next={ch: dict(n) for ch, n in c.ring_next.items()},
        trees={ch: dict(n) for ch, n in c.trees.items()},
        channels=dict(c.channels),
        graph_types=tuple(c.graph_types),
        collnet=dict(c.collnet),
        nvls=c.nvls,
        ring_pxn=c.ring_pxn,
        ring_gdr=c.ring_gdr,
    )


def _choose(pair: tuple[int, int], link: _Link) -> Transport:
    # The path carrying the most channels is the one collectives use; others are usually
    # the p2p (send/recv) connection set, kept for display.
    ranked = sorted(link.vias.items(), key=lambda kv: (-len(kv[1]), kv[0]))
    via, uses = ranked[0]
    return Transport(
        src=pair[0],
        dst=pair[1],
        label=transport_label(via),
        via=via,
        channels=tuple(sorted({ch for ch, _conn in uses})),
        others=tuple(v for v, _ in ranked[1:]),
    )


def parse_lines(lines: Iterable[str]) -> NcclReport:
    """Parse NCCL_DEBUG output (any ranks, any order, prefixes allowed) into a report."""
    return NcclParser().feed_lines(lines).report()


def parse_text(text: str) -> NcclReport:
    return parse_lines(text.splitlines())


# ---------------------------------------------------------------------------- rendering


def transport_matrix(
    report: NcclReport | Communicator,
) -> tuple[list[int], dict[tuple[int, int], str]]:
    """Ranks and (src, dst) -> short label, for views that draw their own grid."""
    comm = report.primary if isinstance(report, NcclReport) else report
    if comm is None:
        return [], {}
    n = comm.nranks or 0
    ranks = list(range(n)) if n else sorted({r for p in comm.transports for r in p})
    return ranks, {pair: t.label for pair, t in comm.transports.items()}


def render_matrix(report: NcclReport | Communicator) -> str:
    """Rank x rank text matrix of the transport NCCL chose (row sends to column); for a job with
    no transport lines says so, for more than MAX_MATRIX_RANKS ranks counts pairs per transport."""
    comm = report.primary if isinstance(report, NcclReport) else report
    warned = isinstance(report, NcclReport) and report.warning_count > 0
    if comm is None or not comm.transports:
        return "no transport lines: NCCL never connected" + (" (see warnings)" if warned else
                                                                " (or NCCL_DEBUG was not INFO)")
    ranks, labels = transport_matrix(comm)
    if len(ranks) > MAX_MATRIX_RANKS:
        counts: dict[str, int] = {}
        for label in labels.values():
            counts[label] = counts.get(label, 0) + 1
        pairs = ", ".join(f"{label} {n} pairs" for label, n in sorted(counts.items(), key=lambda kv: -kv[1]))
        return f"{len(ranks)} ranks: too many for a matrix; transports seen: {pairs}"
    cells = [["" if i < 0 else f"r{i}" for i in [-1, *ranks]]]
    for src in ranks:
        row = [f"r{src}"]
        for dst in ranks:
            row.append("X" if src == dst else labels.get((src, dst), "."))
        cells.append(row)
    width = max(len(c) for row in cells for c in row) + 2
    lines = ["".join(c.ljust(width) for c in row).rstrip() for row in cells]
    return "\n".join([*lines, "(row sends to column; . = no direct connection)"])


def render_algo_matrix(matrix: dict[str, dict[str, int]]) -> list[str]:
    """NCCL's `Enabled NCCL Func/Proto/Algo Matrix` as a table (0 = disabled; NCCL prints 2 for
    a protocol enabled by default rather than by NCCL_PROTO), and the functions left with no
    protocol or no algorithm, which fail at their first call."""
    if not matrix:
        return []
    cols: list[str] = []
    for row in matrix.values():
        cols.extend(c for c in row if c not in cols)
    protos = [c for c in cols if c in PROTOCOLS or c.upper() in ("LL", "LL128", "SIMPLE")]
    algos = [c for c in cols if c not in protos]
    width = max(len(f) for f in matrix) + 2
    head = "Function".ljust(width) + " ".join(c.rjust(max(len(c), 2)) for c in protos)
    head += " | " + " ".join(c.rjust(max(len(c), 2)) for c in algos)
    out = ["enabled Func/Proto/Algo (NCCL's matrix):", "  " + head]
    dead = []
    for func, row in list(matrix.items())[:16]:
        line = func.ljust(width) + " ".join(str(row.get(c, "-")).rjust(max(len(c), 2)) for c in protos)
        line += " | " + " ".join(str(row.get(c, "-")).rjust(max(len(c), 2)) for c in algos)
        out.append("  " + line)
        usable = [c for c in algos if row.get(c) and c in IMPLEMENTED.get(func, algos)]
        if not any(row.get(c) for c in protos) or not usable:
            dead.append(func)
    if dead:
        out.append(f"  no enabled protocol or algorithm that NCCL implements for: {', '.join(dead)} "
                   "(their first call fails; see NCCL_ALGO / NCCL_PROTO)")
    return out


def _gdr_pxn_lines(report: NcclReport, comm: Communicator | None) -> list[str]:
    out = []
    if comm is not None and comm.ring_gdr is not None:
        out.append(f"rings: GDR {'on' if comm.ring_gdr else 'off'}, PXN {'on' if comm.ring_pxn else 'off'} "
                   "(NCCL's 'Connected all rings')")
    nets = [t for t in (comm.transports.values() if comm else ()) if t.kind in ("net", "collnet")]
    for t in nets[:SHOWN]:
        pxn = f", PXN via r{t.pxn_rank}" if t.pxn_rank is not None else ", no PXN"
        out.append(f"  r{t.src}->r{t.dst} via {t.via}: GDR {'on' if t.gdr else 'off'}{pxn}, "
                   f"channels {_span(t.channels)}")
    if len(nets) > SHOWN:
        gdr = sum(t.gdr for t in nets)
        out.append(f"  ... {len(nets) - SHOWN} more NET pairs ({gdr} of {len(nets)} with GDR)")
    out.extend(f"  {nic}" for nic in report.gdr_nics[:SHOWN])
    return out


def _span(channels: tuple[int, ...]) -> str:
    if channels and list(channels) == list(range(channels[0], channels[-1] + 1)) and len(channels) > 2:
        return f"{channels[0]}-{channels[-1]}"
    return ",".join(map(str, channels[:16])) + ("..." if len(channels) > 16 else "")


def render_warnings(report: NcclReport) -> list[str]:
    """NCCL's WARN lines: how many, the first, and the other distinct ones (bounded)."""
    if not report.warning_count:
        return []
    out = [f"warnings: {report.warning_count} NCCL WARN line(s); first: {report.warnings[0]}"]
    seen = {report.warnings[0]}
    for w in report.warnings[1:]:
        if w not in seen and len(seen) <= SHOWN:
            seen.add(w)
            out.append(f"  also: {w}")
    return out


def render_facts(report: NcclReport) -> str:
    """The NCCL facts worth a glance: version, ranks, network, channels, env, algorithms."""
    comm = report.primary
    out = [f"NCCL {report.version_full or 'version unknown'}"]
    if len(report.versions) > 1:
        out.append(f"  WARNING: ranks report different versions: {', '.join(report.versions)}")
    if comm:
        nodes = f", {comm.nnodes} node(s)" if comm.nnodes is not None else ""
        cid = f" (commId {comm.comm_id})" if comm.comm_id else ""
        out.append(f"ranks: {comm.nranks}{nodes}{cid}")
        if comm.channels:
            out.append("channels: " + ", ".join(f"{k} {v}" for k, v in comm.channels.items()))
        if comm.graph_types:
            out.append("graph path types: " + ", ".join(comm.graph_types))
        if comm.collnet:
            out.append("collnet: " + ", ".join(sorted(set(comm.collnet.values()))))
        if comm.nvls:
            out.append("NVLS (NVLink SHARP): in use")
    if len(report.communicators) > 1:
        out.append(f"communicators: {len(report.communicators)} (showing the largest)")
    out.append(f"network: {', '.join(report.networks) or 'n/a'}")
    out.extend(f"  devices: {d}" for d in report.net_devices[:SHOWN])
    out.extend(f"  not initialised: {d}" for d in report.net_failed[:SHOWN])
    out.extend(_gdr_pxn_lines(report, comm))
    for name, value in list(report.env.items())[:2 * SHOWN]:
        out.append(f"env: {name}={value}")
    out.extend(render_algo_matrix(report.algo_matrix))
    out.extend(_collective_lines(report)[:2 * SHOWN])
    out.extend(render_warnings(report))
    if report.refused_count:
        out.append(f"refused: {report.refused_count} line(s) naming impossible ranks or channels; "
                   f"first: {report.refused_first}")
    tail = f"lines: {report.nccl_lines} NCCL, {report.unknown_count} unknown, "
    out.append(tail + f"{report.garbled_count} garbled, {report.warning_count} warnings")
    return "\n".join(out)


def _collective_lines(report: NcclReport) -> list[str]:
    by_op: dict[str, list[CollectiveStat]] = {}
    for c in report.collectives:
        by_op.setdefault(c.op, []).append(c)
    out = []
    for op, stats in sorted(by_op.items()):
        calls = sum(s.calls for s in stats)
        total = sum((s.bytes or 0) * s.calls for s in stats)
        algos = sorted({f"{s.algorithm}/{s.protocol}" for s in stats if s.algorithm})
        out.append(
            f"{op}: {calls} calls, {_human(total)} total"
            + (f", {' '.join(algos)}" if algos else "")
        )
    return out


def _human(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


def render_report(report: NcclReport) -> str:
    return render_facts(report) + "\n\n" + render_matrix(report)


# ---------------------------------------------------------------------------- CLI


class LogFile:
    """Lines of one log file, plain or gzipped (by its magic bytes, whatever its name), read in
    chunks up to `max_bytes` (then `truncated`); a line longer than MAX_LINE_CHARS is cut and
    the rest of it skipped; bytes that are not UTF-8 become U+FFFD (counted as garbled)."""

    def __init__(self, path: str, max_bytes: int = MAX_FILE_BYTES) -> None:
        self.path, self.max_bytes = path, max_bytes
        self.read_bytes = 0
        self.truncated = False
        self.compressed = False

    def lines(self) -> Iterator[str]:
        pending, skipping = b"", False
        for chunk in self._chunks():
            if skipping:
                cut = chunk.find(b"\n")
                if cut < 0:
                    continue
                chunk, skipping = chunk[cut + 1:], False
            parts = (pending + chunk).split(b"\n")
            pending = parts.pop()
            for part in parts:
                yield part[:MAX_LINE_CHARS].decode("utf-8", "replace")
            if len(pending) > MAX_LINE_CHARS:
                yield pending[:MAX_LINE_CHARS].decode("utf-8", "replace")
                pending, skipping = b"", True
        if pending:
            yield pending.decode("utf-8", "replace")

    def _chunks(self) -> Iterator[bytes]:
        """The file's bytes (decompressed when gzipped), at most max_bytes of them; a .gz cut
        short raises EOFError after what could be read."""
        with open(self.path, "rb") as f:
            self.compressed = f.read(2) == b"\x1f\x8b"
            f.seek(0)
            unzip = zlib.decompressobj(wbits=31) if self.compressed else None
            data = b""
            while self.read_bytes < self.max_bytes:
                if not data:
                    data = f.read(1 << 20 if unzip is None else 1 << 16)
                    if not data:
                        if unzip is not None and not unzip.eof:
                            raise EOFError("compressed log ends early")
                        return
                if unzip is None:
                    out, data = data, b""
                else:
                    if unzip.eof:  # another gzip member follows
                        data, unzip = unzip.unused_data + data, zlib.decompressobj(wbits=31)
                    out = unzip.decompress(data, 1 << 20)  # bounded: a small .gz may inflate to GBs
                    data = unzip.unconsumed_tail
                room = self.max_bytes - self.read_bytes
                if len(out) > room:
                    out, self.truncated = out[:room], True
                self.read_bytes += len(out)
                if out:
                    yield out
            if not self.truncated:
                self.truncated = bool(data) or bool(f.read(1)) or (unzip is not None and not unzip.eof)


def read_log_lines(path: str, max_bytes: int = MAX_FILE_BYTES) -> Iterator[str]:
    """Lines of one log file (plain or gzipped), at most `max_bytes` of it."""
    return LogFile(path, max_bytes).lines()


def nccl_parser() -> OneLineParser:
    p = OneLineParser(
        prog="ddptop nccl",
        description="Show the NCCL transport matrix and facts from NCCL_DEBUG=INFO logs (plain or .gz).",
    )
    p.add_argument("logs", nargs="+", metavar="LOGFILE")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.add_argument("--max-mb", type=float, default=MAX_FILE_BYTES >> 20,
                   help=f"read at most this many MB of each file (default {MAX_FILE_BYTES >> 20})")
    return p


def main_nccl(argv: list[str]) -> int:
    """`ddptop nccl LOGFILE... [--json]`: transport matrix and facts from NCCL_DEBUG logs.
    Usage mistakes raise UsageError (one line, exit 2 from the main command)."""
    args = nccl_parser().parse_args(argv)
    if not (args.max_mb == args.max_mb and 0 < args.max_mb <= 1 << 20):
        raise UsageError(f"--max-mb must be above 0 and at most {1 << 20}, got {args.max_mb:g}")
    parser = NcclParser()
    readable, notes = 0, []
    for path in args.logs:
        log = LogFile(path, int(args.max_mb * (1 << 20)))
        try:
            parser.feed_lines(log.lines())
            readable += 1
        except OSError as err:  # missing, unreadable, a directory, a broken .gz
            if log.read_bytes:
                readable += 1
                notes.append(f"{_show(path)}: stopped after {log.read_bytes >> 20} MB: {_os_error(err)}")
            else:
                print(f"ddptop nccl: skipping {_show(path)}: {_os_error(err)}", file=sys.stderr)
            continue
        except (EOFError, zlib.error) as err:  # a .gz cut short
            readable += 1
            notes.append(f"{_show(path)}: compressed log ends early ({type(err).__name__})")
            continue
        if log.truncated:
            notes.append(f"{_show(path)}: read the first {log.read_bytes / (1 << 20):.0f} MB only (--max-mb)")
    if readable == 0:
        print("ddptop nccl: none of the log files could be read", file=sys.stderr)
        return 2
    for note in notes[:SHOWN]:
        print(f"ddptop nccl: {note}", file=sys.stderr)
    report = parser.report()
    if args.json:
        data = report.to_dict()
        data["files_read"] = readable
        data["files_skipped"] = len(args.logs) - readable
        data["notes"] = notes
        _emit(json.dumps(data, indent=2))
    elif report.nccl_lines == 0:
        _emit("ddptop nccl: no NCCL_DEBUG lines found (was NCCL_DEBUG=INFO set?)")
    else:
        _emit(render_report(report))
    return 0 if report.nccl_lines else 1


def _emit(text: str) -> None:
    """Print; a reader that went away (`| head`) ends the output, not the command with a traceback."""
    try:
        print(text, flush=True)
    except BrokenPipeError:
        with contextlib.suppress(OSError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error at exit


def _show(path: str) -> str:
    return ascii(path)[1:-1] if not path.isprintable() else path


def _os_error(err: OSError) -> str:
    return str(err.strerror or err)[:200]
