"""RunsPanel: every run of this session and earlier ones from the runs directory,
with speedup vs a reference run. `b` makes the highlighted run the reference,
`e` exports the table as Markdown. The table never scrolls sideways: the columns that do
not fit the width go to a line under it, for the highlighted run, and the settings wrap."""

from __future__ import annotations

from rich.cells import cell_len
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.message import Message
from textual.widgets import DataTable, Static

from ddptop.run.runs import HEADERS, RunsTable
from ddptop.tui.render import fit_columns, status_text

NUMERIC = {"ranks", "steps/s", "samples/s", "p50 ms", "speedup"}
# What a narrow terminal moves under the table first (issue 21: at 80 columns the table
# ended at `stat`, at 120 the settings read `bucket 50MB, stati` and nothing said it scrolled).
RUNS_DROP = ("model", "ranks", "samples/s", "p50 ms", "settings", "preset")
SETTINGS_MIN = 30  # the settings column wraps in its cells; narrower than this it goes below


class RunsPanel(Vertical):
    BINDINGS = [
        Binding("e", "export", "Export", tooltip="Export Markdown"),
        Binding("b", "baseline", "Reference", tooltip="Set reference"),
    ]

    class ExportRequested(Message):
        """Write the runs table as Markdown."""

    class ReferenceChosen(Message):
        def __init__(self, run_id: str) -> None:
            super().__init__()
            self.run_id = run_id

    def compose(self) -> ComposeResult:
        yield Static(Text.assemble(
            ("speedup", "bold"), " = steps/s relative to the reference run   ",
            ("*", "bold"), " = earlier ddptop session   ",
            ("b", "bold"), " set reference   ", ("e", "bold"), " export Markdown",
        ), id="runs-hint")
        yield DataTable(id="runs-table", cursor_type="row", zebra_stripes=True)
        yield Static("", id="runs-detail")

    def on_mount(self) -> None:
        self._shown: tuple[list[list[str]], int] = ([], 0)
        self._columns: tuple[tuple[str, int | None], ...] = ()
        self._cells: dict[str, list[str]] = {}  # row key (its run dir) -> its cells, in HEADERS order
        self._ids: dict[str, str] = {}  # row key -> run id (a copied run dir repeats one)
        self._runs: RunsTable | None = None
        self.query_one("#runs-detail", Static).display = False

    def on_resize(self) -> None:
        if self._runs is not None:  # a new width: another column set, now (not in 2 s)
            self.show(self._runs)

    @property
    def table(self) -> DataTable:
        return self.query_one("#runs-table", DataTable)

    def show(self, runs: RunsTable) -> None:
        self._runs = runs
        cells = [runs.cells(row, short=True) for row in runs.rows]
        table = self.table
        room = (table.size.width or 200) - 2  # 2: a vertical scrollbar, when the runs overflow
        if (cells, room) == self._shown:
            return
        self._shown = (cells, room)
        self._cells = {row.key: values for row, values in zip(runs.rows, cells)}
        self._ids = {row.key: row.run_id for row in runs.rows}
        columns = self._fit(cells, room)
        cursor = table.cursor_row
        if columns != self._columns:
            table.clear(columns=True)
            for name, width in columns:
                table.add_column(name, key=name, width=width)
            self._columns = columns
        table.clear()
        shown = [name for name, _ in columns]
        for row, values in zip(runs.rows, cells):
            # Text, never a str: DataTable parses a str as markup (`[/bold]` in a run id raised)
            styled = [
                status_text(v) if name == "status"
                else Text(v, justify="right", style="bold" if name == "speedup" else "")
                if name in NUMERIC else Text(v)
                for name, v in zip(HEADERS, values) if name in shown
            ]
            table.add_row(*styled, key=row.key, height=None)  # a long settings cell wraps
        if cells:
            table.move_cursor(row=min(cursor, len(cells) - 1))
        self._show_detail()

    @staticmethod
    def _fit(cells: list[list[str]], room: int) -> tuple[tuple[str, int | None], ...]:
        """The columns that fit `room` cells, each with its width (None: its content's);
        the settings column gets what the others leave, at least SETTINGS_MIN."""
        widths = {h: max([cell_len(h)] + [cell_len(row[i]) for row in cells]) for i, h in enumerate(HEADERS)}
        settings = widths["settings"]
        shown = fit_columns(HEADERS, {**widths, "settings": min(settings, SETTINGS_MIN)}, room, RUNS_DROP)
        left = room - sum(widths[h] + 2 for h in shown if h != "settings") - 2
        return tuple((h, min(settings, left) if h == "settings" else None) for h in shown)

    def on_data_table_row_highlighted(self, event: DataTable.RowHighlighted) -> None:
        self._show_detail()

    def _show_detail(self) -> None:
        """The highlighted run's values of the columns the table has no room for."""
        detail = self.query_one("#runs-detail", Static)
        hidden = [h for h in HEADERS if h not in {name for name, _ in self._columns}]
        table = self.table
        values = None
        if hidden and table.row_count:
            key = table.coordinate_to_cell_key(table.cursor_coordinate).row_key
            values = self._cells.get(str(key.value))
        detail.display = values is not None
        if values is None:
            return
        text = Text.assemble((f"{values[0]}: ", "bold"))
        for i, h in enumerate(hidden):
            text.append(("   " if i else "") + f"{h} ", style="dim")
            text.append(values[HEADERS.index(h)])
        text.append("   (no room in the table at this width)", style="dim italic")
        detail.update(text)

    def action_export(self) -> None:
        self.post_message(self.ExportRequested())

    def action_baseline(self) -> None:
        table = self.table
        if table.row_count:
            key = table.coordinate_to_cell_key(table.cursor_coordinate).row_key
            run_id = self._ids.get(str(key.value))
            if run_id is not None:
                self.post_message(self.ReferenceChosen(run_id))
