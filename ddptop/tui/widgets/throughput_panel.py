"""ThroughputPanel: steps/s over the run (sparkline) and each rank's recent step
times on one shared scale, so a slow or jittery rank stands out."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from rich.style import Style
from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical
from textual.widgets import Sparkline, Static

from ddptop.model.figures import RECENT_LABEL, RUN_LABEL
from ddptop.model.report import fmt, fmt_step_rate
from ddptop.tui.live import Snapshot
from ddptop.tui.render import SLOW_STYLE, chart_rows, spark
from ddptop.tui.widgets.lines_view import LinesView

EMPTY_TITLE = "steps/s: waiting for steps"


class RateChart(Sparkline):
    """Textual's Sparkline drawn as plain block rows in one colour: its own rendering styles
    every cell apart, which as tall as the box at 200x60 doubled the ranks tab's CPU a refresh
    (17 -> 41 ms, bench_ui with 2 ranks); these rows cost what the 6-row chart did."""

    def render(self) -> Text:
        data = [float(v) for v in self.data or []]
        width, height = self.size.width, self.size.height
        if not data or width <= 0 or height <= 0:
            return Text("")
        if len(data) > width:  # each column the highest of its share of the points, as Sparkline does
            step = len(data) / width
            data = [max(data[int(i * step):max(int((i + 1) * step), int(i * step) + 1)]) for i in range(width)]
        color = self.get_component_styles("sparkline--min-color").color.rich_color
        return Text("\n".join(chart_rows(data, width, height, min(data), max(data))), style=Style(color=color),
                    no_wrap=True)


class ThroughputPanel(Horizontal):
    """Call `show(snapshot)` to refresh."""

    def compose(self) -> ComposeResult:
        with Vertical(id="rate-box"):
            yield RateChart([], id="rate-spark")
            yield Static("", id="rate-facts")
        yield LinesView(cursor=False, id="step-times")

    def on_mount(self) -> None:
        self.query_one("#rate-box").border_title = EMPTY_TITLE
        self.query_one("#step-times").border_title = f"step ms per rank · p50 {RECENT_LABEL}"

    def show(self, snap: Snapshot) -> None:
        state = snap.state
        rates = [rate for _, rate in state.history]
        box = self.query_one("#rate-box")
        spark_widget = self.query_one("#rate-spark", Sparkline)
        if rates or snap.recent_steps_per_s is not None:
            # The rates ride in the box's title: at 80x24 the box has three rows inside,
            # which the sparkline and the whole-run line need (issue 21: they were clipped).
            # "now" is the header's figure (the last 50 steps' pace), the range the chart's.
            current = snap.recent_steps_per_s if snap.recent_steps_per_s is not None else rates[-1]
            now, lo, hi = (fmt_step_rate(current), fmt_step_rate(min([*rates, current])),
                           fmt_step_rate(max([*rates, current])))
            title = f"steps/s {RECENT_LABEL} {now}, over the {RUN_LABEL} min {lo}  max {hi}"
            if len(title) > box.outer_size.width - 6:
                title = f"steps/s {RECENT_LABEL} {now} ({lo}-{hi})"
            if box.border_title != title:  # no markup in it: kept as given
                box.border_title = title
            width = max(spark_widget.content_region.width, 10)
            # The sparkline buckets its data to its width; feed it no more than
            # a few points per cell so a long run stays cheap to draw.
            data = rates[-width * 4:]
            if data != spark_widget.data:
                spark_widget.data = data
        else:  # a new run (after R) before its first step: not the last run's chart (issue 46)
            if spark_widget.data:
                spark_widget.data = []
            if box.border_title != EMPTY_TITLE:
                box.border_title = EMPTY_TITLE
        self.query_one("#step-times", LinesView).set_lines(self._step_lines(snap))
        _update(self.query_one("#rate-facts", Static), self._facts(snap))

    @staticmethod
    def _facts(snap: Snapshot) -> Text:
        """Whole-run percentiles (the step split in words is in the rank table's legend)."""
        state = snap.state
        p50, p95 = state.step_ms_pcts(50, 95)
        if p50 is None:
            return Text("")
        return Text.assemble((f"{RUN_LABEL} ", "dim"), f"p50 {fmt(p50)} ms  p95 {fmt(p95)} ms",
                             (f" (whole run after {state.warmup} warmup steps)", "dim"))

    def _step_lines(self, snap: Snapshot) -> list[Text]:
        box = self.query_one("#step-times", LinesView)
        width = max(box.content_region.width - 16, 8)
        series = {r: f.step_ms[-width:] for r, f in sorted(snap.ranks.items())}
        p50 = {r: f.p50 for r, f in snap.ranks.items()}  # the rank table's figure, not the last step
        values = [v for vs in series.values() for v in vs]
        if not values:
            return [Text("no steps yet", style="dim")]
        lo, hi = min(values), max(values)
        slow = snap.slowest
        ranks = list(series)
        tall = box.content_region.height // len(ranks)
        if tall >= 2:  # a tall box and few ranks: each rank's chart as tall as its share, no blank rows
            return self._tall_lines(ranks, series, p50, slow, width, tall, box.content_region.height, lo, hi)

        def line(i: int) -> Text:
            r = ranks[i]
            vs = series[r]
            text = Text(no_wrap=True)
            text.append(f"r{r:<3}", style=SLOW_STYLE if r == slow else "dim")
            text.append(spark(vs, width, lo, hi).ljust(width), style=SLOW_STYLE if r == slow else "")
            text.append(f" {fmt(p50[r], '.1f', '-'):>6} ms")
            return text

        return box.lines_in_view(len(ranks), line)

    @staticmethod
    def _tall_lines(ranks: list[int], series: Mapping[int, Sequence[float]], p50: dict[int, float | None],
                    slow: int | None, width: int, each: int, rows: int, lo: float, hi: float) -> list[Text]:
        """Each rank's recent step times as a chart `each` rows tall (the first ranks one row
        more, to fill the box), its name and p50 on its first row, one scale for all."""
        lines = []
        extra = rows - each * len(ranks)
        # the scale from a little under the fastest step: the fastest still shows a bar
        floor = lo - (hi - lo) * 0.1 if hi > lo else lo * 0.9
        for i, r in enumerate(ranks):
            style = SLOW_STYLE if r == slow else ""
            for k, row in enumerate(chart_rows(series[r], width, each + (1 if i < extra else 0), floor, hi)):
                text = Text(no_wrap=True)
                text.append(f"r{r:<3}" if k == 0 else "    ", style=SLOW_STYLE if r == slow else "dim")
                text.append(row, style=style)
                if k == 0:
                    text.append(f" {fmt(p50[r], '.1f', '-'):>6} ms")
                lines.append(text)
        return lines


def _update(widget: Static, text: Text) -> None:
    """Repaint only on change: a Static update costs a layout pass."""
    if getattr(widget, "_ddptop_shown", None) != text:
        widget._ddptop_shown = text  # type: ignore[attr-defined]
        widget.update(text, layout=False)  # fixed height (CSS): no layout pass
