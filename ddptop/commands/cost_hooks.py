"""`ddptop cost`'s last run: the rank-side hooks' share on the user's own script, for the bill.

The bill's generic per-step figure for the hooks (bill.PER_STEP_HOOKS) came from other scripts on
another host; a script's own hook calls cost what its own loop makes them cost (session 15: the
char GPT at one rank paid +0.7 ms a step for them, the bill said +56 µs). So after the pairs one
more run of the ddptop arm measures them in-run (`ddptop --cost N`: the layer engaged and bypassed
step by step, with an A/A and a calibrated spin), and its `on` figure replaces the generic one in
the prediction. Must not import torch.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from ddptop.analysis import cost_pairs
from ddptop.commands.cost_plan import Plan, RunRecord
from ddptop.commands.cost_runs import run_one
from ddptop.model.bill import Figure

MARGIN = 20  # steps the in-run A/B leaves to the script's start: ddptop's warmup, its calibration
MIN_BLOCKS = 40  # fewer engaged/bypassed steps than this resolve nothing


@dataclass(frozen=True)
class HooksReading:
    """The in-run A/B's `on` arm: ms a step per rank, engaged minus bypassed (None: why not)."""

    figure: Figure | None  # us a step per rank, 95% interval: the hooks on every step
    steps: int = 0  # the steps it alternated
    verdict: str | None = None  # the run's own verdict (its A/A and spin checks)
    why: str | None = None
    timed: float = 1.0  # the share of its steps the measured arm timed (phase_every)

    @property
    def arm_figure(self) -> Figure | None:
        """What the hooks cost the measured arm a step: engaged on `timed` of its steps, bypassed
        (the in-run A/B's baseline) on the others."""
        fig, share = self.figure, self.timed
        return None if fig is None else Figure(fig.us * share, fig.lo * share, fig.hi * share)

    def as_dict(self) -> dict[str, Any]:
        fig = self.figure
        return {"us": fig.us if fig else None, "lo": fig.lo if fig else None, "hi": fig.hi if fig else None,
                "steps": self.steps, "verdict": self.verdict, "why": self.why, "timed": self.timed}


def steps_for(records: list[RunRecord]) -> tuple[int, str | None]:
    """How many steps the in-run A/B can alternate in one run of the script (from the ddptop
    arm's stamped steps), or 0 and why none."""
    counts = [min(len(s) for s in r.ranks.values()) for r in records
              if r.arm == cost_pairs.DDPTOP and r.rc == 0 and r.ranks]
    if not counts:
        return 0, "no run under ddptop completed with its steps stamped"
    n = int(statistics.median(counts)) - MARGIN
    if n < MIN_BLOCKS:
        return 0, (f"the script's {int(statistics.median(counts))} steps leave {max(n, 0)} to alternate "
                   f"(at least {MIN_BLOCKS}: give the script more steps)")
    return n, None


def reading(summary: dict[str, Any] | None, steps: int) -> HooksReading:
    """The `on` arm of a ddptop run's summary (`cost`), as us a step per rank."""
    cost = (summary or {}).get("cost") or {}
    on = next((a for a in cost.get("arms") or [] if isinstance(a, dict) and a.get("arm") == "on"), None)
    ms = on.get("ms_per_step") if on is not None else None
    if on is None or not isinstance(ms, dict) or not all(isinstance(ms.get(k), (int, float)) for k in ("median", "lo", "hi")):
        return HooksReading(None, steps, why="the run gave no engaged-vs-bypassed figure (too few steps measured)")
    return HooksReading(Figure(ms["median"] * 1000.0, ms["lo"] * 1000.0, ms["hi"] * 1000.0), steps,
                        verdict=on.get("verdict"))


def measure(records: list[RunRecord], plan: Plan, where: Path, env: dict[str, str], say: Any) -> HooksReading:
    """One more run of the ddptop arm with `--cost N`, alone (no turns), pinned as the others."""
    steps, why = steps_for(records)
    if plan.phase_every > 1:
        why = "the ddptop arm sets phase_every, which the in-run A/B cannot run beside (both switch the layer)"
    if why is not None:
        return HooksReading(None, why=why)
    say(f"  one more run under ddptop, `--cost {steps}`: the rank-side hooks' share on this script")
    run = replace(plan, ddptop_args=[*plan.ddptop_args, "--cost", str(steps)], lockstep=False)
    record = run_one(plan.pairs, cost_pairs.DDPTOP, run, where, env)
    got = reading(record.summary, steps)
    if got.figure is None and record.rc != 0:
        return replace(got, why=f"the run ended with rc={record.rc} (its records: {where})")
    shares = [r.timed for r in records if r.arm == cost_pairs.DDPTOP and r.rc == 0 and r.timed is not None]
    return replace(got, timed=statistics.median(shares)) if shares else got
