"""RunHeader: three lines about the current run (identity, status, throughput)."""

from __future__ import annotations

from rich.text import Text
from textual.widgets import Static

from ddptop.model.config import RunConfig
from ddptop.model.figures import RECENT_LABEL, RUN_LABEL, ranks_connected
from ddptop.model.report import fmt, fmt_step_rate
from ddptop.model.state import RunState
from ddptop.tui.live import Snapshot
from ddptop.tui.render import SLOW_STYLE, fmt_duration, status_text


def _hello_field(state: RunState, name: str) -> str:
    """What the ranks said of themselves: their hello, or a fact their instrument sent later."""
    for rs in state.ranks.values():
        if rs.hello is not None and getattr(rs.hello, name, None):
            return str(getattr(rs.hello, name))
        if rs.info.get(name):
            return str(rs.info[name])
    return ""


def hook_text(cfg: RunConfig) -> str:
    """The active DDP comm hook, with PowerSGD's rank and start iteration."""
    hook = cfg.comm_hook or "none"
    if hook == "powersgd":
        hook += f" r{cfg.powersgd_rank}"
    return hook


def warm_up_text(cfg: RunConfig) -> str:
    hook = cfg.comm_hook
    if hook == "powersgd":
        return f"PowerSGD warm-up: plain all-reduce until iteration {cfg.powersgd_start_iter}"
    return f"{hook} hook warming up: plain all-reduce"


def script_ddp_text(state: RunState) -> tuple[tuple[str, str], ...]:
    """A user's script: what ddptop changed in its DDP() call, or what the script asked
    for when ddptop changed nothing (as its instrument read them)."""
    changed, asked = _hello_field(state, "ddp_set"), _hello_field(state, "ddp_asked")
    if not changed:
        return ()
    if changed.startswith("nothing"):
        return ("  DDP as the script asked ", "dim"), (asked or "?", "")
    return ("  ddptop changed ", "dim"), (changed, "bold")


BADGE_STYLE = "bold reverse"
SEP = "  "


class RunHeader(Static):
    """Run id, preset, world size, backend, model, status, elapsed, rates. Each line is
    packed from whole pieces: a piece that does not fit the width is left out, never cut
    mid-word (the run's error alone may end in `…`)."""

    _shown: Text | None = None

    def show(self, snap: Snapshot, badges: tuple[str, ...] = ()) -> None:
        """`badges`: the viewer's state ("read-only", "detached", "paused"); a finished run
        adds its own."""
        width = max(self.content_region.width, 20) if self.size.width else 10_000
        lines = [pack(_identity(snap, badges), width), pack(_setup(snap), width), pack(rate_pieces(snap), width)]
        text = Text("\n").join(lines)
        if text != self._shown:  # most refreshes change nothing but a second or two
            self._shown = text
            self.update(text, layout=False)  # fixed height (CSS): no layout pass


def pack(pieces: list[Text], width: int) -> Text:
    """The pieces that fit `width` in order, two spaces apart; the first always (the
    widget's ellipsis ends it if it alone is too wide)."""
    line = Text()
    for piece in pieces:
        if not piece.plain:
            continue
        if line.plain and line.cell_len + len(SEP) + piece.cell_len > width:
            continue
        if line.plain:
            line.append(SEP)
        line.append_text(piece)
    return line


def badge_texts(snap: Snapshot, badges: tuple[str, ...]) -> list[Text]:
    shown = [*(b for b in badges if b != "stopping"), *(["finished"] if snap.finished else [])]
    return [Text(f"[{b}]", style=BADGE_STYLE) for b in shown]


def _identity(snap: Snapshot, badges: tuple[str, ...] = ()) -> list[Text]:
    """Status, elapsed, run id, and what ran (the user's command or the preset)."""
    state, cfg = snap.state, snap.state.config
    paused = "paused" in badges
    # asked to stop, a live run says so at once (issue 46: `running` for 6 s after `x`)
    word = "stopping" if "stopping" in badges and not snap.finished else snap.run_status
    status = Text.assemble(("● ", status_text(word).style), status_text(word),
                           f" {fmt_duration(state.elapsed(snap.now))}" + (" (frozen)" if paused else ""))
    if state.command:  # the user's own script: what ran is the command, not a preset
        command = " ".join(state.command)
        what = Text.assemble(("script ", "dim"), (command if len(command) <= 70 else command[:67] + "…", "bold"))
    else:
        what = Text.assemble(("preset ", "dim"), (cfg.preset, "bold"))
    return [status, *badge_texts(snap, badges), Text.assemble(("run ", "dim"), (state.run_id, "bold")), what]


