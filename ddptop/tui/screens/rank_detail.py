"""RankDetailScreen: Enter on a rank opens everything known about it: its last step as a time
bar, step-time history and phase split, communication, memory (the allocator's figures from
the rank side, NVML per process, resident set) with a creep alert, its process, its NCCL
peers and transports, and its last log lines. Refreshes from the app's latest Snapshot."""

from __future__ import annotations

from collections.abc import Callable

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import Screen
from textual.widgets import Footer, Static

from ddptop.model import memory
from ddptop.model.figures import (
    RECENT_LABEL,
    comm_window,
    eval_ms_per_step_recent,
    host_gap_ms_recent,
)
from ddptop.model.report import NA, fmt
from ddptop.model.snapshot import Snapshot
from ddptop.model.state import RunState
from ddptop.tui.live import rank_location
from ddptop.tui.render import STATUS_STYLES, fmt_bytes, legend, phase_bar, spark
from ddptop.tui.widgets.step_timeline import StepTimelineView
from ddptop.tui.widgets.wiring_panel import wiring_pairs

LOG_LINES = 8
REFRESH_S = 0.5


def _section(title: str) -> Text:
    return Text(title, style="bold underline")


def summary_lines(snap: Snapshot, rank: int, width: int) -> list[Text]:
    """Step times, phases and communication of one rank's recent window."""
    f = snap.ranks.get(rank)
    if f is None:
        return [Text("no steps from this rank yet", style="dim italic")]
    hist = Text.assemble(("step ms  ", "dim"), (spark(list(f.step_ms), max(10, width - 60)), "#5f87d7"),
                         f"  p50 {fmt(f.p50)}  p95 {fmt(f.p95)}  own work {fmt(f.own_ms)}", (f"  ({RECENT_LABEL})", "dim"))
    key = legend(snap.phase_names)
    bar = Text.assemble(("phases   ", "dim")).append_text(phase_bar(f.phases, max(10, width - 13 - key.cell_len)))
    bar.append("  ").append_text(key)
    comm = Text.assemble(("comm     ", "dim"))
    if f.comm_share is None and f.exposed_share is None:
        comm.append("not measured on this run", style="dim")
    else:
        comm.append(f"in flight {fmt(None if f.comm_share is None else 100 * f.comm_share, '.0f')}% of the step"
                    f"  exposed {fmt(None if f.exposed_share is None else 100 * f.exposed_share, '.0f')}%")
        comm.append(f"  ({comm_window({rank: f})})", style="dim")
    return [hist, bar, *gap_line(snap, rank), *eval_line(snap, rank), comm]


def gap_line(snap: Snapshot, rank: int) -> list[Text]:
    """The host's time between the forward's return and backward, inside the forward phase
    (where the straggler rule finds a loader called there); nothing under a millisecond."""
    ms = host_gap_ms_recent(snap.state.ranks[rank])
    if ms is None:
        return []
    return [Text.assemble(("after fwd ", "dim"), f"the host spends {ms:.1f} ms a step between forward's return and "
                          "backward", ("  (median; inside fwd above: a loader or a sync there)", "dim"))]


def eval_line(snap: Snapshot, rank: int) -> list[Text]:
    """Forwards without grad (validation, generation) in the recent window: outside the
    phases above; nothing when the script ran none."""
    ms = eval_ms_per_step_recent(snap.state.ranks[rank])
    if ms is None:
        return []
    return [Text.assemble(("no-grad  ", "dim"), f"validation/no-grad forwards {ms:.1f} ms a step",
                          ("  (mean, not in the phases)", "dim"))]


def memory_lines(snap: Snapshot, rank: int) -> list[Text]:
    """The allocator's figures and resident set the rank reports, NVML's per-process reading
    for its pid, and a creep alert when memory keeps rising."""
    rs = snap.state.ranks[rank]
    mem = memory.latest(rs.recent)
    lines = []
    if any(k in mem for k in ("mem_allocated_mb", "mem_reserved_mb")):
        lines.append(Text.assemble(("allocator ", "dim"), f"allocated {fmt(mem.get('mem_allocated_mb'), '.0f')} MiB"
                                   f"  reserved {fmt(mem.get('mem_reserved_mb'), '.0f')} MiB"
                                   f"  peak {fmt(mem.get('mem_peak_mb'), '.0f')} MiB"))
    else:
        lines.append(Text("allocator  no CUDA allocator figures (a CPU run, or the rank has not reported yet)",
                          style="dim"))
    pid = rs.hello.pid if rs.hello is not None else None
    gpu = snap.state.gpu
    used = next((p.used_mem for g in getattr(gpu, "gpus", ()) for p in g.processes if p.pid == pid), None)
    proc = snap.state.proc_stats.get(pid) if pid is not None else None
    rss = mem.get("rss_mb")
    lines.append(Text.assemble(
        ("process   ", "dim"), f"pid {pid if pid is not None else NA}",
        f"  GPU memory (NVML) {fmt_bytes(used) if used is not None else NA}",
        f"  resident {fmt(rss, '.0f') + ' MiB' if rss is not None else fmt_bytes(proc[1]) if proc else NA}",
        f"  CPU {fmt(proc[0], '.0f') + '%' if proc else NA}"))
    lines += child_lines(snap.state, pid)
    found = memory.creep(list(rs.recent))
    if found is not None:
        lines.append(Text("▲ " + found.describe(), style="bold #d7503c"))
    return lines


