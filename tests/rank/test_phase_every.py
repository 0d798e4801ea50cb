"""`--set phase_every=K`: the rank-side layer engaged one step in K (ddptop.rank.phase_every), its
schedule, the settings it refuses, and a real 2-rank run on gloo sending every Kth step."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from ddptop.model.config import ConfigError, RunConfig, validate
from ddptop.rank.phase_every import FULL_STEPS, MAX_GAP_S, MAX_K, SPACING_S, PhaseEvery

SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"


def test_every_kth_step_is_engaged_and_every_step_while_a_capture_is_asked_for_or_runs() -> None:
    four = PhaseEvery({"phase_every": 4})
    assert four.on and not PhaseEvery({"phase_every": 1}).on
    assert [s for s in range(12) if four.engaged_after(s, None, [])] == [3, 7, 11]
    idle = SimpleNamespace(scheduled=[], active=None, warming=None)
    assert not four.engaged_after(0, idle, [])
    assert four.engaged_after(0, idle, ["a capture command waits"])
    for busy in (SimpleNamespace(scheduled=[], active="w", warming=None),
                 SimpleNamespace(scheduled=[], active=None, warming="w")):
        assert four.engaged_after(0, busy, [])
    # a window asked for at step 100: the steps from 98 on (98's close begins the profiler's warm-up
    # step 99), not every step from when it was asked for (session 17: a `--capture 100:3` run timed
    # its first 104 steps)
    later = SimpleNamespace(scheduled=[SimpleNamespace(start=100)], active=None, warming=None)
    assert [s + 1 for s in range(40, 100) if four.engaged_after(s, later, [])] == [*range(44, 97, 4), 98, 99, 100]


def _auto(step_s: float, steps: int) -> tuple[list[int], list[int]]:
    """The steps auto engages over `steps` steps of `step_s` seconds each, and the K it said."""
    now = [0.0]
    said: list[int] = []
    auto = PhaseEvery({}, said.append, clock=lambda: now[0])
    engaged = [0]
    for step in range(steps - 1):
        now[0] += step_s
        if auto.engaged_after(step, None, []):
            engaged.append(step + 1)
    return engaged, said


@pytest.mark.parametrize(("step_s", "k"), [(0.035, 8), (0.09, 4), (0.01, 32), (0.3, 1), (0.001, MAX_K)])
def test_auto_times_every_step_at_first_then_steps_a_quarter_second_apart_by_a_power_of_two(step_s: float,
                                                                                          k: int) -> None:
    """The default (phase_every=0): every step for the first FULL_STEPS, then one in K, K the
    smallest power of two putting timed steps SPACING_S apart: the char GPT's 35 ms step one in 8."""
    assert PhaseEvery({}).on and PhaseEvery({"phase_every": 0}).auto
    engaged, said = _auto(step_s, FULL_STEPS + 8 * MAX_K)
    assert engaged[:FULL_STEPS] == list(range(FULL_STEPS))
    later = [s for s in engaged if s >= FULL_STEPS]
    assert later and all(s % k == 0 for s in later) and len(later) == len(range(FULL_STEPS, FULL_STEPS + 8 * MAX_K, k))
    assert said == ([] if k == 1 else [k])  # said once, when it changes
    assert k * step_s >= SPACING_S or k == MAX_K


def test_when_steps_slow_down_a_step_is_still_timed_every_second_and_k_is_chosen_again() -> None:
    """A 35 ms step timed one in 8; then each step takes 0.6 s: without the gap rule one step in 8
    would be 4.8 s apart (one in 64, 38 s: longer than the stall rule's 10 s)."""
    now = [0.0]
    said: list[int] = []
    auto = PhaseEvery({}, said.append, clock=lambda: now[0])
    engaged = []
    for step in range(130):
        now[0] += 0.035 if step < 100 else 0.6
        if auto.engaged_after(step, None, []):
            engaged.append((step + 1, now[0]))
    assert said[0] == 8
    slow = [at for s, at in engaged if s > 101]
    assert slow and all(b - a <= MAX_GAP_S + 0.6 for a, b in zip(slow, slow[1:]))
    assert said[-1] == 1  # the median has moved: every step timed again


def test_ranks_with_different_k_still_share_timed_steps() -> None:
    """Each rank picks its own K from its own host time; powers of two keep the larger K's steps common."""
    fast, said_fast = _auto(0.030, 400)  # K = 16
    slow, said_slow = _auto(0.070, 400)  # K = 4
    assert (said_fast, said_slow) == ([16], [4])
    later = {s for s in fast if s >= FULL_STEPS}
    assert later and later <= set(slow)  # every step the larger K times, the smaller times too


