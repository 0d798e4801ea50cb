"""`ddptop cost`'s pure parts: the ABBA schedule and its A/A pairs, a run's step time from its
stamps, the paired interval and verdict, the stderr comparison, the CPU lists, the bill."""

from __future__ import annotations

import math

import pytest

from ddptop.analysis import cost_pairs as cp
from ddptop.commands.cost_plan import cpu_lists
from ddptop.model import bill
from ddptop.model.figures.stats import t975
from ddptop.model.usage import UsageError


def test_schedule_is_abba_and_aa_pairs_are_adjacent_plain_runs() -> None:
    order = cp.schedule(4)
    assert [a for _, a in order] == ["plain", "ddptop", "ddptop", "plain", "plain", "ddptop", "ddptop", "plain"]
    runs = cp.schedule(6)
    for a, b in cp.aa_pairs(6):
        assert runs.index((b, "plain")) == runs.index((a, "plain")) + 1  # side by side
    assert cp.aa_pairs(6) == [(1, 2), (3, 4)] and cp.aa_pairs(4) == [(1, 2)] and cp.aa_pairs(2) == []


def test_step_ms_skips_warmup_and_needs_steps() -> None:
    stamps = [0.0, 1.0] + [1.0 + 0.01 * i for i in range(1, 11)]  # a slow first step, then 10 ms steps
    assert cp.step_ms(stamps, 2) == pytest.approx(10.0)
    assert cp.step_ms(stamps[:6], 2) is None
    assert cp.skip_for(100, None) == 20 and cp.skip_for(10, None) == 5 and cp.skip_for(100, 3) == 3
    assert cp.run_step_ms({0: stamps, 1: stamps}, 2) == pytest.approx(10.0)
    assert cp.run_step_ms({0: stamps, 1: stamps[:3]}, 2) is None  # a rank not measured: the run is not


def _turns(step_s: float, wait_s: float, steps: int, t0: float) -> tuple[list[float], list[float]]:
    """A rank that takes `steps` turns: each step ends step_s after its turn came back, and the
    turn comes back wait_s after the step's end (the other job's step)."""
    stamps, starts, t = [], [], t0
    for _ in range(steps):
        t += step_s
        stamps.append(t)
        t += wait_s
        starts.append(t)
    return stamps, starts


def test_a_step_in_turn_runs_from_its_turn_to_its_end_not_over_the_other_jobs_turn() -> None:
    stamps, starts = _turns(0.010, 0.030, 12, 0.0)
    assert cp.turn_ms(stamps, starts) == pytest.approx([10.0] * 11)  # the 30 ms waits are not in it
    assert cp.turn_ms(stamps, starts[:4]) == pytest.approx([10.0] * 4)  # turns ended: later steps are not in turn
    plain = {0: _turns(0.010, 0.011, 40, 0.0), 1: _turns(0.010, 0.011, 40, 0.0)}
    ours = {0: _turns(0.011, 0.010, 40, 0.005), 1: _turns(0.011, 0.010, 40, 0.005)}
    assert cp.round_ms(plain, ours, None) == pytest.approx((10.0, 11.0))


def test_a_round_compares_the_same_step_numbers_and_needs_every_rank() -> None:
    slow_late = _turns(0.010, 0.0, 40, 0.0)
    slow_late = (slow_late[0][:30] + [t + 0.5 * i for i, t in enumerate(slow_late[0][30:], 1)], slow_late[1])
    short = _turns(0.010, 0.0, 30, 0.0)  # its turns ended at step 30 (the other job left)
    # the first job's slow steps after 30 fall outside the steps both took in turn
    assert cp.round_ms({0: slow_late}, {0: short}, 5) == pytest.approx((10.0, 10.0))
    assert cp.round_ms({0: short}, {1: short}, 5) is None  # not the same ranks
    assert cp.round_ms({}, {}, 5) is None
    assert cp.round_ms({0: _turns(0.01, 0.0, 8, 0.0)}, {0: _turns(0.01, 0.0, 8, 0.0)}, 5) is None  # under 5 steps


def test_lockstep_schedule_alternates_who_goes_first_with_an_aa_round_after_every_second() -> None:
    order = cp.lockstep_schedule(4)
    assert order == [(0, "plain", "ddptop"), (1, "ddptop", "plain"), (1, "plain", "plain-again"),
                     (2, "plain", "ddptop"), (3, "ddptop", "plain"), (3, "plain-again", "plain")]
    ab = [r for r in cp.lockstep_schedule(10) if cp.AGAIN not in r[1:]]
    assert len(ab) == 10 and sum(r[1] == "plain" for r in ab) == 5  # each arm first in half the rounds
    assert len(cp.lockstep_schedule(10)) - len(ab) == 5


