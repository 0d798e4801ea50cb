"""RunsPanel: every run of this session and earlier ones from the runs directory,
with speedup vs a reference run. `b` makes the highlighted run the reference,
`e` exports the table as Markdown."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.message import Message
from textual.widgets import DataTable, Static

from ddptop.run.runs import HEADERS, RunsTable
from ddptop.tui.render import status_text

NUMERIC = {"ranks", "steps/s", "samples/s", "p50 ms", "speedup"}


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

    def on_mount(self) -> None:
        table = self.query_one("#runs-table", DataTable)
        for name in HEADERS:
            table.add_column(name, key=name)
        self._shown: list[list[str]] = []

    @property
    def table(self) -> DataTable:
        return self.query_one("#runs-table", DataTable)

    def show(self, runs: RunsTable) -> None:
        cells = [runs.cells(row, short=True) for row in runs.rows]
        if cells == self._shown:
            return
        table = self.table
        cursor = table.cursor_row
        table.clear()
        for row, values in zip(runs.rows, cells):
            styled = [
                status_text(v) if name == "status"
                else Text(v, justify="right", style="bold" if name == "speedup" else "")
                if name in NUMERIC else v
                for name, v in zip(HEADERS, values)
            ]
            table.add_row(*styled, key=row.run_id)
        if cells:
            table.move_cursor(row=min(cursor, len(cells) - 1))
        self._shown = cells

    def action_export(self) -> None:
        self.post_message(self.ExportRequested())

    def action_baseline(self) -> None:
        table = self.table
        if table.row_count:
            key = table.coordinate_to_cell_key(table.cursor_coordinate).row_key
            self.post_message(self.ReferenceChosen(str(key.value)))
