"""WiringPanel: under a heading that says what to do (the advisor's headline), the transport
NCCL chose for each rank pair next to the hardware link between the ranks' GPUs, the pairs
where the choice wastes the hardware (or the hardware is PCIe / host memory), NCCL's facts
and the advisor's recommendation in full.

Reads `state.nccl` (ddptop.analysis.nccl.NcclReport), `state.topology` (ddptop.hw.gpu.TopologyMatrix)
and `state.advice` (ddptop.analysis.advisor.Advice) by attribute; pynvml and torch stay out."""

from __future__ import annotations

import textwrap
from dataclasses import dataclass
from typing import Any, cast

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Vertical

from ddptop.analysis.advisor import LOSSY_CAVEAT
from ddptop.analysis.nccl import NcclReport, render_facts, transport_class, transport_matrix
from ddptop.model.state import RunState
from ddptop.tui.live import Snapshot
from ddptop.tui.render import wrap_text
from ddptop.tui.widgets.lines_view import LinesView

# How a pair is shown: the transport wastes the hardware, the path is PCIe / host memory.
SLOWER_STYLE = "bold #ffffff on #b03a2e"
PCIE_STYLE = "bold #c79100"
WARN_STYLE = "bold #d7503c"
MAX_MATRIX = 16  # ranks; past that only the flagged pairs are listed
PCIE_LINKS = ("PIX", "PXB", "PHB", "NODE", "SYS")
NETWORK = "network"  # the "hardware link" of two ranks on different nodes


@dataclass(frozen=True)
class Pair:
    """One (src, dst) rank pair: what NCCL chose, what the hardware has, the verdict."""

    src: int
    dst: int
    transport: str | None  # P2P, SHM, NET/Socket... (None: NCCL set up no direct path)
    hw: str | None  # NV18, PIX, SYS... (None: unknown)
    verdict: str  # "slower" (the choice wastes the hardware), "pcie", or ""

    @property
    def why(self) -> str:
        if self.verdict == "slower":
            return f"{self.transport} although the GPUs have {self.hw}: slower than the hardware allows"
        if self.verdict == "pcie":
            what = f"hardware link {self.hw}" if _is_pcie(self.hw) else f"{self.transport}"
            return f"{what}: traffic crosses PCIe / host memory"
        return ""


def _is_pcie(hw: str | None) -> bool:
    return hw in PCIE_LINKS


def verdict(transport: str | None, hw: str | None) -> str:
    """'slower' when NCCL's path is worse than the hardware link (SHM or NET while the
    GPUs share NVLink), 'pcie' when the path or the link is PCIe / host memory."""
    if transport is None:
        return ""
    kind = transport_class(transport, hw)
    if hw is not None and hw.startswith("NV") and kind in ("shm", "net", "pcie-p2p", "unknown"):
        return "slower"
    if kind in ("shm", "pcie-p2p") or _is_pcie(hw):
        return "pcie"
    return ""


def _bus_number(bus: str | None) -> int | None:
    """The PCI bus number of '00000000:60:00.0', '0000:60:00.0' or NCCL's short '60'."""
    if not bus:
        return None
    parts = bus.split(":")
    field = parts[-2] if len(parts) >= 2 else parts[0]
    try:
        return int(field, 16)
    except ValueError:
        return None


def _report(state: RunState) -> NcclReport | None:
    """The whole NCCL report (RunState types it by the facts its summary reads)."""
    return cast("NcclReport | None", state.nccl)


def rank_gpus(state: RunState) -> tuple[dict[int, int], str]:
    """rank -> NVML GPU index and where that came from: NCCL's own init lines (nvmlDev,
    busId, cudaDev), else the GPU sample's processes, else local_rank == GPU index."""
    topo = state.topology
    n_gpus = len(topo.gpus) if topo is not None and getattr(topo, "available", False) else None
    report = _report(state)
    comm = report.primary if report is not None else None
    if comm is not None and comm.ranks:
        out, how = {}, set()
        by_bus = {_bus_number(g.pci_bus_id): g.index for g in topo.gpus} if n_gpus and topo is not None else {}
        for rank, info in comm.ranks.items():
            # nvmlDev is the index NVML (and so the topology) uses; cudaDev is relative
            # to CUDA_VISIBLE_DEVICES, so it comes last.
            for source, gpu in (("nvmlDev", info.nvml_dev),
                                ("busId", by_bus.get(_bus_number(info.bus_id))),
                                ("cudaDev", info.cuda_dev)):
                if gpu is not None:
                    out[rank] = gpu
                    how.add(source)
                    break
        if out:
            return out, "NCCL " + "/".join(sorted(how))
    gpu_of_pid = getattr(state.gpu, "gpu_of_pid", None)
    if callable(gpu_of_pid):
        by_pid = gpu_of_pid()
        out = {r: by_pid[rs.hello.pid] for r, rs in state.ranks.items()
               if rs.hello is not None and rs.hello.pid in by_pid}
        if out:
            return out, "GPU processes (NVML)"
    out = {r: rs.hello.local_rank for r, rs in state.ranks.items()
           if rs.hello is not None and rs.hello.device.startswith("cuda")}
    return out, "local_rank (assumed GPU index)" if out else ""


