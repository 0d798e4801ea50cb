"""NCCL_DEBUG=INFO log parser: lines in (any ranks, any order, prefixes allowed), an
NcclReport out. Job-wide facts (version, env overrides, networks, GDR, the enabled
algorithm matrix, TUNING/COLL collectives) are read here; communicator lines go to
CommTracker. Pure: no I/O, no torch, no textual, no NVML.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable

from ddptop.analysis.nccl.comms import RING_ORDER, CommTracker
from ddptop.analysis.nccl.lines import Line, Refused, split_line
from ddptop.analysis.nccl.model import (
    ALGORITHMS,
    DATATYPES,
    KEPT_CHARS,
    MAX_COLLECTIVE_SHAPES,
    MAX_KEPT_LINES,
    MAX_LINE_CHARS,
    PROTOCOLS,
    CollectiveStat,
    NcclReport,
)

_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f\ufffd]")
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_VERSION = re.compile(r"^NCCL version (?P<full>(?P<num>\d+\.\d+\.\d+)\S*)")
_NETWORK = re.compile(r"^Using network (?P<net>.+?)\s*$")
_NET_DEVICES = re.compile(r"^NET/(?P<net>\w+) ?: Using (?P<devs>.+?)\s*$")
_ENV = re.compile(r"^(?P<name>[A-Z][A-Z0-9_]*) set by environment to (?P<value>.*?)\.?\s*$")
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


Handler = Callable[[Line, str], bool]


class NcclParser:
    """Incremental parser: `feed` lines as they arrive (from any rank, any order), call
    `report()` for an immutable snapshot. Never raises on input."""

    def __init__(self) -> None:
        self._comms = CommTracker()
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
        parsed = split_line(line)
        if parsed is None:
            if self._matrix_cols is not None and self._on_matrix_row(line):
                self.nccl_lines += 1
            else:
                self.other_count += 1
            return
        self.nccl_lines += 1
        try:
            self._dispatch(parsed)
        except Refused as exc:
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

    def _dispatch(self, line: Line) -> None:
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

    def _make_handlers(self) -> tuple[tuple[Callable[[str], bool], Handler], ...]:
        # (cheap trigger, handler): the first trigger that fires owns the line.
        comms = self._comms
        return (
            (lambda m: m.startswith("NCCL version"), self._on_version),
            (lambda m: " Bytes -> Algo" in m, self._on_tuning),
            (lambda m: ": opCount " in m, self._on_coll),
            (lambda m: " coll channels" in m, comms.on_channel_counts),
            (
                lambda m: m.startswith(("Channel ", "Ring ")) and ("via" in m or "[" in m),
                comms.on_transport,
            ),
            (lambda m: m.startswith("Coll") and " via " in m, comms.on_collnet),
            (lambda m: RING_ORDER.match(m) is not None, comms.on_ring_order),
            (lambda m: m.startswith("Ring ") and "->" in m, comms.on_graph_ring),
            (lambda m: m.startswith("Trees"), comms.on_trees),
            (lambda m: m.startswith("Tree ") and "->" in m, comms.on_graph_tree),
            (lambda m: " set by environment to " in m, self._on_env),
            (lambda m: m.startswith("Using network"), self._on_network),
            (lambda m: re.match(r"(?:\w+ )?comm 0x", m) is not None, comms.on_comm),
            (lambda m: m.startswith("Pattern "), comms.on_pattern),
            (lambda m: m.startswith("NVLS"), comms.on_nvls),
            (lambda m: _NET_DEVICES.match(m) is not None, self._on_net_devices),
            (lambda m: m.startswith("Enabled NCCL Func/Proto/Algo Matrix"), self._on_matrix_title),
            (lambda m: m.startswith("Connected all rings"), comms.on_rings_connected),
            (lambda m: _NET_FAILED.match(m) is not None, self._on_net_failed),
            (lambda m: _GDR_NIC.match(m) is not None, self._on_gdr_nic),
        )

    # -- handlers: each returns False when the line has the shape's keyword but not its form

    def _on_version(self, line: Line, msg: str) -> bool:
        m = _VERSION.match(msg)
        if m:
            self._versions.setdefault(m["full"], m["num"])
        return m is not None

    def _on_env(self, line: Line, msg: str) -> bool:
        m = _ENV.match(msg)
        if m:
            self._env[m["name"]] = m["value"]
        return m is not None

    def _on_network(self, line: Line, msg: str) -> bool:
        m = _NETWORK.match(msg)
        if m and m["net"] not in self._networks:
            self._networks.append(m["net"])
        return m is not None

    def _on_net_devices(self, line: Line, msg: str) -> bool:
        m = _NET_DEVICES.match(msg)
        if not m:
            return False
        text = f"{m['net']}: {m['devs']}"
        if text not in self._net_devices:
            _keep(self._net_devices, text)
        return True

    def _on_net_failed(self, line: Line, msg: str) -> bool:
        m = _NET_FAILED.match(msg)
        if not m:
            return False
        name = m["net"] or m["plugin"]
        if not any(f.split(":", 1)[0] == name for f in self._net_failed):
            _keep(self._net_failed, f"{name}: {'no device found' if m['net'] else 'plugin failed to initialise'}")
        return True

    def _on_gdr_nic(self, line: Line, msg: str) -> bool:
        m = _GDR_NIC.match(msg)
        if not m:
            return False
        text = f"{m['net']} {m['nic']}: GPU Direct RDMA {m['state'].lower()}"
        if text not in self._gdr_nics:
            _keep(self._gdr_nics, text)
        return True

    def _on_matrix_title(self, line: Line, msg: str) -> bool:
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

    def _on_tuning(self, line: Line, msg: str) -> bool:
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

    def _on_coll(self, line: Line, msg: str) -> bool:
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

    # -- output

    def report(self) -> NcclReport:
        comms = self._comms.communicators()
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


def _keep(store: list[str], text: str) -> None:
    if len(store) < MAX_KEPT_LINES:
        store.append(text[:KEPT_CHARS])


def _name(value: str, names: tuple[str, ...]) -> str:
    """Old NCCL printed algorithm/protocol ids; newer ones print names. Normalise to upper case."""
    if value.isdigit() and int(value) < len(names):
        return names[int(value)].upper()
    return value.upper()


def parse_lines(lines: Iterable[str]) -> NcclReport:
    """Parse NCCL_DEBUG output (any ranks, any order, prefixes allowed) into a report."""
    return NcclParser().feed_lines(lines).report()


def parse_text(text: str) -> NcclReport:
    return parse_lines(text.splitlines())
