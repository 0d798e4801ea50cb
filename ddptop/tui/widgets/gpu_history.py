"""GpuHistory: the GPU tab's rows under its table: each GPU's utilization, memory used and
power over the samples the run keeps (RunState.gpu_history), or without NVML each rank's CPU %
and RSS (RunState.proc_history), as bar charts the width of the tab, each labelled with its
current value and its scale. It takes only the rows the table leaves (at 80x24 often none, or
one line saying what a taller terminal shows) and redraws only when a sample or its size
changes. Reads the state; no I/O."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from rich.cells import cell_len
from rich.text import Text
from textual.widgets import Static

from ddptop.model.report import fmt
from ddptop.model.state import RunState
from ddptop.tui.render import chart_rows, fmt_bytes, fmt_duration

UTIL_STYLE, MEM_STYLE, POWER_STYLE = "#3a9e5f", "#5f87d7", "#c79100"
AXIS = "▏"


@dataclass(frozen=True)
class Series:
    """One chart: what it is, its samples (oldest first), the latest as text, its scale."""

    label: str
    values: list[float]
    now: str
    hi: float
    scale: str
    style: str


def _get(obj: Any, name: str) -> Any:
    return obj.get(name) if isinstance(obj, dict) else getattr(obj, name, None)


def _gpus(sample: Any) -> list[Any]:
    gpus = _get(sample, "gpus") if sample is not None else None
    return list(gpus) if isinstance(gpus, (list, tuple)) else []


def _watts(gpu: Any, name: str) -> float | None:
    watts = _get(gpu, f"{name}_w")
    milli = _get(gpu, f"{name}_mw")
    return float(watts) if watts is not None else (milli / 1000.0 if milli is not None else None)


def gpu_series(history: Sequence[Any]) -> list[Series]:
    """Per GPU (by index, in order): utilization, memory used, power, over `history`."""
    per: dict[Any, dict[str, list[float]]] = {}
    last: dict[Any, Any] = {}
    for sample in history:
        for gpu in _gpus(sample):
            index = _get(gpu, "index")
            series = per.setdefault(index, {"util": [], "mem": [], "power": []})
            last[index] = gpu
            for key, value in (("util", _get(gpu, "util_pct") if _get(gpu, "util_pct") is not None
                                 else _get(gpu, "util")),
                               ("mem", _get(gpu, "mem_used")), ("power", _watts(gpu, "power"))):
                if value is not None:
                    series[key].append(float(value))
    out = []
    for index in sorted(per, key=lambda i: (str(type(i)), i)):
        s, gpu = per[index], last[index]
        if s["util"]:
            out.append(Series(f"gpu {index} util", s["util"], f"{s['util'][-1]:.0f} %", 100.0, "0-100 %",
                              UTIL_STYLE))
        if s["mem"]:
            total = _get(gpu, "mem_total") or max(s["mem"])
            out.append(Series(f"gpu {index} memory", s["mem"], fmt_bytes(s["mem"][-1]), float(total),
                              f"0-{fmt_bytes(total)}", MEM_STYLE))
        if s["power"]:
            limit = _watts(gpu, "power_limit") or max(s["power"])
            out.append(Series(f"gpu {index} power", s["power"], f"{s['power'][-1]:.0f} W", float(limit),
                              f"0-{limit:.0f} W", POWER_STYLE))
    return out


def proc_series(state: RunState, history: Sequence[dict[int, tuple[float, int]]]) -> list[Series]:
    """Per rank (in order): its process's CPU % (of one core) and resident memory over `history`."""
    out = []
    for r in sorted(state.ranks):
        hello = state.ranks[r].hello
        if hello is None:
            continue
        samples = [s[hello.pid] for s in history if hello.pid in s]
        if not samples:
            continue
        cpu, rss = [float(c) for c, _ in samples], [float(m) for _, m in samples]
        top = max(100.0, max(cpu))
        out.append(Series(f"rank {r} CPU", cpu, f"{fmt(cpu[-1], '.0f')} %", top, f"0-{top:.0f} %", UTIL_STYLE))
        out.append(Series(f"rank {r} RSS", rss, fmt_bytes(rss[-1]), max(rss), f"0-{fmt_bytes(max(rss))}",
                          MEM_STYLE))
    return out


