"""`ddptop cost`'s hooks run: how many steps it alternates, what it reads from the run's summary,
and the bill's prediction with the script's own hooks figure in place of the generic one."""

from __future__ import annotations

import re

import pytest

from ddptop.analysis import cost_pairs
from ddptop.commands.cost_hooks import MARGIN, MIN_BLOCKS, HooksReading, reading, steps_for
from ddptop.commands.cost_plan import RunRecord
from ddptop.model import bill


def _ours(steps: list[int], rc: int = 0) -> RunRecord:
    return RunRecord(0, cost_pairs.DDPTOP, rc, 1.0, {r: [float(i) for i in range(n)] for r, n in enumerate(steps)}, [],
                     None)


def test_the_hooks_run_alternates_the_scripts_steps_less_a_margin() -> None:
    plain = RunRecord(0, cost_pairs.PLAIN, 0, 1.0, {0: [0.0] * 500}, [], None)
    assert steps_for([plain, _ours([300, 298]), _ours([300, 300])]) == (299 - MARGIN, None)  # the slower rank
    n, why = steps_for([_ours([MARGIN + MIN_BLOCKS - 1])])
    assert n == 0 and why is not None and f"{MARGIN + MIN_BLOCKS - 1} steps" in why and "more steps" in why
    assert steps_for([plain, _ours([300], rc=1)])[1] == "no run under ddptop completed with its steps stamped"


def test_the_engaged_arm_is_read_from_the_runs_summary_in_us() -> None:
    on = {"arm": "on", "ms_per_step": {"median": 0.698, "lo": 0.236, "hi": 1.174, "n": 125}, "verdict": "v"}
    got = reading({"cost": {"arms": [{"arm": "aa", "ms_per_step": {"median": 9, "lo": 9, "hi": 9}}, on]}}, 480)
    assert got.figure == bill.Figure(pytest.approx(698.0), pytest.approx(236.0), pytest.approx(1174.0))
    assert got.steps == 480 and got.verdict == "v" and got.why is None
    for summary in (None, {}, {"cost": None}, {"cost": {"arms": [{"arm": "on", "ms_per_step": {"median": None}}]}}):
        missing = reading(summary, 480)
        assert missing.figure is None and missing.why is not None
    assert HooksReading(None, why="x").as_dict() == {"us": None, "lo": None, "hi": None, "steps": 0,
                                                     "verdict": None, "why": "x", "timed": 1.0}


def test_the_prediction_uses_the_scripts_own_hooks_figure() -> None:
    """Session 15: the char GPT at one rank paid +0.96 ms a step; the generic +56 us hooks figure
    predicted a tenth of it, the script's own in-run figure (+698 us) most of it."""
    own = bill.Figure(698.0, 236.0, 1174.0)
    mine = bill.predict(None, hooks=own)
    assert (mine.us, mine.lo, mine.hi) == (pytest.approx(698.0), pytest.approx(236.0), pytest.approx(1174.0))
    counted = bill.predict(3, hooks=own)  # three untimed all-reduces: 0 +-5 us each
    assert (counted.lo, counted.hi) == (pytest.approx(221.0), pytest.approx(1189.0))
    assert mine.hooks_measured and "measured on this script" in mine.text()
    generic = bill.predict(None)
    assert not generic.hooks_measured and generic.hooks == bill.PER_STEP_HOOKS and "from other scripts" in generic.text()


def test_no_hooks_run_beside_phase_every(tmp_path) -> None:
    """The arm's phase_every is read by ddptop's own parser: K > 1 refuses the hooks run (before any
    run starts), `phase_every=1` (the default, said out loud) does not."""
    from ddptop.commands.cost import parse
    from ddptop.commands.cost_hooks import measure

    plan, _ = parse(["--nproc", "1", "--ddptop-args", "--set phase_every=4", "--", "python", "x.py"])
    assert plan.phase_every == 4
    got = measure([_ours([300])], plan, tmp_path, {}, lambda _line: None)
    assert got.figure is None and "phase_every" in (got.why or "")
    default, _ = parse(["--nproc", "1", "--ddptop-args", "--set phase_every=1 --set comm_timing=false", "--", "x"])
    assert default.phase_every == 1
    assert measure([_ours([30])], default, tmp_path, {}, lambda _line: None).why == (
        f"the script's 30 steps leave 10 to alternate (at least {MIN_BLOCKS}: give the script more steps)")


@pytest.mark.parametrize(("ddptop_args", "said"), [
    ("--set phase_evry=4", "--ddptop-args: unknown setting 'phase_evry'"),
    ("--bogus", "--ddptop-args: unrecognized arguments: --bogus"),
    ("--set phase_every=-1", "--ddptop-args: phase_every must be 0 (auto) or more"),
    ("--nproc 3", "--ddptop-args: the ranks and the job are cost's own"),
])
def test_a_mistake_in_the_ddptop_arms_args_is_a_usage_error_before_any_run(ddptop_args: str, said: str) -> None:
    from ddptop.commands.cost import parse
    from ddptop.model.usage import UsageError

    with pytest.raises(UsageError, match="^" + re.escape(said)):
        parse(["--nproc", "1", f"--ddptop-args={ddptop_args}", "--", "python", "x.py"])