def wiring_pairs(state: RunState) -> tuple[list[int], dict[tuple[int, int], Pair], str]:
    """Ranks, every off-diagonal pair, and how ranks were mapped to GPUs."""
    report = _report(state)
    ranks, labels = transport_matrix(report) if report is not None else ([], {})
    if not ranks:
        ranks = sorted(state.ranks)
    gpus, how = rank_gpus(state)
    topo = state.topology
    usable = topo is not None and getattr(topo, "available", False)
    # Across nodes the link is the network; NVML's matrix is node 0's (where ddptop runs),
    # so it says nothing about two ranks of another node.
    multi = state.nnodes > 1
    node = {r: state.node_of(r) for r in ranks} if multi else {}
    pairs = {}
    for a in ranks:
        for b in ranks:
            if a == b:
                continue
            hw = None
            ga, gb = gpus.get(a), gpus.get(b)
            on_node0 = not multi or node[a] == node[b] == 0
            if multi and None not in (node[a], node[b]) and node[a] != node[b]:
                hw = NETWORK
            elif on_node0 and usable and topo is not None and ga is not None and gb is not None and ga != gb \
                    and max(ga, gb) < len(topo.links):
                hw = topo.link(ga, gb)
                hw = None if hw in ("N/A", "X", "") else hw
            transport = labels.get((a, b))
            pairs[(a, b)] = Pair(a, b, transport, hw, verdict(transport, hw))
    return ranks, pairs, how


def _backend(state: RunState) -> str:
    for rs in state.ranks.values():
        if rs.hello is not None and rs.hello.backend:
            return rs.hello.backend
    return state.config.backend


def _grid(title: str, ranks: list[int], cell: Any, width: int) -> list[Text]:
    """A rank x rank grid; `cell(a, b)` -> Text; row sends to column."""
    lines = [Text(title, style="bold")]
    head = Text(" " * 5)
    for b in ranks:
        head.append(f"{'r' + str(b):<{width}}", style="dim")
    lines.append(head)
    for a in ranks:
        row = Text(f"{'r' + str(a):<5}", style="dim")
        for b in ranks:
            text = Text("X", style="dim") if a == b else cell(a, b)
            text.truncate(width - 1)
            text.pad_right(width - text.cell_len)
            row.append_text(text)
        lines.append(row)
    return lines


def _side_by_side(left: list[Text], right: list[Text], gap: int = 4) -> list[Text]:
    width = max(t.cell_len for t in left) + gap
    out = []
    for i in range(max(len(left), len(right))):
        line = left[i].copy() if i < len(left) else Text()
        line.pad_right(width - line.cell_len)
        if i < len(right):
            line.append_text(right[i])
        out.append(line)
    return out


def _wrapped(text: str, width: int, style: str = "", indent: str = "  ") -> list[Text]:
    """Prose as lines that fit: the view scrolls down, never sideways."""
    lead = len(text) - len(text.lstrip(" "))
    rows = textwrap.wrap(text.strip(), max(width, 20), initial_indent=text[:lead],
                         subsequent_indent=text[:lead] + indent, break_on_hyphens=False) or [""]
    return [Text(row, style=style) for row in rows]


def _styled(pair: Pair, text: str | None) -> Text:
    style = {"slower": SLOWER_STYLE, "pcie": PCIE_STYLE}.get(pair.verdict, "")
    return Text(text or ".", style=style if text else "dim")


def wiring_lines(state: RunState, width: int = 120) -> list[Text]:
    """Everything the Wiring view shows, as lines (pure; tests read them): first what to do
    (the advice's headline), then the transports against the links, NCCL's facts and the
    advice in full."""
    lines: list[Text] = heading_lines(state.advice, width)
    report = _report(state)
    has_nccl = report is not None and bool(report.transports)
    backend = _backend(state)
    topo = state.topology
    ranks, pairs, how = wiring_pairs(state)
    if not has_nccl:
        if backend and backend != "nccl":
            lines += _wrapped(f"no NCCL on this run ({backend}): transports unknown", width, "bold")
        else:
            lines += _wrapped("NCCL transports: none seen yet (they appear once NCCL sets up its "
                              "communicators and logs with NCCL_DEBUG=INFO)", width, "bold")
    if topo is None or not getattr(topo, "available", False):
        why = getattr(topo, "reason", "") or state.gpu_unavailable or "no NVML topology"
        lines += _wrapped(f"hardware links unknown: {why}", width, "dim")
    elif how:
        mapping = "  ".join(f"r{r}→GPU{g}" for r, g in sorted(rank_gpus(state)[0].items()))
        lines += wrap_text(Text.assemble(("rank → GPU ", "dim"), mapping, (f"  (from {how})", "dim")),
                           width, hang=11)
    if has_nccl or (topo is not None and getattr(topo, "available", False) and how):
        lines.append(Text())
        if len(ranks) <= MAX_MATRIX:
            lines += matrix_lines(ranks, pairs, width)
        flagged = [p for p in pairs.values() if p.verdict]
        slower = [p for p in flagged if p.verdict == "slower"]
        if flagged:
            lines.append(Text())
            head = (f"{len(slower)} pair(s) slower than the hardware allows" if slower
                    else f"{len(flagged)} pair(s) over PCIe / host memory")
            lines.append(Text(head, style=WARN_STYLE if slower else PCIE_STYLE))
            for p in sorted(flagged, key=lambda p: (p.verdict != "slower", p.src, p.dst))[:12]:
                lines.extend(_wrapped(f"  r{p.src} → r{p.dst}  {p.why}", width))
            if len(flagged) > 12:
                lines.append(Text(f"  … and {len(flagged) - 12} more", style="dim"))
    if report is not None and report.nccl_lines:
        lines.append(Text())
        lines.append(Text("NCCL", style="bold"))
        for line in render_facts(report).splitlines():
            lines.extend(_wrapped("  " + line, width))
    lines.append(Text())
    lines.extend(advice_lines(state.advice, width))
    return lines