def test_the_timed_step_of_comm_falls_on_a_timed_step() -> None:
    from ddptop.rank.ddp_comm import DdpComm

    comm = DdpComm.__new__(DdpComm)
    comm.every = comm._every = 10
    for k, every in ((8, 8), (4, 8), (2, 10), (32, 32), (1, 10)):
        comm.sampled(k)
        assert comm.every == every and comm.every % k == 0


@pytest.mark.parametrize(("changes", "said"), [({"phase_every": -1}, "phase_every must be 0"),
                                               ({"phase_every": 4, "cost_ab": 0.001}, "above 1 not with cost_ab")])
def test_settings_that_cannot_work_are_refused(changes: dict, said: str) -> None:
    with pytest.raises(ConfigError, match=said):
        validate(RunConfig(**changes))
    validate(RunConfig(phase_every=0, cost_ab=0.001))  # auto beside the in-run A/B: cost_ab switches the layer


@pytest.mark.e2e
def test_a_real_run_sends_every_kth_step_with_its_phases(tmp_path: Path) -> None:
    cmd = [sys.executable, "-m", "ddptop", "--headless", "--json", "--nproc", "2", "--runs-dir", str(tmp_path),
           "--set", "phase_every=4", "--", sys.executable, str(SCRIPTS / "plain_ddp.py"), "--steps", "40"]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=180)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    summary = json.loads(res.stdout.strip().splitlines()[-1])
    assert summary["status"] == "completed"
    records = [json.loads(line) for line in next(tmp_path.glob("*/steps.jsonl")).read_text().splitlines()]
    for rank in (0, 1):
        steps = [r["step"] for r in records if r["rank"] == rank]
        assert steps == list(range(0, 40, 4)), steps  # the same steps on every rank
        assert all(r["forward_ms"] > 0 and r["step_ms"] > 0 for r in records if r["rank"] == rank)
    assert [r["last_step"] for r in summary["ranks"]] == [36, 36] and summary["steps_per_s"] > 0


@pytest.mark.e2e
def test_by_default_a_real_run_times_every_step_at_first_then_one_in_k(tmp_path: Path) -> None:
    """The default on gloo: steps 0-49 each sent, then the multiples of K, the same on both ranks;
    each rank says its K (a fact), and the final table says the steps were sampled."""
    cmd = [sys.executable, "-m", "ddptop", "--headless", "--json", "--nproc", "2", "--runs-dir", str(tmp_path),
           "--", sys.executable, str(SCRIPTS / "plain_ddp.py"), "--steps", "150"]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=240)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    summary = json.loads(res.stdout.strip().splitlines()[-1])
    ks = [r["info"].get("phase_every") for r in summary["ranks"]]
    assert all(isinstance(k, int) and k > 1 and k & (k - 1) == 0 for k in ks), ks
    records = [json.loads(line) for line in next(tmp_path.glob("*/steps.jsonl")).read_text().splitlines()]
    sent = {rank: [r["step"] for r in records if r["rank"] == rank] for rank in (0, 1)}
    later = {}
    for rank in (0, 1):  # K is chosen every 50 steps from the rank's own pace: it may differ by rank and window
        assert sent[rank][:FULL_STEPS] == list(range(FULL_STEPS))
        later[rank] = sent[rank][FULL_STEPS:]
        assert later[rank] and all(s % 2 == 0 for s in later[rank]) and len(later[rank]) <= 50, later[rank]
    assert set(later[0]) & set(later[1])  # powers of two: the larger K's steps are timed on both
    for rank in (0, 1):  # each record carries the steps since the one before it: the job's pace
        mine = [r for r in records if r["rank"] == rank]
        for before, rec in zip(mine, mine[1:]):  # a span where steps went untimed since the last record
            if rec["step"] - before["step"] > 1:
                assert rec["span_steps"] == rec["step"] - before["step"] and rec["span_ms"] > 0, rec
            else:
                assert "span_steps" not in rec, rec
    assert f"one step in {max(ks)} timed (phase_every)" in " ".join(res.stdout.split())
    assert summary["steps_per_s"] > 0 and all(r["last_step"] >= 128 for r in summary["ranks"])
    assert [r["steps"] for r in summary["ranks"]] == [150, 150]  # every step counted, timed or not
    assert [r["timed_steps"] for r in summary["ranks"]] == [len(sent[0]), len(sent[1])]


def test_memory_is_sampled_on_timed_steps_whatever_k() -> None:
    """Memory was sampled on multiples of 10 only: with one step in 64 timed that was one in 320."""
    from ddptop.rank.memory import MEMORY_EVERY, MemorySampler

    sampler = MemorySampler()
    sampler._often.seconds = 0.0
    taken = [s for s in range(0, 640, 64) if sampler.due(s)]
    assert taken == list(range(0, 640, 64))
    sampler = MemorySampler()
    sampler._often.seconds = 0.0
    assert [s for s in range(40) if sampler.due(s)] == list(range(0, 40, MEMORY_EVERY))


