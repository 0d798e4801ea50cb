"""The straggler verdict (issue 27: numbers you can trust): a rank is named only when its own
work per step exceeds the others' on the same steps beyond the run's step-to-step noise, by
2 ms and 3% of the step or more, in 3 checks in a row; otherwise "no straggler: ranks within
X%". Synthetic records through RunState.apply, then two real 2-rank gloo runs of the demo."""

from __future__ import annotations

import json
import random
import subprocess
import sys

import pytest

from ddptop.model import report, straggler
from ddptop.model.snapshot import snapshot
from ddptop.model.state import RunState
from ddptop.model.straggler import Verdict, check_steps
from ddptop.viewer_wire.state_codec import state_from_dict, state_to_dict
from ddptop.wire.protocol import Steps

WARMUP = 5


def rec(step: int, rng: random.Random, step_ms: float = 100.0, noise: float = 0.0, extra_data: float = 0.0,
        exposed: float = 0.0) -> dict[str, float]:
    """One step of a rank: phases in the proportions of a ViT step, each with gaussian noise
    (`noise` x the step, split over the phases), `extra_data` ms more in data loading."""
    shares = {"data": 0.05, "forward": 0.3, "backward": 0.55, "optimizer": 0.1}
    sd = noise * step_ms / sum(s ** 0.5 for s in shares.values())  # phases' sd add up to ~noise x step
    ms = {p: max(0.1, s * step_ms + rng.gauss(0.0, sd * s ** 0.5)) for p, s in shares.items()}
    ms["data"] += extra_data
    out = {"step": step, "t": float(step), "samples": 32.0, "step_ms": sum(ms.values()) + exposed,
           **{p + "_ms": v for p, v in ms.items()}}
    out["backward_ms"] += exposed
    if exposed:
        out["exposed_comm_ms"] = exposed
    return out


def feed(n_ranks: int, steps: int, seed: int = 0, chunk: int = 3, **per_rank: dict) -> tuple[RunState, list[Verdict]]:
    """Apply `steps` records per rank a few at a time, rank after rank (as a live run sends
    them); the verdict after every message. `per_rank[key] = {rank: value}` sets rec()'s
    `key` for that rank, or a function of the step."""
    rng = random.Random(seed)
    state = RunState(run_id="r", config={}, world_size=n_ranks, warmup=WARMUP)
    seen = []
    for start in range(0, steps, chunk):
        for r in range(n_ranks):
            recs = []
            for s in range(start, min(start + chunk, steps)):
                kw = {k: v.get(r, 0.0) for k, v in per_rank.items()}
                kw = {k: (v(s) if callable(v) else v) for k, v in kw.items()}
                recs.append(rec(s, rng, **kw))
            state.apply(Steps(r, recs), 0.0)
            seen.append(state.straggler_verdict)
    return state, seen


def checks(seen: list[Verdict]) -> list[Verdict]:
    """The verdicts just after each check."""
    out, last = [], -1
    for v in seen:
        if v.checked != last:
            out.append(v)
            last = v.checked
    return out


@pytest.mark.parametrize("noise", [0.1, 0.2, 0.3])
@pytest.mark.parametrize("n_ranks", [2, 8])
def test_symmetric_noisy_ranks_never_get_a_straggler(noise: float, n_ranks: int) -> None:
    for seed in range(3):
        state, seen = feed(n_ranks, 600, seed=seed, noise={r: noise for r in range(n_ranks)})
        done = checks(seen)
        assert len(done) >= 55
        assert all(v.rank is None for v in seen)  # never named, so never flipping either
        assert state.straggler() is None
        # the calm verdict says how close the ranks are, measured
        assert state.straggler_verdict.describe().startswith("no straggler: ranks within ")
        assert state.straggler_verdict.describe().endswith("% of the step (n=50 steps)")


def test_a_rank_5ms_slower_in_data_is_named_with_the_evidence() -> None:
    # a CPU demo's step (12 ms of own work, 10% noise, 2 ms waiting in the all-reduce)
    state, seen = feed(2, 100, noise={0: 0.1, 1: 0.1}, step_ms={0: 12.0, 1: 12.0},
                       extra_data={1: 5.0}, exposed={0: 2.0, 1: 2.0})
    s = state.straggler()
    assert s is not None and s.rank == 1 and s.phase == "data"
    assert s.n == straggler.WINDOW and s.ci_low_ms <= 5.0 <= s.ci_high_ms and s.ci_low_ms > 2.0
    assert s.excess_ms == pytest.approx(5.0, abs=1.0) and s.p <= straggler.ALPHA
    text = s.describe()
    assert text.startswith("rank 1 straggler: data +") and "ms/step" in text
    assert f"n=50 steps, 95% CI {s.ci_low_ms:.1f}-{s.ci_high_ms:.1f} ms" in text
    # every view and the summary say the same
    snap = snapshot(state, 0.0)
    assert snap.straggler == s and snap.slowest == 1 == state.slowest_rank()
    summary = state.summary()
    assert summary["straggler"]["rank"] == 1 and summary["straggler"]["text"] == text
    assert summary["straggler_check"]["text"] == text and summary["straggler_check"]["rule"]["persist_checks"] == 3
    assert summary["straggler"]["ci95_ms"][0] > 2.0 and summary["straggler"]["n_steps"] == 50
    assert text in report.final_report(summary, "/runs/r").splitlines()
    assert f"straggler rank 1 (data +{s.excess_ms:.1f} ms/step)" in report.status_line(state, 0.0)