def test_interval_ratio_and_verdicts() -> None:
    ms = {}
    for i in range(10):  # ddptop 2% slower, with 0.2% noise
        ms[(i, "plain")] = 100.0 + (0.2 if i % 2 else -0.2)
        ms[(i, "ddptop")] = 102.0
    r = cp.analyse(ms, 10)
    assert r is not None and r.pairs_used == 10
    assert r.ratio.mean == pytest.approx(100 / 102, rel=1e-3) and r.ratio.lo < r.ratio.mean < r.ratio.hi
    assert r.extra_ms.mean == pytest.approx(2.0)
    assert r.aa is not None and r.aa.n == 4
    assert cp.verdict(r).startswith("NOT within 1%")
    same = {k: (100.0 if k[1] == "plain" else 100.1) for k in ms}
    assert cp.verdict(cp.analyse(same, 10)).startswith("within 1%")
    noisy = {k: v * (1.1 if k[0] % 3 == 0 and k[1] == "plain" else 1.0) for k, v in same.items()}
    assert "wide" in cp.verdict(cp.analyse(noisy, 10)) or "not shown" in cp.verdict(cp.analyse(noisy, 10))
    ms[(3, "ddptop")] = None  # a failed run leaves its pair out
    assert cp.analyse(ms, 10).pairs_used == 9
    assert cp.analyse({}, 3) is None
    assert t975(9) == 2.262 and t975(29) == 2.045 and t975(100) == 2.042  # past 30: 30's, errs wide
    assert math.isclose(cp.ratio_interval([1.0, 1.0]).mean, 1.0)


def test_added_lines_mask_numbers_and_keep_ddptops_own() -> None:
    plain = ["[W1127 06:32:40.712000 4292 run.py:1] warn port 29500", "loss 2.31"]
    ours = ["[W1127 07:00:00.100000 5555 run.py:1] warn port 41234", "loss 2.30",
            "Warning: ProcessGroupNCCL OnCompletion hook will be deprecated", ""]
    assert cp.added_lines(plain, ours) == ["Warning: ProcessGroupNCCL OnCompletion hook will be deprecated"]


def test_cpu_lists() -> None:
    assert cpu_lists("auto", 2, available=list(range(8))) == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert cpu_lists("auto", 4, available=[0, 1]) == []  # fewer CPUs than ranks: no pinning
    assert cpu_lists("none", 2) == []
    assert cpu_lists("0-1,4;2-3", 2) == [[0, 1, 4], [2, 3]]
    for bad in ("0-3", "a-b;c", "0;;1"):
        with pytest.raises(UsageError):
            cpu_lists(bad, 2)


def test_bill_prediction_adds_hooks_and_all_reduces() -> None:
    none = bill.predict(0)
    assert none.us == bill.PER_STEP_HOOKS.us
    one = bill.predict(1, every=10, nccl_timing=True)
    assert one.us == pytest.approx(56.0 + 0.9 * 16.6 + 0.1 * 21.7)
    assert one.lo < one.us < one.hi
    assert "per kernel launch" in bill.predict(14).text()


def test_bill_prediction_follows_the_runs_nccl_timing() -> None:
    """The default (nccl_timing off) puts no timed all-reduce on the bill; with it on the
    prediction names what no micro-benchmark shows (the ViT-L demo's +1.2 ms a step)."""
    default = bill.predict(None)
    assert default.us == bill.PER_STEP_HOOKS.us and "all-reduces not counted" in default.text()
    assert bill.predict(3).us == pytest.approx(bill.PER_STEP_HOOKS.us)  # untimed: 0 +-5 us each
    assert bill.predict(3).lo < bill.PER_STEP_HOOKS.lo
    timed = bill.predict(3, nccl_timing=True)
    assert timed.us > bill.PER_STEP_HOOKS.us + 3 * 15 and "ViT-L demo: +1234 us" in timed.text()
    assert "ViT-L" not in default.text()


def test_hardware_interval_from_the_environment() -> None:
    """DDPTOP_HARDWARE_S: how often the monitor samples NVML (0: never), so that `ddptop cost
    --ddptop-args` can tell what sampling costs a job (issue 42's open ViT question)."""
    from ddptop.run.watchdog import HARDWARE_S, hardware_interval

    assert hardware_interval(None) == (HARDWARE_S, "") and hardware_interval(" ") == (HARDWARE_S, "")
    assert hardware_interval("0") == (0.0, "") and hardware_interval("2.5") == (2.5, "")
    for bad in ("x", "-1", "0.01", "nan", "1e9"):
        every, said = hardware_interval(bad)
        assert every == HARDWARE_S and said.startswith("DDPTOP_HARDWARE_S=")
