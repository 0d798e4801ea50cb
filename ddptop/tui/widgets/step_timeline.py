"""StepTimelineView: the selected rank's last step as a time bar (data, forward, backward,
the wait for the last all-reduce, optimizer) with the all-reduce drawn under it (each
bucket, in alternating shades, where the rank sent its spans), so the share of
communication that backward hides is seen, not read."""

from __future__ import annotations

import itertools

from rich.text import Text
from textual.widgets import Static

from ddptop.model.report import fmt
from ddptop.model.timeline import StepTimeline, step_timeline
from ddptop.tui.live import Snapshot
from ddptop.tui.render import PHASE_COLORS

LANE_STYLE = {**PHASE_COLORS, "exposed": PHASE_COLORS["comm"], "other": "#6c6c6c"}
LANE_CHAR = {"exposed": "▒", "other": "·"}
BUCKET_STYLES = (PHASE_COLORS["comm"], "#5f87d7")  # neighbouring buckets told apart
LABEL_W = 11  # 'all-reduce' and a space
TIMELINE_ROWS = 6  # on the ranks tab: its four lines in a border (app.tcss #overview-timeline)
TIMELINE_MIN_HEIGHT = 34  # terminal rows from which the ranks tab shows it (not at 80x24)


def timeline_lines(timeline: StepTimeline | None, width: int) -> list[Text]:
    """The header line, the step's lane, the all-reduce lane and a scale, `width` columns
    of bar after a label column."""
    if timeline is None:
        return [Text("no step recorded yet", style="dim italic")]
    bar_w = max(10, width - LABEL_W)
    # labels as dim spans, not as the line's base style (which would dim the bars too)
    lane = Text.assemble(("step".ljust(LABEL_W), "dim"))
    cells: list[tuple[str, str]] = [(" ", "")] * bar_w
    for span in timeline.lane:
        a, b = timeline.columns(span, bar_w)
        cells[a:b] = [(LANE_CHAR.get(span.what, "█"), LANE_STYLE[span.what])] * (b - a)
    lane.append_text(_runs(cells))
    comm = Text.assemble((("buckets" if timeline.buckets else "all-reduce").ljust(LABEL_W), "dim"))
    if timeline.buckets:
        comm.append_text(_bucket_cells(timeline, bar_w))
    elif timeline.comm is None:
        comm.append("only the wait (▒) is known: not timed in the recent steps (a GPU times one step in comm_timing_every; none without nccl_timing, or on a CPU without gloo_timing)", style="dim")
    else:
        a, b = timeline.columns(timeline.comm, bar_w)
        comm.append(" " * a)
        comm.append("▀" * (b - a), style=PHASE_COLORS["comm"])
    scale = Text(" " * LABEL_W + "0 ms", style="dim")
    end = f"{timeline.step_ms:.1f} ms"
    scale.append(end.rjust(bar_w - 4), style="dim")
    return [_header(timeline), lane, comm, scale]


def _bucket_cells(timeline: StepTimeline, bar_w: int) -> Text:
    cells: list[tuple[str, str]] = [(" ", "")] * bar_w
    for i, span in enumerate(timeline.buckets):
        a, b = timeline.columns(span, bar_w)
        cells[a:b] = [("▀", BUCKET_STYLES[i % 2])] * (b - a)
    return _runs(cells)


def _runs(cells: list[tuple[str, str]]) -> Text:
    """One Text of the cells, a span per run of one style (a Text per cell cost ~5 ms a
    frame at 200 columns)."""
    text = Text()
    for style, run in itertools.groupby(cells, key=lambda c: c[1]):
        text.append("".join(ch for ch, _ in run), style=style or None)
    return text


def _header(timeline: StepTimeline) -> Text:
    # steps counted from 1, as the rank table and header count them
    head = Text.assemble(("step ", "dim"), (str(timeline.step + 1), "bold"), "  ",
                         (f"{timeline.step_ms:.1f} ms", "bold"))
    wait, in_flight = timeline.wait_ms, timeline.in_flight_ms
    if in_flight > 0:
        hidden, exposed = timeline.hidden_ms or 0.0, timeline.exposed_ms
        n = len(timeline.buckets)
        buckets = f" in {n} bucket{'s' if n != 1 else ''}" if n else ""
        head.append(f"   all-reduce {in_flight:.1f} ms{buckets}: {hidden:.1f} hidden under backward "
                    f"({hidden / in_flight:.0%}), {exposed:.1f} exposed")
        if abs(wait - exposed) >= 0.05:  # the ▒ lane: the wait, a different figure, named apart
            head.append(f"; backward's wait after compute {wait:.1f} ms (▒)")
    elif wait:
        head.append(f"   waited {fmt(wait)} ms for the all-reduce after backward")
    return head


class StepTimelineView(Static):
    """Call `show(record, spans)` with a rank's step record and its buckets' spans."""

    def show(self, record: dict[str, float] | None, spans: tuple[tuple[float, float], ...] = ()) -> None:
        width = self.content_region.width or 80
        self.update(Text("\n").join(timeline_lines(step_timeline(record, spans) if record else None, width)))


def show_cursor_rank(view: StepTimelineView, snap: Snapshot, rank: int | None, tall: bool,
                     role: str = "cursor", cursor: int | None = None) -> None:
    """A ranks tab's timeline: `rank` (the cursor row's; the straggler, else the rank with the
    most own work, before the cursor is on one), shown only in a terminal of
    TIMELINE_MIN_HEIGHT rows or more. `role` "fastest": the rank with the least own work
    (the most, where that is the `cursor`'s rank: two panels never show one step twice);
    "node": the cursor is on a node's row (its straggler, else its first rank)."""
    if not tall:
        return
    ranks = snap.state.ranks
    fallback = snap.slowest if snap.slowest in ranks else snap.heaviest
    rank = rank if rank in ranks else fallback if fallback in ranks else min(ranks, default=None)
    rs = ranks.get(rank) if rank is not None else None
    if role == "fastest" and rank is not None and rank == cursor and snap.heaviest not in (None, rank):
        # the cursor is on the fastest rank: beside it, the one with the most own work, not
        # the same step twice (issue 46)
        rank = snap.heaviest
        rs = ranks.get(rank) if rank is not None else None
        title = f"rank {rank}: most own work (last 50), its last step" if rs else "slowest rank"
    elif role == "fastest":
        title = f"rank {rank}: least own work (last 50), its last step" if rs else "fastest rank"
    elif role == "node":  # the cursor on a node's row: Enter opens the node, not the rank
        title = f"rank {rank} of the cursor's node (⏎ opens the node)" if rs else "step timeline"
    else:
        title = f"rank {rank}: the cursor's row, its last step (⏎ opens it)" if rs else "step timeline"
    if view.border_title != title:
        view.border_title = title
    view.show(*rs.timeline_record()) if rs is not None else view.show(None)
