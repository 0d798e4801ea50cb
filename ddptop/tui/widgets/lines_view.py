"""LinesView: a scrolling list of one-line Rich Texts, drawn with Textual's line
API: only visible lines are rendered, each one once until its text changes, and
an optional row cursor moves with the keyboard. What the 64-rank views use
instead of DataTable, which re-renders every cell of the table on any update."""

from __future__ import annotations

from collections.abc import Callable

from rich.segment import Segment
from rich.style import Style
from rich.text import Text
from textual import events
from textual.binding import Binding
from textual.geometry import Region, Size
from textual.reactive import reactive
from textual.scroll_view import ScrollView
from textual.strip import Strip


class LinesView(ScrollView, can_focus=True):
    COMPONENT_CLASSES = {"lines-view--cursor"}
    DEFAULT_CSS = """
    LinesView {
        overflow-x: hidden;
        scrollbar-size-vertical: 1;
    }
    LinesView > .lines-view--cursor {
        background: $accent 30%;
    }
    LinesView:focus > .lines-view--cursor {
        background: $accent 50%;
        text-style: bold;
    }
    """
    BINDINGS = [
        Binding("up", "cursor(-1)", "Up", show=False),
        Binding("down", "cursor(1)", "Down", show=False),
        Binding("pageup", "page(-1)", "Page up", show=False),
        Binding("pagedown", "page(1)", "Page down", show=False),
        Binding("home", "jump(0)", "First", show=False),
        Binding("end", "jump(-1)", "Last", show=False),
    ]

    cursor: reactive[int] = reactive(0, repaint=False)

    def __init__(self, cursor: bool = True, **kwargs) -> None:  # noqa: ANN003 - Widget's options
        super().__init__(**kwargs)
        self.show_cursor = cursor
        self._lines: list[Text] = []
        self._strips: dict[int, Strip] = {}  # line index -> rendered strip
        self._base: Style | None = None

    @property
    def lines(self) -> list[Text]:
        return self._lines

    def lines_in_view(self, count: int, build: Callable[[int], Text]) -> list[Text]:
        """`count` lines for set_lines(), built with `build(index)` only where they are in
        view: with as many lines as now, the rest keep their current text and are built
        when they have scrolled into view, at the next update (64 rank rows cost ~6 ms)."""
        if len(self._lines) != count:
            return [build(i) for i in range(count)]
        top = int(self.scroll_y)
        shown = range(top, top + max(self.size.height, 1))
        return [build(i) if i in shown else self._lines[i] for i in range(count)]

    def set_lines(self, lines: list[Text]) -> None:
        """Show `lines`; repaints only the lines whose text changed."""
        old = self._lines
        self._lines = list(lines)
        width = max((t.cell_len for t in self._lines), default=0)
        if len(old) != len(lines) or width != self.virtual_size.width:
            self._strips.clear()
            self.virtual_size = Size(width, len(self._lines))
            self.cursor = min(self.cursor, max(len(self._lines) - 1, 0))
            self.refresh()
            return
        top = int(self.scroll_y)
        for i, (a, b) in enumerate(zip(old, self._lines)):
            if a != b:
                self._strips.pop(i, None)
                if top <= i < top + self.size.height:
                    self.refresh(Region(0, i - top, self.size.width, 1))

    def notify_style_update(self) -> None:
        super().notify_style_update()
        self._strips.clear()  # theme changed: cached strips carry the old colours
        self._base = None

    def render_line(self, y: int) -> Strip:
        index = int(self.scroll_y) + y
        width = self.size.width
        if self._base is None:
            self._base = self.rich_style
        if index >= len(self._lines):
            return Strip.blank(width, self._base)
        strip = self._strips.get(index)
        if strip is None:
            text = self._lines[index]
            strip = Strip(list(text.render(self.app.console)), text.cell_len)
            strip = strip.apply_style(self._base)
            self._strips[index] = strip
        if self.show_cursor and index == self.cursor:
            # On top of each segment's own style (apply_style would put it underneath), but
            # the background and weight only: the component style also carries the text
            # colour, which would paint a phase bar's coloured blocks all one colour.
            strip = Strip(list(Segment.apply_style(strip, post_style=self._cursor_style())),
                          strip.cell_length)
        x = int(self.scroll_x)
        return strip.crop_extend(x, x + width, self._base)

    def _cursor_style(self) -> Style:
        style = self.get_component_rich_style("lines-view--cursor")
        return Style(bgcolor=style.bgcolor, bold=style.bold)

    def watch_cursor(self, old: int, new: int) -> None:
        top = int(self.scroll_y)
        for index in (old, new):
            if top <= index < top + self.size.height:
                self.refresh(Region(0, index - top, self.size.width, 1))

    def action_cursor(self, delta: int) -> None:
        self.move_cursor(self.cursor + delta)

    def action_page(self, delta: int) -> None:
        self.move_cursor(self.cursor + delta * max(self.size.height - 1, 1))

    def action_jump(self, where: int) -> None:
        self.move_cursor(len(self._lines) - 1 if where < 0 else where)

    def on_click(self, event: events.Click) -> None:
        """The mouse moves the cursor to the row clicked (a double click, to the app)."""
        if self.show_cursor and event.y >= 0:
            self.focus()
            self.move_cursor(int(self.scroll_y) + event.y)

    def move_cursor(self, index: int) -> None:
        if not self._lines:
            return
        self.cursor = max(0, min(index, len(self._lines) - 1))
        if self.cursor < self.scroll_y:
            self.scroll_to(y=self.cursor, animate=False)
        elif self.cursor >= self.scroll_y + self.size.height:
            self.scroll_to(y=self.cursor - self.size.height + 1, animate=False)