def test_a_5ms_straggler_among_8_ranks_on_a_100ms_step() -> None:
    state, _ = feed(8, 200, noise={r: 0.02 for r in range(8)}, extra_data={3: 5.0})
    s = state.straggler()
    assert s is not None and s.rank == 3 and s.phase == "data" and s.ranks == 8


def test_the_verdict_comes_only_after_three_checks_agree_and_goes_the_same_way() -> None:
    slow_from, slow_until = 60, 160  # rank 1 is 5 ms slower in these steps only
    state, seen = feed(2, 260, chunk=1, noise={0: 0.05, 1: 0.05}, step_ms={0: 20.0, 1: 20.0},
                       extra_data={1: lambda s: 5.0 if slow_from <= s < slow_until else 0.0})
    done = checks(seen)
    ends = [v.checked for v in done]
    assert ends == list(range(WARMUP + straggler.MIN_STEPS - 1, 260, straggler.EVERY))
    named_by_check = [v.latest.named for v in done]
    verdicts = [v.rank for v in done]
    first = named_by_check.index(True)
    # the checks that named it alone did not change the verdict; the third in a row did
    assert verdicts[first:first + 2] == [None, None] and verdicts[first + 2] == 1
    assert done[first].describe().startswith("no straggler: rank 1 data +")
    assert done[first].describe().endswith("in the last 1 check; 3 in a row name one")
    assert "in the last 2 checks;" in done[first + 1].describe()
    # it goes after three checks in a row that do not name it
    last = max(i for i, named in enumerate(named_by_check) if named)
    assert verdicts[last + 1:last + 3] == [1, 1] and verdicts[last + 3] is None
    # between, the verdict never flipped
    changes = sum(1 for a, b in zip(verdicts, verdicts[1:]) if a != b)
    assert changes == 2


def test_an_excess_below_the_floors_is_no_straggler() -> None:
    # +1.5 ms/step on a 20 ms step: beyond noise, but under 2 ms
    state, _ = feed(2, 120, noise={0: 0.01, 1: 0.01}, step_ms={0: 20.0, 1: 20.0}, extra_data={1: 1.5})
    latest = state.straggler_verdict.latest
    assert latest is not None and latest.rank == 1 and latest.beyond_noise and not latest.large
    assert state.straggler() is None
    assert state.straggler_verdict.describe() == "no straggler: ranks within 8% of the step (n=50 steps)"
    # +2.5 ms on a 200 ms step: over 2 ms, under 3% of the step
    state, _ = feed(2, 120, noise={0: 0.005, 1: 0.005}, step_ms={0: 200.0, 1: 200.0}, extra_data={1: 2.5})
    assert state.straggler_verdict.latest.beyond_noise and state.straggler() is None


def test_warmup_steps_do_not_count() -> None:
    # rank 1 is 50 ms slower in warmup only: nothing to name, and no check looks at warmup
    state, seen = feed(2, 60, noise={0: 0.05, 1: 0.05}, extra_data={1: lambda s: 50.0 if s < WARMUP else 0.0})
    assert state.straggler() is None and all(v.rank is None for v in seen)
    assert state.straggler_verdict.latest.n == straggler.WINDOW
    assert check_steps(-1, 23, WARMUP) == [] and check_steps(-1, 24, WARMUP) == [24]  # 20 measured steps


def test_a_batch_crossing_many_checks_runs_the_last_few_only() -> None:
    assert check_steps(-1, 10_000, 0) == [9949, 9959, 9969, 9979, 9989, 9999]  # 19, 29, ...: the last 6
    assert check_steps(24, 44, WARMUP) == [34, 44] and check_steps(34, 43, WARMUP) == []


