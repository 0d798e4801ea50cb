"""RunAlerts: what needs the user's eye now, under the header on every view: a loud
STALLED line while no rank makes progress (seconds since, suspects, where stacks
went), the straggler verdict and the run's notes; in a row left over, the calm verdict ("no
straggler (largest: rank 1 +0.6 ms, 2%; the rule sees >= 2.0 ms here)", or "host CPU
contended: ..."). Its rows are always there, empty when there is
nothing to say, so a verdict that comes and goes does not move the views."""

from __future__ import annotations

from pathlib import Path

from rich.text import Text
from textual.widgets import Static

from ddptop.tui.live import Snapshot

STALL_STYLE = "bold #ffffff on #b03a2e"
STRAGGLER_STYLE = "bold #d7503c"
CALM_STYLE = "dim"
ALERT_ROWS = 2  # the slot's height (app.tcss says the same): what does not fit is counted


def _stacks_text(stacks: dict[int, str]) -> str:
    if not stacks:
        return "collecting stacks…"
    files = [p for p in stacks.values() if not p.startswith("(")]
    dirs = sorted({str(Path(p).parent) for p in files})
    unanswered = [r for r, p in sorted(stacks.items()) if p.startswith("(")]
    text = f"stacks in {', '.join(dirs)}" if dirs else "no stacks written"
    if unanswered:
        text += f" (no answer from rank {', '.join(map(str, unanswered))})"
    return text


def alert_lines(snap: Snapshot) -> list[Text]:
    lines = []
    stall = snap.stall
    if stall is not None:
        suspects = ", ".join(f"rank {r}" for r in stall.suspects) or "none named"
        steps = " ".join(f"r{r}:{s + 1}" for r, s in sorted(stall.last_steps.items()))
        lines.append(Text.assemble(
            (f" STALLED {snap.now - stall.since:.0f}s ", STALL_STYLE),
            (f" no rank finished a step (bound {stall.bound_s:.0f}s); suspects: ", "bold"),
            (suspects, STRAGGLER_STYLE),
            (f"  ({stall.cause})" if stall.cause else "", "italic"),
        ))
        lines.append(Text.assemble(("  last steps ", "dim"), steps,
                                   ("  " + _stacks_text(stall.stacks), "")))
    if snap.straggler is not None:  # the one wording every view shows (Snapshot.verdict_text)
        lines.append(Text("▲ " + snap.verdict_text, style=STRAGGLER_STYLE))
    for note in snap.state.notes[:2]:  # what the instrument cannot measure on this run
        lines.append(Text("ⓘ " + note, style="italic #c79100"))
    calm = snap.verdict_text if snap.straggler is None else ""
    if calm and len(lines) < ALERT_ROWS:  # not an alert: only where a row is free
        lines.append(Text("· " + calm, style=CALM_STYLE))
    return lines


def fit_rows(lines: list[Text], rows: int = ALERT_ROWS) -> list[Text]:
    """The first `rows` lines, the last one saying how many more did not fit."""
    if len(lines) <= rows:
        return lines
    last = lines[rows - 1].copy()
    last.append(f"  (+{len(lines) - rows} more)", style="dim")
    return [*lines[:rows - 1], last]


class RunAlerts(Static):
    """Call `show(snapshot)`; a fixed slot of ALERT_ROWS rows, blank when all is well."""

    _shown: Text | None = None

    def show(self, snap: Snapshot) -> None:
        text = Text("\n").join(fit_rows(alert_lines(snap)))
        if text == self._shown:
            return
        self._shown = text
        self.update(text)