def history_lines(series: Sequence[Series], head: Callable[[int], str], what: str, width: int,
                  height: int) -> list[Text]:
    """`height` rows of `width` cells: a head line (`head(columns)`: the time the charts span), then each
    series' chart sharing the rows left; where fewer rows than charts are left, the first
    charts one row each and a line saying how many more a taller terminal shows."""
    if height <= 0 or width <= 0:
        return []
    if not series:
        return [Text(f"history: {what} appear here after the first sample", style="dim")]
    rows = height - 1
    if rows >= len(series):
        shown, more = list(series), 0
    else:
        shown = list(series[:rows - 1]) if rows >= 2 else []  # the last row says how many more
        more = len(series) - len(shown)
    if not shown:
        return [Text(f"history: a taller terminal charts {what} over time", style="dim", no_wrap=True)]
    each, extra = divmod(rows - (1 if more else 0), len(shown))
    tall = each >= 2
    label_w = min(max(width // 2, 10), max(
        (cell_len(f"{s.label} {s.now}") if tall else cell_len(f"{s.label} {s.now} ({s.scale})")) for s in shown) + 2)
    if tall:
        label_w = max(label_w, min(width // 3, max(cell_len(s.scale) + 8 for s in shown)))
    chart_w = max(width - label_w, 1)
    lines = [Text(head(chart_w), style="dim", no_wrap=True)]
    for i, s in enumerate(shown):
        h = each + (1 if i < extra else 0)
        labels = ([Text.assemble(s.label + " ", (s.now, "bold")), Text(f"  scale {s.scale}", style="dim")] if tall
                  else [Text.assemble(s.label + " ", (s.now, "bold"), (f" ({s.scale})", "dim"))])
        for k, row in enumerate(chart_rows(s.values, chart_w, h, 0.0, s.hi)):
            label = labels[k] if k < len(labels) else Text("")
            label.truncate(label_w - 2, overflow="ellipsis")
            line = Text(no_wrap=True)
            line.append_text(label)
            line.append(" " * (label_w - label.cell_len - 1))
            line.append(AXIS, style="dim")  # the chart's left edge: its rows above a low bar are chart, not blank
            line.append(row, style=s.style)
            lines.append(line)
    if more:
        lines.append(Text(f"… {more} more charts: a taller terminal shows them", style="dim", no_wrap=True))
    return lines


def gpu_head(shown: Sequence[Any], kept: int) -> str:
    times = [t for t in (_get(s, "t") for s in shown) if isinstance(t, (int, float))]
    span = fmt_duration(times[-1] - times[0]) if len(times) >= 2 else "0:00"
    return f"history: the last {span} ({len(shown)} samples, newest on the right; at most {kept} kept)"


class GpuHistory(Static):
    """Call `show(state)` to refresh."""

    def on_mount(self) -> None:
        self._key: tuple[Any, ...] = ()
        self._state: RunState | None = None

    def on_resize(self) -> None:
        if self._state is not None:
            self.show(self._state)

    def show(self, state: RunState) -> None:
        self._state = state
        nvml = bool(_gpus(state.gpu))
        history: Sequence[Any] = state.gpu_history if nvml else state.proc_history
        region = self.content_region
        last = history[-1] if history else None
        key = (nvml, len(history), id(last), region.width, region.height, len(state.ranks))
        if key == self._key:
            return
        self._key = key
        shown = list(history)[-max(region.width, 1):]  # no more than a chart can show
        kept = getattr(history, "maxlen", None) or len(history)
        if nvml:
            series = gpu_series(shown)
            what = "each GPU's util, memory, power"

            def head(columns: int) -> str:
                return gpu_head(shown[-columns:], kept)
        else:
            series = proc_series(state, shown)

            def head(columns: int) -> str:
                return f"history: each rank's last {len(shown[-columns:])} samples, newest on the right (at most {kept} kept)"
            what = "each rank's CPU % and RSS"
        lines = history_lines(series, head, what, region.width, region.height)
        self.update(Text("\n").join(lines), layout=False)
