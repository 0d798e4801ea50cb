"""What one straggler check costs ddptop's process, on real 4-GPU step records: the rule runs on
the hub's thread every 10 measured steps (ddptop.model.straggler), so its cost per check over
ten steps is its share of ddptop's CPU per step.

    .venv/bin/python bench/investigations/straggler_check_cost.py [CASE ...]
        (CASE: a tests/fixtures/straggler/h200x4_*.jsonl.gz name, default gpt768pin_sym1 gpt768pin_mm30)

Each case's records are replayed through RunState as the ranks sent them, then
straggler.check is timed over its last window, 5 rounds of 200 checks (the median round); run it
pinned to one core (`taskset -c 1`) on a quiet machine.

Question: how much of ddptop's CPU per step is the straggler check, at 4 ranks?
Answer (2026-11-28, the 2-core VM, pinned to one core): 1.15 ms a check on both 4-rank GPU runs'
records (0.115 ms a step), 1.36 ms before the median-without-one positions were cached. Session
11 read 2.59 ms a check on sym1's records, with the machine busy.
Quoted in: docs/BENCHMARKS.md, "2026-11-28 (session 12), the 2-core CPU VM".
"""

from __future__ import annotations

import gzip
import json
import statistics
import sys
import time
from pathlib import Path

from ddptop.model import straggler
from ddptop.model.config import RunConfig
from ddptop.model.state import RunState
from ddptop.wire.protocol import Steps

FIXTURES = Path(__file__).resolve().parents[2] / "tests" / "fixtures" / "straggler"


def replayed(case: str) -> RunState:
    with gzip.open(FIXTURES / f"h200x4_{case}.jsonl.gz", "rt") as f:
        recs = [json.loads(line) for line in f]
    by_rank: dict[int, list[dict]] = {}
    for r in recs:
        by_rank.setdefault(r.pop("rank"), []).append(r)
    state = RunState(run_id="r", config=RunConfig(), world_size=len(by_rank), warmup=10)
    for i in range(0, max(len(v) for v in by_rank.values()), 5):
        for rank, mine in sorted(by_rank.items()):
            state.apply(Steps(rank, mine[i:i + 5]), 0.0)
    return state


def ms_per_check(case: str, rounds: int = 5, checks: int = 200) -> float:
    state = replayed(case)
    end = min(rs.last_step for rs in state.ranks.values())
    straggler.check(state.ranks, end, 10)
    times = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        for _ in range(checks):
            straggler.check(state.ranks, end, 10)
        times.append((time.perf_counter() - t0) / checks * 1e3)
    return statistics.median(times)


if __name__ == "__main__":
    for name in sys.argv[1:] or ["gpt768pin_sym1", "gpt768pin_mm30"]:
        cost = ms_per_check(name)
        print(f"{name}: {cost:.3f} ms a check ({cost / straggler.EVERY:.3f} ms a step at one check every "
              f"{straggler.EVERY} steps)")