def feed_lockstep(steps: int, late: dict[int, float], hidden: float = 0.0, seed: int = 0) -> RunState:
    """Two ranks as a GPU runs them: every step takes as long on both (they meet in the
    all-reduce), the rank that comes `late[r]` ms late spends that much less in the all-reduce
    (comm_ms) and the other waits that long, all of it at backward's end unless `hidden`
    of it overlaps its own backward. Each rank's own phases are noisy (20% of the step), so
    own work alone cannot tell them apart."""
    rng = random.Random(seed)
    state = RunState(run_id="r", config={}, world_size=2, warmup=WARMUP)
    for s in range(steps):
        delay = [late.get(0, 0.0), late.get(1, 0.0)]
        for r in (0, 1):
            wait = max(0.0, max(delay) - delay[r])  # it waits for the later one
            comm = 3.0 + wait + rng.gauss(0.0, 0.3)
            exposed = 1.0 + max(0.0, wait - hidden) + rng.gauss(0.0, 0.3)
            fwd = 15.0 + delay[r] + rng.gauss(0.0, 4.0)
            rec_ = {"step": s, "t": float(s), "samples": 8.0, "data_ms": 0.5, "forward_ms": fwd,
                    "backward_ms": 35.0 + exposed + rng.gauss(0.0, 4.0), "optimizer_ms": 3.0,
                    "comm_ms": comm, "exposed_comm_ms": exposed}
            rec_["step_ms"] = 60.0 + max(delay) + rng.gauss(0.0, 0.2)  # lockstep: the same on both
            state.apply(Steps(r, [rec_]), 0.0)
    return state


def test_with_comm_timed_the_rank_the_others_wait_for_is_named_from_the_waits() -> None:
    # the 2x H100 case: rank 1's loader +5 ms (in forward, nanoGPT's prefetch); own work per
    # step was too noisy to name it (p 0.065), the all-reduce waits say it on every step
    state = feed_lockstep(100, {1: 5.0})
    s = state.straggler()
    assert s is not None and (s.rank, s.basis, s.phase) == (1, "waits", "forward"), state.straggler_verdict
    assert s.excess_ms == pytest.approx(5.0, abs=0.5) and s.ci_low_ms > 4.0 and s.last >= 48
    assert s.describe().startswith("rank 1 straggler: forward +")
    assert f"last to all-reduce on {s.last} of 50 steps" in s.describe()
    # the other way round, the other rank
    assert feed_lockstep(100, {0: 5.0}).straggler().rank == 0


def test_with_comm_timed_no_one_is_late_or_the_wait_is_hidden_no_straggler() -> None:
    for seed in range(3):
        state = feed_lockstep(200, {}, seed=seed)
        assert state.straggler() is None
        assert state.straggler_verdict.describe().startswith("no straggler: ranks within ")
    # rank 1 is late on every step, but rank 0's backward hides all of the wait: it costs nothing
    state = feed_lockstep(100, {1: 5.0}, hidden=5.0)
    latest = state.straggler_verdict.latest
    assert latest.rank == 1 and latest.beyond_noise and not latest.large and state.straggler() is None


def test_a_viewer_gets_the_same_verdict() -> None:
    state, _ = feed(2, 100, noise={0: 0.05, 1: 0.05}, step_ms={0: 12.0, 1: 12.0}, extra_data={1: 5.0})
    back = state_from_dict(json.loads(json.dumps(state_to_dict(state))))
    assert back.straggler_verdict == state.straggler_verdict and back.straggler() == state.straggler()


# --- real runs ---------------------------------------------------------------------------

def demo(tmp_path, *args: str) -> dict:
    cmd = [sys.executable, "-m", "ddptop", "--headless", "--json", "--runs-dir", str(tmp_path), "--nproc", "2",
           *args]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=240)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    summary = json.loads(res.stdout.strip().splitlines()[-1])
    assert summary["straggler_check"]["text"] in res.stdout  # the final report says it too
    return summary


@pytest.mark.e2e
def test_the_demo_has_no_straggler(tmp_path) -> None:
    """The first run of a fresh clone named one (issue 27: 'rank 1 is a straggler: 13.3 ms vs
    10.1 ms' after 25 steps, nothing injected). On this shared 2-core machine one rank can
    really be slower for a dozen steps (another process on its core): one check may see it,
    the verdict waits for 3 in a row, so the summary says what it saw but names no one."""
    summary = demo(tmp_path, "--steps", "30")
    assert summary["straggler"] is None, summary["straggler"]
    check = summary["straggler_check"]
    assert check["straggler"] is None and check["text"].startswith("no straggler: "), check
    assert check["latest"]["n_steps"] == straggler.MIN_STEPS  # 25 measured steps: one check


@pytest.mark.e2e
def test_the_demo_names_the_rank_it_delays(tmp_path) -> None:
    """20 ms, not 5: on a quiet machine the demo's 5 ms delay is named (+5.2 to +6.4 ms/step,
    CI low 4.6-5.2 ms), but with the suite's other runs on the same two cores the other rank
    loses 10-20 ms to them on a third of the steps, and then a 5 or 10 ms delay is not the
    slower rank on enough steps to pass the sign test (a 10 ms one failed once in ~10 runs)."""
    summary = demo(tmp_path, "--steps", "80", "--set", "delay_rank=1", "--set", "delay_ms=20")
    s = summary["straggler"]
    assert s is not None and s["rank"] == 1 and s["phase"] == "data", summary["straggler_check"]
    assert s["ci95_ms"][0] > 2.0 and s["text"].startswith("rank 1 straggler: data +")