def matrix_lines(ranks: list[int], pairs: dict[tuple[int, int], Pair], width: int) -> list[Text]:
    """NCCL's choice and the hardware link as two rank x rank grids (side by side where they
    fit), and their legend."""
    cw = max([len(p.transport or "") for p in pairs.values()] + [4]) + 2
    hw_w = max([len(p.hw or "") for p in pairs.values()] + [4]) + 2
    left = _grid("NCCL chose (row sends to column)", ranks,
                 lambda a, b: _styled(pairs[(a, b)], pairs[(a, b)].transport), cw)
    right = _grid("hardware link (NVML)", ranks,
                  lambda a, b: _styled(pairs[(a, b)], pairs[(a, b)].hw) if pairs[(a, b)].hw
                  else Text("?", style="dim"), hw_w)
    wide_l, wide_r = max(t.cell_len for t in left), max(t.cell_len for t in right)
    if wide_l + 4 + wide_r <= width:
        lines = _side_by_side(left, right)
    elif max(wide_l, wide_r) <= width:
        lines = [*left, Text(), *right]
    else:  # a row cut at the edge would read as a missing pair: say why there is none
        lines = _wrapped(f"(the {len(ranks)}x{len(ranks)} matrices need {max(wide_l, wide_r)} "
                         "columns: the flagged pairs are listed below)", width, "dim")
    return lines + wrap_text(Text.assemble(("■", SLOWER_STYLE), " slower than the hardware allows   ",
                                           ("■", PCIE_STYLE), " PCIe / host memory   ",
                                           (". no direct connection", "dim")), width, hang=0)


def _style(advice: Any) -> str:
    return WARN_STYLE if getattr(advice, "severity", "info") == "warn" else "bold"


def heading_lines(advice: Any, width: int = 120) -> list[Text]:
    """The view's heading: what to do and how sure (`use preset overlap [expected, not
    measured yet (low confidence)]`), then a blank line; nothing before the first advice."""
    if advice is None:
        return []
    return [*_wrapped("advice: " + advice.headline, width, _style(advice), indent="        "), Text()]


def advice_lines(advice: Any, width: int = 120) -> list[Text]:
    if advice is None:
        return [Text("advice: none yet (the advisor looks every few seconds once steps arrive)",
                     style="dim")]
    style = _style(advice)
    warn = style == WARN_STYLE
    lines = _wrapped("advice: " + advice.headline, width, style, indent="        ")
    if advice.changes:
        lines.extend(_wrapped("  changes: " + ", ".join(f"{k}={v}" for k, v in advice.changes.items()),
                              width))
    if advice.reason:
        lines.extend(_wrapped("  why: " + advice.reason, width, WARN_STYLE if warn else "",
                              indent="     "))
    for e in advice.evidence:
        lines.extend(_wrapped("  · " + e, width, "dim"))
    if advice.lossy:
        lines.extend(_wrapped("  caveat: " + LOSSY_CAVEAT, width, PCIE_STYLE))
    return lines


class WiringPanel(Vertical):
    """Call `show(snapshot)` to refresh; rebuilds only when its inputs changed."""

    def __init__(self, **kwargs) -> None:  # noqa: ANN003 - Widget's options
        super().__init__(**kwargs)
        self._key: tuple[Any, ...] | None = None

    def compose(self) -> ComposeResult:
        yield LinesView(cursor=False, id="wiring-lines")

    @property
    def body(self) -> LinesView:
        return self.query_one("#wiring-lines", LinesView)

    def text(self) -> str:
        return "\n".join(t.plain for t in self.body.lines)

    def show(self, snap: Snapshot) -> None:
        state = snap.state
        width = (self.body.content_region.width or 120) - 1  # 1: the scrollbar
        # Identity of what it is drawn from: a new report/topology/advice is a new object.
        key = (state.run_id, id(state.nccl), id(state.topology), id(state.advice),
               id(state.gpu) if state.nccl is None else 0, _backend(state), width)
        if key != self._key:
            self._key = key
            self.body.set_lines(wiring_lines(state, width))
