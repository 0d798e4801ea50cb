"""Presentation helpers shared by the widgets: phase bars, text sparklines, units,
status colours. Pure (Rich Text in, Rich Text out); no Textual widgets here."""

from __future__ import annotations

import re
from collections.abc import Sequence

from rich.cells import cell_len
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
# comm in a phase split is the all-reduce wait no compute hid: the header's "exposed"
PHASE_SHORT = {"data": "data", "forward": "fwd", "backward": "bwd", "optimizer": "opt", "comm": "exposed"}
STATUS_STYLES = {
    "starting": "italic",
    "running": "bold #3a9e5f",
    "completed": "bold #3a9e5f",
    "done": "#3a9e5f",
    "stopped": "#c79100",
    "stopping": "bold #c79100",
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


def legend(phases: Sequence[str], shares: dict[str, float] | None = None) -> Text:
    """Each phase's colour and name, with its share of the step when `shares` says (the
    split in words: the bar's colours are lost on some terminals)."""
    text = Text()
    for p in phases:
        text.append("█ ", style=PHASE_COLORS[p])
        text.append(PHASE_SHORT[p] + (f" {shares[p]:.0%}" if shares and p in shares else "") + "  ")
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


# Where a row may break: after spaces, and after each `/` of a path.
_PIECES = re.compile(r"[ \t]+|[^ \t/]*/+|[^ \t/]+")


def _pieces(plain: str, most: int) -> list[tuple[int, int, bool]]:
    """(start, end, is_space) of each breakable piece; none wider than `most` cells."""
    out = []
    for m in _PIECES.finditer(plain):
        a, b = m.span()
        space = plain[a] in " \t"
        while not space and cell_len(plain[a:b]) > most:  # a word wider than a row: split it
            cut = a + 1
            while cut < b and cell_len(plain[a:cut + 1]) <= most:
                cut += 1
            out.append((a, cut, False))
            a = cut
        out.append((a, b, space))
    return out


def wrap_text(text: Text, width: int, hang: int | None = None) -> list[Text]:
    """`text` as rows of at most `width` cells, broken at spaces or after a path's `/`
    (never inside a word that fits a row), each continuation row indented to column `hang`
    (default: the text's own indentation + 4). What the scrolling views use so that nothing
    runs off their right edge."""
    plain = text.plain
    if width <= 0 or cell_len(plain) <= width:
        return [text]
    lead = len(plain) - len(plain.lstrip(" "))
    pad = min(lead + 4 if hang is None else hang, width // 2)
    spans: list[tuple[int, int]] = []
    start, used, limit = 0, 0, width
    for a, b, space in _pieces(plain, width - pad):
        w = cell_len(plain[a:b])
        if used + w <= limit:
            used += w
        elif space:  # the row ends before the spaces; the next starts after them
            spans.append((start, a))
            start, used, limit = b, 0, width - pad
        elif used:
            spans.append((start, a))
            start, used, limit = a, w, width - pad
    spans.append((start, len(plain)))
    rows = []
    for i, (a, b) in enumerate(spans):
        row = text[a:b]
        row.rstrip()
        if i:
            row.pad_left(pad)
        rows.append(row)
    return rows


def fit_columns(headers: Sequence[str], widths: dict[str, int], room: int, drop: Sequence[str],
                padding: int = 2) -> list[str]:
    """The `headers` a table of `room` cells shows: all when they fit (each column its
    `widths` plus `padding`), else without the columns of `drop`, first ones first; the
    dropped ones that fit again once a wider one went come back. Order as in `headers`."""
    def need(shown: Sequence[str]) -> int:
        return sum(widths[h] + padding for h in shown)

    shown = list(headers)
    for h in drop:
        if need(shown) <= room:
            break
        shown.remove(h)
    for h in reversed(drop):
        if h not in shown and need([*shown, h]) <= room:
            shown.append(h)
    return [h for h in headers if h in shown]


def cells_row(cells: Sequence[tuple[str, str | None]], spec: Sequence[tuple[int, bool]]) -> Text:
    """(text, style) cells cut (…) and aligned to their (width, right) spec, two cells apart."""
    row = Text(no_wrap=True, overflow="crop")
    for i, ((value, style), (width, right)) in enumerate(zip(cells, spec)):
        if i:
            row.append("  ")
        value = truncate(value, width)
        row.append(value.rjust(width) if right else value.ljust(width), style)
    return row


def truncate(text: str, width: int) -> str:
    return text if len(text) <= width else text[: max(width - 1, 0)] + "…"


def fmt_duration(seconds: float) -> str:
    seconds = max(int(seconds), 0)
    h, rest = divmod(seconds, 3600)
    m, s = divmod(rest, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"


_EIGHTHS = " ▁▂▃▄▅▆▇█"


def chart_rows(values: Sequence[float], width: int, height: int, lo: float, hi: float) -> list[str]:
    """The last `width` values as a bar chart `height` rows tall (top row first), scaled to
    [lo, hi] in eighths of a row and right-aligned: the newest value in the last column, the
    columns before the first value blank. Every value shows at least ▁ (a zero is not a gap)."""
    values = list(values)[-width:] if width > 0 else []
    if height <= 0 or width <= 0:
        return []
    steps, span = height * 8, hi - lo
    levels = [max(1, min(steps, round((v - lo) / span * steps))) if span > 0 else steps // 2
              for v in values]
    pad = width - len(levels)
    rows = []
    for row in range(height - 1, -1, -1):  # the top row first; `row` eighths sit below it
        base = row * 8
        rows.append(" " * pad + "".join(_EIGHTHS[max(0, min(8, lv - base))] for lv in levels))
    return rows
