"""RunHeader: three lines about the current run (identity, status, throughput)."""

from __future__ import annotations

from rich.text import Text
from textual.widgets import Static

from ddptop.model.report import fmt
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


def hook_text(cfg: dict) -> str:
    """The active DDP comm hook, with PowerSGD's rank and start iteration."""
    hook = str(cfg.get("comm_hook", "none") or "none")
    if hook == "powersgd":
        hook += f" r{cfg.get('powersgd_rank', '?')}"
    return hook


def warm_up_text(cfg: dict) -> str:
    hook = cfg.get("comm_hook")
    if hook == "powersgd":
        return (f"PowerSGD warm-up: plain all-reduce until iteration "
                f"{cfg.get('powersgd_start_iter', '?')}")
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


class RunHeader(Static):
    """Run id, preset, world size, backend, model, status, elapsed, rates."""

    _shown: Text | None = None

    def show(self, snap: Snapshot) -> None:
        line1, line2, line3 = _identity(snap), _setup(snap), _rates(snap)
        text = Text("\n").join([line1, line2, line3])
        if text != self._shown:  # most refreshes change nothing but a second or two
            self._shown = text
            self.update(text, layout=False)  # fixed height (CSS): no layout pass


def _identity(snap: Snapshot) -> Text:
    """Status, elapsed, run id, and what ran (the user's command or the preset)."""
    state, cfg = snap.state, snap.state.config
    if state.command:  # the user's own script: what ran is the command, not a preset
        command = " ".join(state.command)
        what = ("  script ", "dim"), (command if len(command) <= 70 else command[:67] + "…", "bold")
    else:
        what = ("  preset ", "dim"), (str(cfg.get("preset", "?")), "bold")
    return Text.assemble(
        ("● ", status_text(state.status).style), status_text(state.status),
        f" {fmt_duration(state.elapsed(snap.now))}  ",
        ("run ", "dim"), (state.run_id, "bold"),
        *what,
    )


def _setup(snap: Snapshot) -> Text:
    """World, backend, model, step and the DDP settings in effect."""
    state, cfg = snap.state, snap.state.config
    backend = _hello_field(state, "backend") or str(cfg.get("backend", "?"))
    model = _hello_field(state, "model") or str(cfg.get("model", "?"))
    steps = cfg.get("steps", 0)
    return Text.assemble(
        ("world ", "dim"), str(state.world_size),
        (f" on {state.nnodes} nodes" if state.nnodes > 1 else "", "dim"),
        ("  backend ", "dim"), backend,
        ("  model ", "dim"), model,
        ("  step ", "dim"), f"{max(state.current_step + 1, 0)}" + (f"/{steps}" if steps else ""),
        ("  hook ", "dim"), (_hello_field(state, "comm_hook") or "?") if state.command else hook_text(cfg),
        *(script_ddp_text(state) if state.command else ()),
    )


def _rates(snap: Snapshot) -> Text:
    """Throughput, the slowest rank, comm share, warm-up, and why the run ended."""
    state = snap.state
    line = Text()
    if state.status == "starting" and state.error:
        pass  # not started as far as this view knows, and the error says why (a supervisor not answering)
    elif state.status == "starting":
        connected = sum(1 for rs in state.ranks.values() if rs.hello is not None)
        line.append(f"waiting for ranks: {connected}/{state.world_size} connected", style="italic")
    else:
        line.append_text(Text.assemble(
            ("steps/s ", "dim"), (fmt(snap.steps_per_s, ".2f"), "bold"),
            ("  samples/s ", "dim"), (fmt(snap.samples_per_s, ".1f"), "bold"),
        ))
        slow = snap.slowest
        if slow is not None and state.world_size > 1:
            line.append("  slowest ", style="dim")
            line.append(f"rank {slow}", style=SLOW_STYLE)
    _append_comm(line, snap.comm)
    if snap.warming_up:
        line.append("  " + warm_up_text(state.config), style="bold #c79100")
    if state.error:
        # Why it ended goes first: the end of a long line is what a narrow terminal cuts.
        failed = f"rank {state.failed_rank}: " if state.failed_rank is not None else ""
        line = Text(failed + state.error + "  ", style="bold #d7503c").append_text(line)
    if state.total_dropped:
        line.append(f"  dropped frames {state.total_dropped}", style="#c79100")
    return line


def _append_comm(line: Text, comm: tuple[float | None, float | None] | None) -> None:
    if comm is None:
        return
    total, exposed = comm
    if total is None:
        line.append("  exposed comm ", style="dim")
        line.append(f"{exposed or 0.0:.0%}", style="bold")
        line.append(" of step (total: nccl_timing)", style="dim")
    else:
        line.append("  comm ", style="dim")
        line.append(f"{total:.0%}", style="bold")
        line.append(" of step, exposed ", style="dim")
        line.append(f"{exposed or 0.0:.0%}", style="bold")
