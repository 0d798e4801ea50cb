"""HelpScreen: what each view shows and every key, for a first-time user."""

from __future__ import annotations

from collections.abc import Sequence

from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Static

from ddptop.model import straggler

VIEWS = (
    ("Ranks", "one row per rank: where it runs, step, recent p50/p95 step time, how the step "
              "splits into data/forward/backward/optimizer (and communication once measured), "
              "samples/s, status. ▲ marks the slowest rank (most own work per step); the status says "
              "'straggler' when its own work exceeds the others' on the same steps beyond the run's "
              f"step-to-step noise (sign test over the last {straggler.WINDOW} steps), by "
              f"{straggler.MIN_MS:g} ms and {100 * straggler.MIN_SHARE:g}% of the step or more, in "
              f"{straggler.PERSIST} checks {straggler.EVERY} steps apart; 'suspect' during a stall. Below: "
              "steps/s over the run and each rank's recent step times on one scale."),
    ("GPU", "per GPU utilisation, memory, power, temperature, SM clock, PCIe, NVLink and the "
            "ranks on it (NVML). Without NVML: why, and each rank's CPU% and memory."),
    ("Runs", "every run of this session and earlier ones in the runs directory; speedup is "
             "steps/s relative to the reference run (first 'baseline' run unless you pick one)."),
    ("Logs", "each rank's output and torchrun's, filterable by rank; NCCL lines highlighted."),
    ("Wiring", "the transport NCCL chose for each rank pair (P2P, SHM, NET...) next to the "
               "hardware link between their GPUs (NVML); red: slower than the hardware allows, "
               "amber: PCIe or host memory. NCCL's version, channels, env and algorithms, and "
               "the advisor's recommendation with its reason."),
    ("Captures", "profiler windows (c: the next 3 steps on every rank): status, the trace "
                 "files per rank, and per rank communication, overlap, steps covered, top op."),
    ("Detach", "d leaves the run going without this terminal (it runs in a supervisor process); "
               "`ddptop ls` lists live runs, `ddptop attach RUN_ID` opens this view again with the "
               "history so far. A run started plainly belongs to its terminal: closing it stops the "
               "run cleanly; a detached run survives any viewer's hang-up."),
    ("Settings", "every knob of the next run; presets fill in the DDP knobs. Applying stops the "
                 "current run cleanly and starts a new one."),
)


class HelpScreen(ModalScreen[None]):
    BINDINGS = [
        Binding("escape", "close", "Close"),
        Binding("q", "close", "Close"),
        Binding("question_mark", "close", "Close"),
    ]

    def __init__(self, keys: Sequence[tuple[str, Sequence[BindingType]]] = ()) -> None:
        super().__init__()
        self.keys = keys  # (where, bindings) sections

    def compose(self) -> ComposeResult:
        with VerticalScroll(id="help-box"):
            yield Static(self._content(), id="help-text")

    def on_mount(self) -> None:
        self.query_one("#help-box").border_title = "ddptop help  (esc closes)"

    def _content(self) -> Table:
        grid = Table.grid(padding=(0, 2))
        grid.add_column(style="bold", no_wrap=True)
        grid.add_column()
        for name, text in VIEWS:
            grid.add_row(name, text)
        for where, bindings in self.keys:
            grid.add_row("", "")
            grid.add_row(Text(f"Keys: {where}", style="bold underline"), "")
            for b in bindings:
                if isinstance(b, Binding) and b.description:
                    grid.add_row(self.app.get_key_display(b), b.tooltip or b.description)
        grid.add_row("", "")
        grid.add_row("ctrl+p", "command palette: every action by name")
        grid.add_row("ctrl+q", "quit without asking (a run this terminal owns is still stopped "
                               "cleanly; a detached run goes on)")
        grid.add_row("tab / shift+tab", "move between controls; arrows scroll tables")
        return grid

    def action_close(self) -> None:
        self.dismiss(None)
