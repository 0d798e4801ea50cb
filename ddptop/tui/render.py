"""Presentation helpers shared by the widgets: phase bars, text sparklines, units,
status colours. Pure (Rich Text in, Rich Text out); no Textual widgets here."""

from __future__ import annotations

from collections.abc import Sequence

from rich.text import Text

from ddptop.model.report import NA

# Mid-saturation colours readable on both light and dark backgrounds.
PHASE_COLORS = {
    "data": "#5f87d7",
    "forward": "#3a9e5f",
    "backward": "#c79100",
    "optimizer": "#a35fc0",
    "comm": "#d7503c",
}
PHASE_SHORT = {"data": "data", "forward": "fwd", "backward": "bwd", "optimizer": "opt", "comm": "comm"}
STATUS_STYLES = {
    "starting": "italic",
    "running": "bold #3a9e5f",
    "completed": "bold #3a9e5f",
    "done": "#3a9e5f",
    "stopped": "#c79100",
    "failed": "bold #d7503c",
    "lost": "bold #d7503c",
    "stalled?": "bold #c79100",
    "straggler": "bold #d7503c",
    "suspect": "bold #ffffff on #b03a2e",
}
SLOW_STYLE = "bold #d7503c"
NCCL_STYLE = "bold #a35fc0"
_BLOCKS = "▁▂▃▄▅▆▇█"


def status_text(status: str) -> Text:
    return Text(status, style=STATUS_STYLES.get(status, ""))


def phase_bar(parts: dict[str, float], width: int) -> Text:
    """A stacked bar of `width` cells, one colour per phase, by share of the total.
    Rounds by largest remainder so the cells always add up to `width`."""
    total = sum(v for v in parts.values() if v > 0)
    bar = Text()
    if width <= 0:
        return bar
    if total <= 0:
        return Text("·" * width, style="dim")
    exact = {k: max(v, 0.0) / total * width for k, v in parts.items()}
    cells = {k: int(v) for k, v in exact.items()}
    left = width - sum(cells.values())
    for k in sorted(exact, key=lambda k: exact[k] - cells[k], reverse=True)[:left]:
        cells[k] += 1
    for k, n in cells.items():
        if n:
            bar.append("█" * n, style=PHASE_COLORS.get(k, ""))
    return bar


def legend(phases: Sequence[str]) -> Text:
    text = Text()
    for p in phases:
        text.append("█ ", style=PHASE_COLORS[p])
        text.append(PHASE_SHORT[p] + "  ")
    return text


def spark(values: Sequence[float], width: int, lo: float | None = None,
          hi: float | None = None) -> str:
    """The last `width` values as block characters, scaled to [lo, hi]."""
    values = list(values)[-width:] if width > 0 else []
    if not values:
        return ""
    lo = min(values) if lo is None else lo
    hi = max(values) if hi is None else hi
    span = hi - lo
    if span <= 0:
        return _BLOCKS[len(_BLOCKS) // 2] * len(values)
    top = len(_BLOCKS) - 1
    return "".join(_BLOCKS[max(0, min(top, round((v - lo) / span * top)))] for v in values)


def fmt_bytes(n: float | None) -> str:
    if n is None:
        return NA
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


def fmt_rate_kbs(kbs: float | None) -> str:
    """NVML reports PCIe throughput in KB/s."""
    if kbs is None:
        return NA
    if kbs >= 1024 * 1024:
        return f"{kbs / 1024 / 1024:.1f}G"
    return f"{kbs / 1024:.0f}M" if kbs >= 1024 else f"{kbs:.0f}K"


def truncate(text: str, width: int) -> str:
    return text if len(text) <= width else text[: max(width - 1, 0)] + "…"


def fmt_duration(seconds: float) -> str:
    seconds = max(int(seconds), 0)
    h, rest = divmod(seconds, 3600)
    m, s = divmod(rest, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"