@pytest.mark.e2e
def test_a_capture_after_the_first_50_steps_times_each_of_its_steps(tmp_path: Path) -> None:
    """Sampling must not thin a capture: the window's steps are timed on every rank, and the trace
    is written, though the steps around it are one in K."""
    cmd = [sys.executable, "-m", "ddptop", "--headless", "--json", "--nproc", "2", "--runs-dir", str(tmp_path),
           "--capture", "90:3", "--", sys.executable, str(SCRIPTS / "plain_ddp.py"), "--steps", "130"]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=240)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    summary = json.loads(res.stdout.strip().splitlines()[-1])
    cap = summary["captures"][0]
    assert cap["status"] == "done" and sorted(int(r) for r in cap["files"]) == [0, 1], cap
    records = [json.loads(line) for line in next(tmp_path.glob("*/steps.jsonl")).read_text().splitlines()]
    for rank in (0, 1):
        sent = {r["step"] for r in records if r["rank"] == rank}
        assert {88, 89, 90, 91, 92} <= sent, sorted(sent)  # the profiler's warm-up step 89 and the one before
        assert len([s for s in sent if FULL_STEPS <= s < 88]) < 20, sorted(sent)  # sampled before it too


def test_the_final_table_says_what_was_sampled_and_believes_no_wild_k() -> None:
    from ddptop.model.rank_state import timed_every
    from ddptop.model.report import ranks_table

    def rank(info: dict) -> dict:
        return {"rank": 0, "host": "h", "device": "d", "steps": 100, "timed_steps": 10, "last_step": 96, "step_ms_p50": 1.0,
                "step_ms_p95": 2.0, "phases_ms": dict.fromkeys(("data", "forward", "backward", "optimizer"), 1.0),
                "samples_per_s": 1.0, "status": "done", "info": info, "last50": {"p50_ms": 1.0}}

    sampled = ranks_table({"ranks": [rank({"phase_every": 8})]})
    assert "last 50 timed steps each" in sampled and "one step in 8 timed (phase_every)" in sampled
    assert "10 of 100" in sampled  # timed of run
    for wild in ({"phase_every": 10**9}, {"phase_every": "8"}, {"phase_every": True}, {}, {"phase_every": 1}):
        assert timed_every([wild]) == 1
        plain = ranks_table({"ranks": [rank(wild)]})
        assert "timed" not in plain and "10 of" not in plain and "100" in plain


def test_pace_gives_each_timed_step_the_steps_since_the_last_and_their_host_time() -> None:
    now = [0.0]
    four = PhaseEvery({"phase_every": 4}, clock=lambda: now[0])
    paces = {}
    for step in range(12):
        now[0] += 0.010
        if four.engaged_after(step, None, []):
            paces[step + 1] = four.pace()
    assert paces[4] == {}  # the first: nothing before it to measure from
    assert paces[8] == {"span_steps": 4.0, "span_ms": pytest.approx(40.0)}
    assert paces[12] == {"span_steps": 4.0, "span_ms": pytest.approx(40.0)}


def test_steps_per_s_is_the_jobs_pace_where_one_step_in_k_is_timed() -> None:
    """A timed step pays the hooks (27 ms), the others do not (25 ms): the rate is the spans' 8 steps
    in 202 ms, not 1000 / 27; samples a second: a timed step's samples at that pace."""
    from ddptop.model import figures
    from ddptop.model.rank_state import RankState

    rs = RankState(rank=0)
    for i in range(10):
        rs.add({"step": 8 * i, "step_ms": 27.0, "samples": 64.0, "span_steps": 8.0, "span_ms": 202.0}, 0, 0.0)
    assert figures.rank_steps_per_s_run(rs) == pytest.approx(8 / 0.202)
    assert figures.rank_samples_per_s_run(rs) == pytest.approx(64 * 8 / 0.202)
    every = RankState(rank=0)  # every step timed: as before, the records over their time
    for i in range(10):
        every.add({"step": i, "step_ms": 25.0, "samples": 64.0}, 0, 0.0)
    assert figures.rank_steps_per_s_run(every) == pytest.approx(40.0)
    assert figures.rank_samples_per_s_run(every) == pytest.approx(64 * 40.0)


