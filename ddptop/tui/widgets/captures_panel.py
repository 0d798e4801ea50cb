"""CapturesPanel: every profiler capture window of the run (`c` asks for one): id, steps,
profiler, status, the files each rank wrote and the per-rank summary (GPU window, busy/idle
with the per-stream host/kernel wait split, compute/comm/memory and their overlap, steps,
top kernels with count/mean/std), how to open the traces; after an nsys run, what nsys produced.

Reads `state.captures` (ddptop.analysis.capture.Capture) and `state.nsys` by attribute/key."""

from __future__ import annotations

from typing import Any

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical

from ddptop.analysis.cross_rank import describe
from ddptop.analysis.hook_work import describe_hook
from ddptop.model.capture import perturbation_line
from ddptop.model.report import NA, fmt
from ddptop.model.state import RunState
from ddptop.tui.live import Snapshot
from ddptop.tui.render import truncate, wrap_text
from ddptop.tui.screens.capture_diff import CaptureDiffScreen, session_captures
from ddptop.tui.widgets.lines_view import LinesView

CAPTURE_STYLES = {
    "scheduled": "italic",
    "recording": "bold #c79100",
    "processing": "bold #5f87d7",
    "done": "bold #3a9e5f",
    "failed": "bold #d7503c",
}
HINT = "press c to profile the next 3 steps on every rank (torch.profiler, or nsys with --profiler nsys)"


def _steps_text(steps: list[int]) -> str:
    if not steps:
        return "no steps"
    consecutive = steps == list(range(steps[0], steps[0] + len(steps)))
    span = f"{steps[0]}-{steps[-1]}" if consecutive and len(steps) > 1 else ",".join(map(str, steps))
    return f"steps {span} ({len(steps)})"


def rank_summary_text(rank: Any, s: dict[str, Any]) -> Text:
    """One rank's line of a capture summary."""
    line = Text(f"    r{rank}  ", style="bold")
    if "error" in s:
        return line.append(s["error"], style="#d7503c")
    if "note" in s:
        return line.append(s["note"], style="dim")
    line.append_text(Text.assemble(
        ("comm ", "dim"), f"{fmt(s.get('comm_ms'), '.1f')} ms",
        ("  (ddptop timer ", "dim") if "timer_comm_ms" in s else "",
        f"{fmt(s.get('timer_comm_ms'), '.1f')} ms)" if "timer_comm_ms" in s else "",
        ("  overlap ", "dim"), f"{fmt(s.get('overlap_ms'), '.1f')} ms" if s.get("overlap_ms") is not None
        else NA,
        ("  ", ""), _steps_text(list(s.get("steps") or [])),
    ))
    step_ms = s.get("step_ms") or []
    if step_ms:
        line.append("  step ms ", style="dim")
        line.append(" ".join(f"{v:.1f}" for v in step_ms))
    top = s.get("top") or []
    if top:
        line.append("  top ", style="dim")
        line.append(f"{truncate(top[0]['name'], 48)} {top[0]['ms']:.1f} ms")
    return line


def _ms_pct(s: dict[str, Any], key: str, label: str) -> Text:
    ms, pct = s.get(f"{key}_ms"), s.get(f"{key}_pct")
    if ms is None:
        return Text()
    return Text.assemble((f"  {label} ", "dim"), f"{ms:.1f}", (f" ({fmt(pct, '.0f')}%)", "dim"))


def rank_detail_lines(s: dict[str, Any], kernels: int = 3) -> list[Text]:
    """Under a rank's line: the GPU window and what filled it, each stream's idle split
    (HTA's host wait / kernel wait / other), the top kernels with their statistics."""
    if s.get("window_ms") is None:
        return []
    where = "GPU window" if s.get("source") == "gpu" else "CPU window"
    line = Text.assemble(("      " + where + " ", "dim"), f"{s['window_ms']:.1f} ms", ("  busy ", "dim"),
                         f"{fmt(s.get('busy_ms'), '.1f')}")
    for key, label in (("idle", "idle"), ("compute", "compute"), ("comm", "comm"), ("memory", "memory")):
        line.append_text(_ms_pct(s, key, label))
    if s.get("overlap_ms") is not None:
        line.append("  comm∩compute ", style="dim")
        line.append(f"{s['overlap_ms']:.1f}")
    if s.get("comm_memory_overlap_ms"):
        line.append("  comm∩memory ", style="dim")
        line.append(f"{s['comm_memory_overlap_ms']:.1f}")
    if s.get("comm_call_ms") is not None:
        line.append("  comm call→end ", style="dim")
        line.append(f"{s['comm_call_ms']:.1f}")
        if "timer_vs_call" in s:
            line.append(f" (timer/that {s['timer_vs_call']:.2f})", style="dim")
    lines = [line]
    bound = s.get("bound") or {}
    if bound.get("verdict"):
        kind, _, rest = bound["verdict"].partition(": ")
        lines.append(Text.assemble(("      ", ""), (kind, "bold"), (": " + rest, "dim") if rest else ""))
    hook = describe_hook(s)
    if hook:
        lines.append(Text("      " + hook, style="dim"))
    streams = s.get("streams") or []
    if streams:
        waits = Text.assemble(("      idle per stream ", "dim"))
        for i, st in enumerate(streams[:4]):
            waits.append(("  " if i else "") + f"s{st['stream']} ")
            waits.append(f"host {st['host_wait_ms']:.1f} kernel {st['kernel_wait_ms']:.1f} "
                         f"other {st['other_wait_ms']:.1f}")
        if len(streams) > 4:
            waits.append(f"  (+{len(streams) - 4} streams)", style="dim")
        lines.append(waits)
    for k in (s.get("top") or [])[:kernels]:
        if "count" not in k:
            break
        lines.append(Text.assemble(
            ("      ", ""), (f"{k['kind']:<7} ", "dim"), f"{k['ms']:8.1f} ms ", (f"x{k['count']:<5} ", "dim"),
            (f"mean {k['mean_ms']:.3f} ± {k['std_ms']:.3f} ({k['min_ms']:.3f}-{k['max_ms']:.3f})  ", "dim"),
            truncate(k["name"], 70),
        ))
    return lines


