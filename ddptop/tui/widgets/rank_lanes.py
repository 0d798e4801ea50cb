"""RankLanes: every rank's last step as a time bar on one shared scale, one row a rank (the
ranks tab in a tall terminal): where a straggler's extra time goes, and how long the others
wait for it, seen side by side."""

from __future__ import annotations

import itertools

from rich.text import Text

from ddptop.model.report import fmt
from ddptop.model.timeline import StepTimeline, step_timeline
from ddptop.tui.live import Snapshot
from ddptop.tui.render import SLOW_STYLE
from ddptop.tui.widgets.lines_view import LinesView
from ddptop.tui.widgets.step_timeline import LANE_CHAR, LANE_STYLE

LABEL_W = 5  # "▲r12 "
VALUE_W = 10  # " 113.1 ms"


def lane_cells(timeline: StepTimeline, width: int, scale_ms: float) -> Text:
    """The step's lane in `width` cells, `scale_ms` wide (the longest step of all ranks)."""
    cells: list[tuple[str, str]] = [(" ", "")] * width
    for span in timeline.lane:
        a = min(width, int(span.start_ms / scale_ms * width))
        b = min(width, max(a + 1, int(round(span.end_ms / scale_ms * width))))
        cells[a:b] = [(LANE_CHAR.get(span.what, "█"), LANE_STYLE[span.what])] * (b - a)
    text = Text()
    for style, run in itertools.groupby(cells, key=lambda c: c[1]):
        text.append("".join(ch for ch, _ in run), style=style or None)
    return text


class RankLanes(LinesView):
    """Call `show(snapshot)` to refresh."""

    def on_mount(self) -> None:
        self.border_title = "each rank's last step on one time scale (▒ exposed comm)"

    def show(self, snap: Snapshot) -> None:
        lines = {}
        for r, rs in sorted(snap.state.ranks.items()):
            record, spans = rs.timeline_record()
            timeline = step_timeline(record, spans) if record else None
            if timeline is not None and timeline.step_ms > 0:
                lines[r] = timeline
        if not lines:
            self.set_lines([Text("no steps yet", style="dim")])
            return
        # as tall as its ranks (and its border), no taller: 2 ranks at 200x60 left 22 empty
        # rows in it (issue 46); the tab's rows left below it stay blank
        rows = len(lines) + 2
        if self.styles.max_height is None or self.styles.max_height.value != rows:
            self.styles.max_height = rows
        scale = max(t.step_ms for t in lines.values())
        width = max(self.content_region.width - LABEL_W - VALUE_W - 1, 10)
        ranks = list(lines)

        def line(i: int) -> Text:
            r = ranks[i]
            slow = r == snap.slowest
            text = Text(f"{('▲' if slow else ' ') + 'r' + str(r):<{LABEL_W}}", style=SLOW_STYLE if slow else "dim",
                        no_wrap=True)
            text.append_text(lane_cells(lines[r], width, scale))
            text.append(f" {fmt(lines[r].step_ms, '.1f'):>6} ms")
            return text

        self.set_lines(self.lines_in_view(len(ranks), line))