def test_the_live_pace_is_the_spans_too_once_every_record_in_the_window_carries_one() -> None:
    """The header's steps/s now: 1000 / the slowest rank's p50 of timed steps (27 ms, paying the
    hooks) would read the job 7% slow; over the window's spans it reads the 25.25 ms a step it runs."""
    from ddptop.model import figures
    from ddptop.model.figures.window import WINDOW, RankWindow
    from ddptop.model.rank_state import RankState

    ranks = {}
    for rank in (0, 1):
        rs = ranks[rank] = RankState(rank=rank)
        rs.add({"step": 0, "step_ms": 27.0, "samples": 64.0}, 0, 0.0)  # the first: no span before it
        for i in range(1, WINDOW + 1):
            rs.add({"step": 8 * i, "step_ms": 27.0, "samples": 64.0, "span_steps": 8.0, "span_ms": 202.0}, 0, 0.0)
    figs = {r: RankWindow().update(rs) for r, rs in ranks.items()}
    assert figs[0].pace_ms == pytest.approx(25.25) and figs[0].p50 == 27.0
    assert figures.job_steps_per_s_last50(figs) == pytest.approx(1000 / 25.25)
    assert figs[0].samples_per_s_last50 == pytest.approx(64 * 1000 / 25.25)
    short = RankState(rank=0)  # a record without a span still in the window: the p50 as before
    for i in range(10):
        short.add({"step": i, "step_ms": 25.0, **({"span_steps": 1.0, "span_ms": 20.0} if i else {})}, 0, 0.0)
    fig = RankWindow().update(short)
    assert fig.pace_ms is None and figures.job_steps_per_s_last50({0: fig}) == pytest.approx(40.0)


def test_a_rank_s_steps_are_the_steps_it_ran_not_its_records() -> None:
    """One step in K timed: 57 records of 150 steps. The rank table, the node rows and the summary
    say the steps it ran (its last record's step + 1 while it runs, what it said at its end), not
    how many records came (session 17: the rank table lagged the summary)."""
    from ddptop.model.run_summary import rank_summary
    from ddptop.model.state import RunState
    from ddptop.wire.protocol import Steps

    state = RunState(run_id="k", config=RunConfig(), world_size=1)
    steps = [*range(50), 63, 127]
    state.apply(Steps(0, [{"step": s, "t": 100.0 + s / 100, "step_ms": 10.0} for s in steps]), 102.0)
    rs = state.ranks[0]
    assert rs.steps == 52 and rs.steps_run() == 128 and rank_summary(rs, 1)["steps"] == 128
    rs.info["steps_run"] = 150  # said at its end
    assert rs.steps_run() == 150 and rank_summary(rs, 1)["steps"] == 150
    rs.info["steps_run"] = 9  # fewer than its records show: not believed
    assert rs.steps_run() == 128


def test_in_lockstep_turns_the_pace_is_the_job_s_own(monkeypatch: pytest.MonkeyPatch) -> None:
    """`ddptop cost --lockstep`: a rank waits for its turn (the other job's step) at each step's end;
    K and the spans must not count that wait, or the ddptop arm times more steps than the job alone
    would (session 17: K = 4 in turns, 16 alone). The stamp keeps the waits; the clock leaves them out."""
    import importlib.util
    import threading
    import time
    import types

    from ddptop.rank import phase_every

    spec = importlib.util.spec_from_file_location(
        "_stamp_under_test", Path(phase_every.__file__).parent / "stamp" / "sitecustomize.py")
    stamp = importlib.util.module_from_spec(spec)
    monkeypatch.delenv("DDPTOP_STAMP", raising=False)
    spec.loader.exec_module(stamp)  # no DDPTOP_STAMP: it stamps nothing
    assert stamp.TURN_WAIT_MODULE == phase_every.TURN_WAIT_MODULE
    monkeypatch.delitem(sys.modules, phase_every.TURN_WAIT_MODULE, raising=False)
    mine_r, mine_w = os.pipe()
    theirs_r, theirs_w = os.pipe()
    turns = stamp._Turns(mine_r, theirs_w, "a", wait_s=5.0)
    threading.Timer(0.2, os.write, (mine_w, b"t")).start()  # the other job's step takes 0.2 s
    before_host, before = time.perf_counter(), phase_every.working_clock()
    turns.hand_over_and_wait()
    host, working = time.perf_counter() - before_host, phase_every.working_clock() - before
    assert os.read(theirs_r, 1) == b"t" and turns.starts  # handed over, got it back
    assert host >= 0.2 and working < 0.05, (host, working)
    assert sys.modules[phase_every.TURN_WAIT_MODULE].total_s >= 0.2
    monkeypatch.setitem(sys.modules, phase_every.TURN_WAIT_MODULE, types.ModuleType("x"))  # no total_s: as alone
    assert abs(phase_every.working_clock() - time.perf_counter()) < 0.01
    for fd in (mine_r, mine_w, theirs_r, theirs_w):
        os.close(fd)
