"""An NcclReport as text: the rank x rank transport matrix, the enabled algorithm matrix
and the facts worth a glance. Shared by `ddptop nccl` and the TUI's wiring panel. Pure."""

from __future__ import annotations

from ddptop.analysis.nccl.model import (
    IMPLEMENTED,
    MAX_MATRIX_RANKS,
    PROTOCOLS,
    SHOWN,
    CollectiveStat,
    Communicator,
    NcclReport,
)


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
