"""The communicators an NCCL log describes: init lines (ranks, devices, commId), the
per-pair transports, rings, trees, channel counts, CollNet/NVLS and graph search lines,
gathered per communicator and frozen into `Communicator` records. Pure."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from ddptop.analysis.nccl.lines import Line, Refused, int_or_none, parse_channel, parse_rank
from ddptop.analysis.nccl.model import (
    MAX_COMMS,
    MAX_ENTRIES,
    MAX_RANK,
    Communicator,
    RankInfo,
    Transport,
    TreeNode,
    transport_label,
)

_COMM = re.compile(r"^(?:(?P<fn>\w+) )?comm (?P<ptr>0x[0-9a-fA-F]+) (?P<rest>.*)$")
_KV = re.compile(
    r"\b(rank|nranks|nRanks|cudaDev|nvmlDev|busId|commId|nNodes|localRanks|localRank)\s+(\S+)"
)
_CHANNEL_COUNTS = re.compile(r"(\d+) (coll|collnet|nvls|p2p) channels(?! per peer)")
_P2P_PER_PEER = re.compile(r"(\d+) p2p channels per peer")
RING_ORDER = re.compile(
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


class CommTracker:
    """Communicator lines, fed by NcclParser (each `on_*` handler takes one line and returns
    False when it has the shape's keyword but not its form)."""

    def __init__(self) -> None:
        self._comms: dict[str, _Comm] = {}
        self._proc_comms: dict[tuple[str, int], list[str]] = {}
        self._ptr_key: dict[tuple[str, int, str], str] = {}

    def on_comm(self, line: Line, msg: str) -> bool:
        m = _COMM.match(msg)
        if not m:
            return False
        kv = dict(_KV.findall(m["rest"]))
        if "rank" not in kv:
            return True  # other "comm 0x..." chatter (e.g. NVLS setup): nothing to record
        rank = parse_rank(kv["rank"])
        nranks = int_or_none(kv.get("nranks") or kv.get("nRanks"))
        if nranks is not None and not 0 < nranks <= MAX_RANK:
            raise Refused(f"nranks {nranks}")
        comm = self._comm_for_init(line.proc, m["ptr"], kv.get("commId"), nranks)
        if nranks is not None:
            comm.nranks = nranks
        if "nNodes" in kv:
            comm.nnodes = parse_rank(kv["nNodes"])
        if rank not in comm.ranks and len(comm.ranks) >= MAX_ENTRIES:
            raise Refused(f"rank {rank} beyond {MAX_ENTRIES} ranks in one communicator")
        old = comm.ranks.get(rank, RankInfo(rank))
        comm.ranks[rank] = RankInfo(
            rank=rank,
            host=line.proc[0] or old.host,
            pid=line.proc[1] if line.proc[0] else old.pid,
            cuda_dev=int_or_none(kv.get("cudaDev"), old.cuda_dev),
            nvml_dev=int_or_none(kv.get("nvmlDev"), old.nvml_dev),
            bus_id=kv.get("busId", old.bus_id),
            local_rank=int_or_none(kv.get("localRank"), old.local_rank),
        )
        return True

    def on_channel_counts(self, line: Line, msg: str) -> bool:
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

    def on_transport(self, line: Line, msg: str) -> bool:
        m = _TRANSPORT.match(msg)
        if not m:
            return False
        src, dst, ch = parse_rank(m["src"]), parse_rank(m["dst"]), parse_channel(m["ch"])
        comm = self._comm_of(line.proc, max(src, dst))
        conn = parse_channel(m["conn"]) if m["conn"] is not None else 0
        via = m["via"][:200]
        if (src, dst) not in comm.links and len(comm.links) >= MAX_ENTRIES:
            raise Refused(f"rank pair beyond {MAX_ENTRIES} in one communicator")
        link = comm.links.setdefault((src, dst), _Link())
        if len(link.vias) < 16:
            link.vias.setdefault(via, set()).add((ch, conn))
        if m["sdev"] and not comm.ranks.get(src):
            comm.ranks[src] = RankInfo(src, bus_id=_dev_as_bus(m["sdev"]))
        if m["ddev"] and not comm.ranks.get(dst):
            comm.ranks[dst] = RankInfo(dst, bus_id=_dev_as_bus(m["ddev"]))
        return True

    def on_collnet(self, line: Line, msg: str) -> bool:
        m = _COLLNET.match(msg)
        if not m:
            return False
        rank = parse_rank(m["rank"])
        parse_channel(m["ch"])
        self._comm_of(line.proc, rank).collnet.setdefault(rank, m["via"][:200])
        return True

    def on_ring_order(self, line: Line, msg: str) -> bool:
        m = RING_ORDER.match(msg)
        if not m:
            return False
        order = tuple(parse_rank(r) for r in m["ranks"].split()[:MAX_RANK])
        comm = self._comm_of(line.proc, max(order))
        comm.rings[parse_channel(m["ch"])] = order
        if m["n"] is not None:
            comm.channels.setdefault("rings", int(m["n"]))
        return True

    def on_graph_ring(self, line: Line, msg: str) -> bool:
        m = _GRAPH_RING.match(msg)
        if not m:
            return False
        ch, _prev, rank, nxt = parse_channel(m[1]), *(parse_rank(x) for x in m.groups()[1:])
        self._comm_of(line.proc, max(rank, nxt)).ring_next.setdefault(ch, {})[rank] = nxt
        return True

    def on_trees(self, line: Line, msg: str) -> bool:
        found = _TREES.findall(msg)
        if not found:
            return False
        comm = self._comm_of(line.proc, max(parse_rank(f[4]) for f in found))
        if sum(len(n) for n in comm.trees.values()) >= MAX_ENTRIES:
            raise Refused(f"tree nodes beyond {MAX_ENTRIES}")
        for ch, d0, d1, d2, rank, up in found:
            down = tuple(parse_rank(d) for d in (d0, d1, d2) if parse_rank(d) >= 0)
            comm.trees.setdefault(parse_channel(ch), {})[parse_rank(rank)] = TreeNode(parse_rank(up), down)
        return True

    def on_graph_tree(self, line: Line, msg: str) -> bool:
        m = _GRAPH_TREE.match(msg)
        if not m:
            return False
        ch, up, rank, d0, d1, d2 = parse_channel(m[1]), *(parse_rank(x) for x in m.groups()[1:])
        down = tuple(d for d in (d0, d1, d2) if d >= 0)
        if sum(len(n) for n in self._comm_of(line.proc, rank).trees.values()) >= MAX_ENTRIES:
            raise Refused(f"tree nodes beyond {MAX_ENTRIES}")
        self._comm_of(line.proc, rank).trees.setdefault(ch, {})[rank] = TreeNode(up, down)
        return True


    def on_rings_connected(self, line: Line, msg: str) -> bool:
        m = re.search(r"PXN (\d+) GDR (\d+)", msg)
        if m:
            comm = self._comm_of(line.proc, None)
            comm.ring_pxn, comm.ring_gdr = int(m[1]), int(m[2])
        return True

    def on_pattern(self, line: Line, msg: str) -> bool:
        m = _PATTERN.match(msg)
        if not m:
            return False
        comm = self._comm_of(line.proc, None)
        if m[2] not in comm.graph_types:
            comm.graph_types.append(m[2])
        return True

    def on_nvls(self, line: Line, msg: str) -> bool:
        # "NVLS comm 0x... headRank ..." / "NVLS multicast support is available": NVLink SHARP.
        if "not available" not in msg and "disabled" not in msg.lower():
            self._comm_of(line.proc, None).nvls = True
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
            raise Refused(f"communicator beyond {MAX_COMMS}")
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

    # -- output

    def communicators(self) -> tuple[Communicator, ...]:
        return tuple(_freeze(c) for c in self._comms.values() if _has_content(c))


def _dev_as_bus(dev: str) -> str | None:
    # New logs print the NVML device index in brackets, old ones the PCI bus id (hex, e.g. 1b000).
    return None if dev.isdigit() and len(dev) < 4 else dev


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