def child_lines(state: RunState, pid: int | None, most: int = 6) -> list[Text]:
    """The rank's children (DataLoader workers, the script's subprocesses): CPU% and RSS."""
    kids = state.proc_children.get(pid, []) if pid is not None else []
    if not kids:
        return []
    stats = [(k, state.proc_stats[k]) for k in kids if k in state.proc_stats]
    total_cpu, total_rss = sum(c for _, (c, _) in stats), sum(r for _, (_, r) in stats)
    out = [Text.assemble(("children  ", "dim"), f"{len(kids)} (DataLoader workers, subprocesses): "
                         f"CPU {total_cpu:.0f}%  resident {fmt_bytes(total_rss)}")]
    for k, (cpu, rss) in stats[:most]:
        out.append(Text(f"          pid {k}  CPU {cpu:.0f}%  resident {fmt_bytes(rss)}", style="dim"))
    if len(stats) > most:
        out.append(Text(f"          +{len(stats) - most} more", style="dim"))
    return out


def nccl_lines(snap: Snapshot, rank: int) -> list[Text]:
    ranks, pairs, _ = wiring_pairs(snap.state)
    mine = [p for (a, b), p in sorted(pairs.items()) if rank in (a, b) and p.transport]
    if not mine:
        return [Text("no NCCL transports seen for this rank (gloo, or NCCL has not connected)", style="dim")]
    return [Text.assemble(f"{p.src} → {p.dst}  ", (p.transport or "?", "bold"),
                          f"  hardware {p.hw or NA}", (f"  {p.verdict}" if p.verdict else "", "#c79100"))
            for p in mine[:12]]


def title_line(snap: Snapshot, rank: int) -> Text:
    """What the screen is: the rank, where it runs, its status (the table's), its step."""
    rs = snap.state.ranks[rank]
    status = "straggler" if snap.straggler is not None and snap.straggler.rank == rank else snap.status.get(rank, rs.status)
    return Text.assemble(("Rank detail: ", "bold"), ("▲ " if rank == snap.slowest else "", "bold #d7503c"),
                         (f"rank {rank}", "bold"), "  ", rank_location(rs), "  ",
                         (status, STATUS_STYLES.get(status, "")), "  ",
                         ("step ", "dim"), str(rs.steps_run() or NA),
                         ("   esc back · [ ] previous/next rank", "dim"))


def detail_lines(snap: Snapshot, rank: int, width: int) -> list[Text]:
    """Everything below the timeline, section by section."""
    lines = [_section(f"steps ({RECENT_LABEL})"), *summary_lines(snap, rank, width), Text()]
    lines += [_section("memory"), *memory_lines(snap, rank), Text()]
    lines += [_section("NCCL peers"), *nccl_lines(snap, rank), Text()]
    lines.append(_section("last log lines"))
    logs = list(snap.state.logs.get(rank, ()))[-LOG_LINES:]
    lines += [Text(line[: width - 2], style="dim") for line in logs] or [Text("(none yet)", style="dim")]
    return lines


class RankDetailScreen(Screen[None]):
    """One rank, live. `[` and `]` move to the previous/next rank; escape goes back."""

    BINDINGS = [
        Binding("escape", "app.pop_screen", "Back"),
        Binding("q", "app.pop_screen", "Back", show=False),
        Binding("left_square_bracket", "move(-1)", "Previous rank"),
        Binding("right_square_bracket", "move(1)", "Next rank"),
    ]

    def __init__(self, rank: int, latest: Callable[[], Snapshot | None]) -> None:
        super().__init__()
        self.rank = rank
        self._latest = latest

    def compose(self) -> ComposeResult:
        yield Static(id="detail-title")
        yield StepTimelineView(id="detail-timeline")
        with VerticalScroll():
            yield Static(id="detail-body")
        yield Footer(show_command_palette=False)

    def on_mount(self) -> None:
        self.set_interval(REFRESH_S, self.refresh_detail)
        self.refresh_detail()

    def action_move(self, delta: int) -> None:
        snap = self._latest()
        if snap is not None and snap.state.ranks:
            ranks = sorted(snap.state.ranks)
            self.rank = ranks[(ranks.index(self.rank) + delta) % len(ranks)] if self.rank in ranks else ranks[0]
            self.refresh_detail()

    def refresh_detail(self) -> None:
        snap = self._latest()
        if snap is None or self.rank not in snap.state.ranks:
            return
        rs = snap.state.ranks[self.rank]
        self.query_one("#detail-title", Static).update(title_line(snap, self.rank))
        self.query_one(StepTimelineView).show(*rs.timeline_record())
        width = self.size.width or 100
        self.query_one("#detail-body", Static).update(Text("\n").join(detail_lines(snap, self.rank, width)))