def _setup(snap: Snapshot) -> list[Text]:
    """World, backend, model, step and the DDP settings in effect."""
    state, cfg = snap.state, snap.state.config
    backend = _hello_field(state, "backend") or cfg.backend
    # a user's script's model is its own: ddptop's model knob says nothing of it
    model = _hello_field(state, "model") or ("?" if cfg.script else cfg.model)
    steps = cfg.total_steps
    hook = (_hello_field(state, "comm_hook") or "?") if state.command else hook_text(cfg)
    ddp = script_ddp_text(state) if state.command else ()
    return [
        Text.assemble(("world ", "dim"), str(state.world_size),
                      (f" on {state.nnodes} nodes" if state.nnodes > 1 else "", "dim")),
        Text.assemble(("step ", "dim"), f"{max(snap.current_step + 1, 0)}" + (f"/{steps}" if steps else "")),
        Text.assemble(("backend ", "dim"), backend),
        Text.assemble(("model ", "dim"), model),
        Text.assemble(("hook ", "dim"), hook),
        Text.assemble(*((t.strip() + " " if i == 0 else t, st) for i, (t, st) in enumerate(ddp))) if ddp else Text(),
    ]


def _rates(snap: Snapshot) -> Text:
    """The third line whole (no width to fit)."""
    return pack(rate_pieces(snap), 10_000)


def rate_pieces(snap: Snapshot) -> list[Text]:
    """Throughput of the whole run and of the last steps, the straggler, comm share,
    warm-up, and why the run ended: each piece names its window."""
    state = snap.state
    pieces: list[Text] = []
    if state.error:
        # Why it ended goes first: the end of a long line is what a narrow terminal cuts.
        failed = f"rank {state.failed_rank}: " if state.failed_rank is not None else ""
        pieces.append(Text(failed + state.error, style="bold #d7503c"))
    if snap.run_status == "starting" and state.error:
        pass  # not started as far as this view knows, and the error says why (a supervisor not answering)
    elif snap.run_status == "starting":
        pieces.append(Text(waiting_text(ranks_connected(state.ranks.values()), state.world_size), style="italic"))
    else:
        pieces.append(Text.assemble((RUN_LABEL + " ", "dim"), ("steps/s ", "dim"), (fmt_step_rate(snap.steps_per_s), "bold"),
                                    ("  samples/s ", "dim"), (fmt(snap.samples_per_s_run, ".1f"), "bold")))
        if snap.warming_up:  # what the run is doing matters more than its second pace figure
            pieces.append(Text(warm_up_text(state.config), style="bold #c79100"))
        pieces.append(Text.assemble((RECENT_LABEL + " ", "dim"), ("steps/s ", "dim"),
                                    (fmt_step_rate(snap.recent_steps_per_s), "bold"),
                                    ("  samples/s ", "dim"), (fmt(snap.recent_samples_per_s, ".1f"), "bold")))
        if snap.slowest is not None and state.world_size > 1:
            pieces.append(Text.assemble(("▲ slowest ", SLOW_STYLE), (f"rank {snap.slowest}", SLOW_STYLE)))
    pieces.append(comm_text(snap.comm, snap.comm_window, snap.comm_run))
    if snap.dropped:
        pieces.append(Text(f"dropped frames {snap.dropped}", style="#c79100"))
    return pieces


def waiting_text(connected: int, world_size: int) -> str:
    """Before the first step: the ranks still to connect, then (all in) the first step, which
    a model's build and DDP's first sync take (issue 46: `2/2 connected` stayed ~8 s)."""
    if connected < world_size:
        return f"waiting for ranks: {connected}/{world_size} connected"
    return f"all {world_size} ranks connected: waiting for the first step"


def comm_text(comm: tuple[float | None, float | None] | None, label: str = RECENT_LABEL,
              run: tuple[float | None, float | None] = (None, None)) -> Text:
    """All-reduce in flight and the part of it no compute hid, as shares of the step, both
    over the same steps of each rank's last 50 (`label`: the timed ones where a GPU times
    one step in comm_timing_every)."""
    if comm is None:
        return Text()
    total, exposed = comm
    # the whole run's beside it: the exit summary says only that one (issue 46)
    over_run = (f"; {RUN_LABEL} {run[0]:.0%}, exposed {run[1] or 0.0:.0%}" if run[0] is not None and total is not None
                else f"; {RUN_LABEL} exposed {run[1]:.0%}" if run[1] is not None and total is None else "")
    window = (f" ({label}{over_run})", "dim")
    if total is None:
        return Text.assemble(("exposed comm ", "dim"), (f"{exposed or 0.0:.0%}", "bold"),
                             (" of step (total: nccl_timing)", "dim"), window)
    return Text.assemble(("comm ", "dim"), (f"{total:.0%}", "bold"), (" of step, exposed ", "dim"),
                         (f"{exposed or 0.0:.0%}", "bold"), window)
