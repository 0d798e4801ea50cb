"""HelpScreen: one screen, even at 80x24: what the marks and windows mean on top, then in
two columns every key of the current tab and the keys that work everywhere (read from the
bindings themselves, so help and keys cannot drift apart)."""

from __future__ import annotations

from collections.abc import Sequence

from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Static

from ddptop.model import straggler
from ddptop.model.figures import RECENT_LABEL, RUN_LABEL
from ddptop.tui.render import PHASE_COLORS, PHASE_SHORT
from ddptop.tui.screens.rank_detail import RankDetailScreen
from ddptop.tui.widgets.log_view import LogView
from ddptop.tui.widgets.rank_table import RankTable
from ddptop.tui.widgets.runs_panel import RunsPanel

# Each tab's own keys: its widget's bindings (and, on the ranks tab, the rank detail's).
TAB_KEYS: dict[str, Sequence[tuple[str, Sequence[BindingType]]]] = {
    "ranks": (("ranks tab", RankTable.BINDINGS), ("a rank's detail (⏎)", RankDetailScreen.BINDINGS)),
    "runs": (("runs tab", RunsPanel.BINDINGS),),
    "logs": (("logs tab", LogView.BINDINGS),),
}
# Keys that are not bindings of a widget: the mouse and the tab digits, said once.
EXTRA: dict[str, Sequence[tuple[str, str]]] = {
    "ranks": (("↑ ↓", "move the cursor row"), ("click title", "sort by it (again: invert)"),
              ("dbl-click", "open the rank")),
}
EVERYWHERE_EXTRA = (("1-6", "switch tab"), ("ctrl+p", "actions by name"),
                    ("f4 f5 M T H u l", "htop's keys: where that is here"),
                    ("ctrl+q", "quit now (no question)"))


def legend() -> Text:
    """The windows, marks and words the views use, in four lines of at most 76 cells."""
    text = Text()
    text.append("windows ", style="bold")
    text.append(f"{RECENT_LABEL} = each rank's last {straggler.WINDOW} steps · {RUN_LABEL} = whole run after warmup\n")
    text.append("own work ", style="bold")
    text.append("= step minus exposed comm (the all-reduce wait no compute hid)\n")
    text.append("▲ straggler ", style="bold #d7503c")
    text.append(f"costs the job time beyond noise, {straggler.PERSIST} checks in a row\n")
    for p in ("data", "forward", "backward", "comm", "optimizer"):
        text.append("█ ", style=PHASE_COLORS[p])
        text.append(PHASE_SHORT[p] + ("  comm" if p == "comm" else "") + "  ")
    text.append("↓ ↑ sorted column")
    return text


def key_rows(bindings: Sequence[BindingType], key_display: object) -> list[tuple[str, str]]:
    """(keys, what) per action, keys of one action together ("q f10"); hidden refusals and
    the tab digits left out."""
    rows: dict[str, list[str]] = {}
    what: dict[str, str] = {}
    for b in bindings:
        if not isinstance(b, Binding) or not b.description or b.action.startswith(("refuse", "show_tab")):
            continue
        key = key_display(b) if callable(key_display) else b.key
        if b.action in rows:
            if key not in rows[b.action]:
                rows[b.action].append(key)
        else:
            rows[b.action], what[b.action] = [key], b.description
    return [(" ".join(keys), what[action]) for action, keys in rows.items()]


class HelpScreen(ModalScreen[None]):
    BINDINGS = [
        Binding("escape", "close", "Close"),
        Binding("q", "close", "Close"),
        Binding("question_mark", "close", "Close"),
        Binding("h", "close", "Close", show=False),
        Binding("f1", "close", "Close", show=False),
    ]

    def __init__(self, tab: str = "ranks", app_keys: Sequence[BindingType] = ()) -> None:
        super().__init__()
        self.tab = tab
        self.app_keys = app_keys

    def compose(self) -> ComposeResult:
        with Vertical(id="help-box"):
            yield Static(legend(), id="help-legend")
            yield Static(self._keys(), id="help-text")

    def on_mount(self) -> None:
        self.query_one("#help-box").border_title = f"ddptop help: {self.tab} tab  (esc closes)"

    def entries(self) -> list[tuple[str, str]]:
        """Every row of the two columns, section titles as ('', title)."""
        show = self.app.get_key_display
        out: list[tuple[str, str]] = []
        for where, bindings in TAB_KEYS.get(self.tab, ()):
            out += [("", where), *key_rows(bindings, show)]
        out += list(EXTRA.get(self.tab, ()))
        out += [("", "everywhere"), *key_rows(self.app_keys, show), *EVERYWHERE_EXTRA]
        return out

    def _keys(self) -> Table:
        rows = self.entries()
        half = (len(rows) + 1) // 2
        grid = Table.grid(padding=(0, 1), expand=True)
        for _ in range(2):
            grid.add_column(style="bold", no_wrap=True)
            grid.add_column(ratio=1, no_wrap=True, overflow="ellipsis")
        cells: list[tuple[Text | str, Text | str]] = [
            ("", Text(what, style="bold underline")) if not key else (key, what) for key, what in rows]
        for i in range(half):
            right = cells[half + i] if half + i < len(cells) else ("", "")
            grid.add_row(*cells[i], *right)
        return grid

    def action_close(self) -> None:
        self.dismiss(None)