def cross_rank_lines(view: dict[str, Any] | None) -> list[Text]:
    """Who waits for whom (ddptop.analysis.cross_rank.describe), the verdict in bold."""
    if not view:
        return []
    first, *rest = describe(view)
    label, _, verdict = first.partition(": ")
    late = view.get("late_rank") is not None
    out = [Text.assemble(("    " + label + " ", "dim"), (verdict, "bold #c79100" if late else ""))]
    return out + [Text("    " + line, style="dim" if "nearly empty" not in line else "#d7503c") for line in rest]


def capture_lines(cap: Any) -> list[Text]:
    status = cap.status
    head = Text.assemble(
        (f"#{cap.capture_id}", "bold"), "  steps ", (cap.steps, "bold"), "  ", cap.profiler, "  ",
        (status, CAPTURE_STYLES.get(status, "")),
    )
    waiting = [r for r, st in sorted(cap.ranks.items()) if st != "written"]
    if status in ("scheduled", "recording") and cap.ranks:
        head.append(f"  ({len(cap.ranks) - len(waiting)}/{len(cap.ranks)} ranks written)", style="dim")
    lines = [head, Text.assemble(("    dir ", "dim"), cap.out_dir)]
    if cap.error:
        lines.append(Text("    " + cap.error, style="#d7503c"))
    for rank, paths in sorted(cap.files.items()):
        for i, path in enumerate(paths):
            lines.append(Text.assemble(("    files " if i == 0 else "          ", "dim"),
                                       f"r{rank} ", path))
    summary = cap.summary or {}
    per_rank = summary.get("ranks") or {}
    if per_rank:
        mean = summary.get("comm_ms_mean")
        lines.append(Text.assemble(("    summary", "dim"),
                                   f"  comm {fmt(mean, '.1f')} ms/rank" if mean is not None else ""))
        said = perturbation_line(summary.get("perturbation"))
        if said:
            lines.append(Text.assemble(("    profiler ", "dim"), said,
                                       (f"; warmed up {cap.warmup} step(s) before recording", "dim")
                                       if cap.warmup else ""))
        lines.extend(cross_rank_lines(summary.get("cross_rank")))
        for r, s in sorted(per_rank.items(), key=lambda kv: int(kv[0])):
            lines.append(rank_summary_text(r, s))
            if s.get("dropped_note"):
                lines.append(Text("      " + s["dropped_note"], style="#c79100"))
            lines.extend(rank_detail_lines(s))
        if summary.get("open_with"):
            lines.append(Text.assemble(("    open ", "dim"), "https://ui.perfetto.dev (drop a .json.gz in) or ",
                                       (f"ddptop trace {cap.out_dir}", "bold")))
    return lines


def captures_lines(state: RunState) -> list[Text]:
    """Everything the Captures view shows (pure; tests read it)."""
    lines = [Text(HINT, style="dim"), Text()]
    if not state.captures:
        lines.append(Text("no captures yet in this run"))
    for cap in sorted(state.captures.values(), key=lambda c: c.capture_id):
        lines.extend(capture_lines(cap))
        lines.append(Text())
    nsys = state.nsys
    if nsys:
        lines.append(Text("nsys", style="bold"))
        if nsys.get("note"):
            lines.append(Text("  " + nsys["note"], style="#c79100"))
        lines.extend(Text("  file " + f) for f in nsys.get("files", []))
        lines.extend(Text(f"  stats {name}: {path}") for name, path in nsys.get("stats", {}).items())
    return lines


class CapturesPanel(Vertical):
    """Call `show(snapshot)` to refresh. Lines wider than the view wrap (paths after a
    `/`), so a trace file's name is never cut off at the edge."""

    # not in the footer yet (the tab's snapshots): D picks two captures and shows their diff
    BINDINGS = [Binding("D", "diff_captures", "Diff two captures", show=False)]

    def __init__(self, **kwargs) -> None:  # noqa: ANN003 - Widget's options
        super().__init__(**kwargs)
        self._logical: list[Text] = []
        self._width = 0

    def compose(self) -> ComposeResult:
        yield LinesView(cursor=False, id="captures-lines")

    def action_diff_captures(self) -> None:
        self.app.push_screen(CaptureDiffScreen(session_captures(self.app)))

    @property
    def body(self) -> LinesView:
        return self.query_one("#captures-lines", LinesView)

    def text(self) -> str:
        """What the view says, one line per line before wrapping (tests read it)."""
        return "\n".join(t.plain for t in self._logical)

    def show(self, snap: Snapshot) -> None:
        # A handful of captures at most: rebuilding is cheaper than tracking changes,
        # and LinesView repaints only the lines that differ.
        lines = captures_lines(snap.state)
        width = (self.body.content_region.width or 120) - 1  # 1: the scrollbar
        if lines == self._logical and width == self._width:
            return
        self._logical, self._width = lines, width
        self.body.set_lines([row for line in lines for row in wrap_text(line, width)])
