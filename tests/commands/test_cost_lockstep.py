"""`ddptop cost --lockstep`: both arms at once, taking turns at every optimizer step. On gloo,
end to end: the two jobs' steps of one rank alternate in time (the turns really hold), every
round is measured, the A/A round runs plain beside plain, and an interrupt keeps the rounds
that ended."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ddptop.analysis import cost_pairs
from ddptop.commands import cost_lockstep
from ddptop.commands.cost_plan import Plan, RunRecord

SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"


def _events(run_dir: Path, rank: int, job: str) -> list[tuple[float, str, str]]:
    data = json.loads((run_dir / f"stamp.rank{rank}.json").read_text())
    return [(t, job, "end") for t in data["stamps"]] + [(t, job, "turn") for t in data["starts"]]


@pytest.mark.e2e
def test_lockstep_rounds_take_turns_step_by_step_on_real_ranks(tmp_path: Path) -> None:
    cmd = [sys.executable, "-m", "ddptop", "cost", "--lockstep", "--pairs", "2", "--nproc", "2", "--json",
           "--runs-dir", str(tmp_path / "runs"), "--", sys.executable, str(SCRIPTS / "plain_ddp.py"), "--steps", "20"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=240)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    data = json.loads(out.stdout.strip().splitlines()[-1])
    assert data["lockstep"] is True and data["result"]["pairs_used"] == 2
    assert len(data["aa_rounds"]) == 1 and all(ms > 0 for ms in data["aa_rounds"][0])  # plain beside plain
    assert data["plain"]["measured"] == 2 and data["ddptop"]["measured"] == 2 and data["stderr_added"] == []
    assert "A/A, plain / plain beside each other in turns" in out.stdout
    where = Path(data["dir"])
    assert sorted(p.name for p in where.glob("*-turns")) == [
        "00-lock-plain-ddptop-turns", "01-lock-ddptop-plain-turns", "01-lock-plain-plain-again-turns"]
    for rank in (0, 1):
        events = sorted(_events(where / "00-lock-plain-ddptop-a", rank, "a")
                        + _events(where / "00-lock-plain-ddptop-b", rank, "b"))
        steps = [job for _, job, what in events if what == "end"][2:]  # after both jobs' first steps
        assert len(steps) >= 30
        assert all(x != y for x, y in zip(steps, steps[1:])), steps  # a, b, a, b: one step at a time
        # each step's turn came back only after the other job's step ended
        for (_, job, what), (_, nxt_job, nxt_what) in zip(events[4:], events[5:]):
            if what == "end" and nxt_what == "turn":
                assert nxt_job != job


def test_an_interrupt_keeps_the_rounds_that_ended(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    done: list[int] = []

    def run_round(i: int, arms: tuple[str, str], plan: Plan, where: Path, env: dict[str, str]):
        if done:
            raise KeyboardInterrupt
        done.append(i)
        return (RunRecord(i, arms[0], 0, 1.0, {}, [], None, step_ms=10.0),
                RunRecord(i, arms[1], 0, 1.0, {}, [], None, step_ms=10.1))

    monkeypatch.setattr(cost_lockstep, "run_round", run_round)
    plan = Plan(cmd=["x"], nproc=1, pairs=4, warmup=None, cpus=[], timeout=10.0, ddptop_args=[], config=None,
                lockstep=True)
    records: list[RunRecord] = []
    aa: list[tuple[float, float]] = []
    with pytest.raises(KeyboardInterrupt):
        cost_lockstep.run_all(plan, tmp_path, {}, lambda _line: None, records, aa)
    assert [(r.pair, r.arm) for r in records] == [(0, cost_pairs.PLAIN), (0, cost_pairs.DDPTOP)]


def test_the_aa_is_plain_over_plain_again_whoever_went_first(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    # the job that goes first pays for it (session 17: ~1.6% on the char GPT); the A/A must take
    # its ratio by arm, as the plain / ddptop rounds do, so that the order alternates in both
    def run_round(i: int, arms: tuple[str, str], plan: Plan, where: Path, env: dict[str, str]):
        return (RunRecord(i, arms[0], 0, 1.0, {}, [], None, step_ms=10.16),  # job a goes first
                RunRecord(i, arms[1], 0, 1.0, {}, [], None, step_ms=10.0))

    monkeypatch.setattr(cost_lockstep, "run_round", run_round)
    plan = Plan(cmd=["x"], nproc=1, pairs=4, warmup=None, cpus=[], timeout=10.0, ddptop_args=[], config=None,
                lockstep=True)
    aa: list[tuple[float, float]] = []
    cost_lockstep.run_all(plan, tmp_path, {}, lambda _line: None, [], aa)
    assert aa == [(10.16, 10.0), (10.0, 10.16)]  # plain first, then plain-again first
    assert cost_pairs.ratio_interval([p / q for p, q in aa]).mean == pytest.approx(1.0)


DIES = '''
import os, signal, sys
import torch, torch.distributed as dist
dist.init_process_group("gloo")
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(8, 8))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for step in range(40):
    model(torch.randn(4, 8)).sum().backward()
    opt.step()
    opt.zero_grad()
    if step == 5 and os.environ.get("DDPTOP_STAMP_JOB") == sys.argv[1]:
        os.kill(os.getpid(), signal.SIGKILL)  # no atexit: it never hands its turn over for good
dist.destroy_process_group()
'''


@pytest.mark.e2e
def test_a_job_killed_mid_round_releases_the_other_at_once(tmp_path: Path) -> None:
    script = tmp_path / "dies.py"
    script.write_text(DIES)
    plan = Plan(cmd=[sys.executable, str(script), "a"], nproc=2, pairs=2, warmup=None, cpus=[], timeout=120.0,
                ddptop_args=[], config=None, lockstep=True)
    started = time.monotonic()
    a, b = cost_lockstep.run_round(0, (cost_pairs.PLAIN, cost_pairs.AGAIN), plan, tmp_path, dict(os.environ))
    assert time.monotonic() - started < 60  # not TURN_WAIT_S (300 s) of waiting for a dead job's turn
    assert a.rc != 0 and b.rc == 0
    assert all(len(s) == 40 for s in b.ranks.values()) and len(b.ranks) == 2  # b ran every step, alone after a died
    assert a.step_ms is None and b.step_ms is None  # too few steps in turn to compare


PINNED = '''
import json, os, sys, threading
import torch, torch.distributed as dist
dist.init_process_group("gloo")
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(8, 8))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
other = threading.Thread(target=threading.Event().wait, args=(30,), daemon=True)
other.start()  # a thread that runs before the first step
for step in range(20):
    model(torch.randn(4, 8)).sum().backward()
    opt.step()
    opt.zero_grad()
seen = {"main": sorted(os.sched_getaffinity(0)), "thread": sorted(os.sched_getaffinity(other.native_id))}
pid = os.fork()
if pid == 0:
    open(sys.argv[1] + f".child{os.environ['RANK']}{os.environ['DDPTOP_STAMP_JOB']}", "w").write(
        json.dumps(sorted(os.sched_getaffinity(0))))
    os._exit(0)
os.waitpid(pid, 0)
open(sys.argv[1] + f".{os.environ['RANK']}{os.environ['DDPTOP_STAMP_JOB']}", "w").write(json.dumps(seen))
dist.destroy_process_group()
'''


@pytest.mark.e2e
@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs 2 CPUs")
def test_pin_main_puts_only_the_main_thread_on_one_core_in_both_jobs(tmp_path: Path) -> None:
    script, out = tmp_path / "pinned.py", tmp_path / "seen"
    script.write_text(PINNED)
    cpus = sorted(os.sched_getaffinity(0))[:2]
    plan = Plan(cmd=[sys.executable, str(script), str(out)], nproc=2, pairs=2, warmup=None, cpus=[cpus, cpus],
                timeout=120.0, ddptop_args=[], config=None, lockstep=True, pin_main=True)
    a, b = cost_lockstep.run_round(0, (cost_pairs.PLAIN, cost_pairs.AGAIN), plan, tmp_path, dict(os.environ))
    assert a.rc == 0 and b.rc == 0 and a.step_ms is not None and b.step_ms is not None
    for rank in "01":
        for job in "ab":
            seen = json.loads(Path(f"{out}.{rank}{job}").read_text())
            assert seen["main"] == [cpus[0]] and seen["thread"] == cpus, seen  # the main thread alone
            assert json.loads(Path(f"{out}.child{rank}{job}").read_text()) == cpus  # a fork gets the rank's CPUs back
