"""`ddptop cost --lockstep`: both arms at once, taking turns step by step.

Whole runs one after the other cannot resolve 1% on a launch-bound script on the lent GPU hosts:
a pinned launch loop there has slow spells of seconds, each on its own core and GPU (session 14:
per-second medians of loops on four cores correlate -0.09 to +0.28, and two loops taking turns on
one core +0.99), and a launch-bound step is as slow as its host. Here the plain job and the
ddptop job run together, rank r of each on the same CPUs and GPU, and take turns at every
optimizer step (ddptop/rank/stamp: the step's end waits for the device, hands the turn over,
waits for it back), so a spell falls on both alike. Each round's figure is each job's mean step
taken in turn, over the same step numbers; rounds alternate who goes first, and every second
round is followed by one of plain beside plain (the A/A). `--pin-main` puts each rank's main
thread on the first of its CPUs in both jobs (the stamp does it at the first step), so the two
share a core's spells, not only a set of CPUs.

What it leaves out, by design: the ranks share their GPU and CPUs with the other job's idle
threads and memory, and every step ends with a device sync (in both jobs alike). It answers
what ddptop adds to a step, not how the job runs alone on the machine.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from ddptop.analysis import cost_pairs
from ddptop.commands.cost_plan import Plan, RunRecord
from ddptop.commands.cost_runs import collect, launch, stop

TURN_WAIT_S = 300.0  # a turn that does not come back within this ends the turns (the other job died)


def make_turns(folder: Path, nproc: int) -> None:
    """A private folder of FIFOs, one per job and rank: `turn_<job>_<rank>`."""
    folder.mkdir(mode=0o700)
    for job in "ab":
        for rank in range(nproc):
            os.mkfifo(folder / f"turn_{job}_{rank}", 0o600)


def run_round(i: int, arms: tuple[str, str], plan: Plan, where: Path, env: dict[str, str]) -> tuple[RunRecord, RunRecord]:
    """Both jobs of round i (arms: job a's, job b's), started together and waited for; each
    record's step_ms is its steps taken in turn over the steps both took."""
    tag = f"{i:02d}-lock-{arms[0]}-{arms[1]}"
    folder = where / f"{tag}-turns"
    make_turns(folder, plan.nproc)
    turn_env = {"DDPTOP_STAMP_TURNS": str(folder), "DDPTOP_STAMP_TURN_S": f"{min(TURN_WAIT_S, plan.timeout):g}",
                **({"DDPTOP_STAMP_PIN_MAIN": "1"} if plan.pin_main else {})}
    runs = [launch(i, arm, plan, where, env, tag=f"{tag}-{job}", more_env={**turn_env, "DDPTOP_STAMP_JOB": job})
            for job, arm in zip("ab", arms)]
    rcs = [-1, -1]
    try:
        rcs = _wait_both(runs, folder, plan)
    except KeyboardInterrupt:
        for run in runs:
            stop(run.proc)
        raise
    finally:
        records = [collect(run, rc, plan) for run, rc in zip(runs, rcs)]
    turns = [{r: (rec.ranks[r], rec.starts.get(r, [])) for r in rec.ranks} for rec in records]
    both = cost_pairs.round_ms(turns[0], turns[1], plan.warmup)
    for rec, ms in zip(records, both or (None, None)):
        rec.step_ms = ms if rec.rc == 0 and len(rec.ranks) == plan.nproc else None
    return records[0], records[1]


def release(folder: Path, job: str, nproc: int) -> None:
    """The other job ended: its partner's ranks run on alone ("e" in each of their FIFOs), at
    once rather than after TURN_WAIT_S (a rank killed by a signal never says so itself)."""
    for rank in range(nproc):
        try:
            fd = os.open(folder / f"turn_{job}_{rank}", os.O_WRONLY | os.O_NONBLOCK)
        except OSError:  # no rank of that job holds it open (not started, or gone)
            continue
        try:
            os.write(fd, b"e")
        except OSError:
            pass
        finally:
            os.close(fd)


def _wait_both(runs: list[Any], folder: Path, plan: Plan) -> list[int]:
    """Both jobs' exit codes (-1: stopped at the timeout); once one ended, the other's ranks are
    released (`release`) until it ends too."""
    deadline = time.monotonic() + plan.timeout
    rcs: list[int | None] = [None, None]
    while None in rcs:
        for k, run in enumerate(runs):
            if rcs[k] is None:
                rcs[k] = run.proc.poll()
        if None in rcs and any(rc is not None for rc in rcs):  # again each time: a rank may open its FIFO later
            release(folder, "ab"[rcs.index(None)], plan.nproc)
        if time.monotonic() > deadline:
            for k, run in enumerate(runs):
                if rcs[k] is None:
                    stop(run.proc)
                    rcs[k] = -1
        time.sleep(0.1)
    return [rc if rc is not None else -1 for rc in rcs]


def run_all(plan: Plan, where: Path, env: dict[str, str], say, records: list[RunRecord],
            aa: list[tuple[float, float]]) -> None:
    """Every round of the schedule, each added as it ends (an interrupt keeps what was measured):
    the plain-beside-ddptop records to `records` (as the ABBA runs' records), the A/A rounds'
    (plain ms, plain-again ms) to `aa`."""
    for i, first, second in cost_pairs.lockstep_schedule(plan.pairs):
        a, b = run_round(i, (first, second), plan, where, env)
        if cost_pairs.AGAIN in (first, second):  # plain / plain-again, as plain / ddptop: by arm, not by
            if a.step_ms is not None and b.step_ms is not None:  # who went first (it alternates; ~1.6%)
                ms = {first: a.step_ms, second: b.step_ms}
                aa.append((ms[cost_pairs.PLAIN], ms[cost_pairs.AGAIN]))
        else:
            records += [a, b]
        for rec in (a, b):
            shown = "no steps in turn" if rec.step_ms is None else f"{rec.step_ms:.3f} ms/step in turn"
            say(f"  round {i + 1:>2} {rec.arm:<11} rc={rec.rc} {shown}  ({rec.wall_s:.1f} s)")
