"""ddptop's own cost measured inside one run (--set cost_ab=S): the rank side's blocks, the
paired analysis, and a real 2-rank run of an unchanged script."""

import json
import random
import sys
from pathlib import Path

import pytest

from ddptop.analysis.cost_ab import analyse, median_ci, verdict, verdicts
from ddptop.rank.attach import flight_recorder_env
from ddptop.rank.cost_ab import CostAB

HERE = Path(__file__).resolve().parents[1]


def blocks_with(arm_ms: dict, groups: int, noise: float, seed: int) -> list[dict]:
    """Blocks of 10 steps whose time per step drifts slowly (the machine) with noise; each
    arm's own cost multiplies it."""
    rng = random.Random(seed)
    out, drift = [], 1.0
    for g in range(1, groups + 1):
        drift *= 1 + rng.gauss(0, 0.01)
        for arm, factor in arm_ms.items():
            ms = 10 * 20.0 * drift * factor * (1 + rng.gauss(0, noise))
            out.append({"group": g, "arm": arm, "steps": 10, "ms": ms, "cpu_ms": ms * 0.5})
    return out


def test_a_known_cost_is_read_back_within_its_interval_and_identical_arms_read_one():
    results = [{"rank": r, "blocks": blocks_with({"on": 1.004, "off": 1.0, "aa": 1.0, "busy": 1.005}, 150, 0.002, r)}
               for r in range(2)]
    costs = {c.arm: c for c in analyse(results)}
    on, aa, busy = costs["on"], costs["aa"], costs["busy"]
    assert on.ratio.lo <= 1 / 1.004 <= on.ratio.hi and on.ratio.hi < 1.0
    assert on.ms_per_step.median == pytest.approx(0.08, abs=0.03)  # 0.4% of a 20 ms step
    assert aa.ratio.lo <= 1.0 <= aa.ratio.hi and abs(aa.ratio.median - 1) < 0.002
    assert busy.ratio.hi < 1.0
    assert "within" in verdict(on) and "NOT" not in verdict(on)
    assert "reads 1.000" in verdict(aa) and "is seen" in verdict(busy)


def test_the_engaged_verdict_stands_only_where_the_runs_own_checks_pass():
    good = analyse([{"rank": r, "blocks": blocks_with({"on": 1.001, "off": 1.0, "aa": 1.0, "busy": 1.005}, 150, 0.002, r)}
                    for r in range(2)])
    assert "NOT TRUSTED" not in verdicts(good)["on"]
    # identical arms that differ by 1% (a run noisier than its intervals): the engaged verdict is withdrawn
    bad = analyse([{"rank": r, "blocks": blocks_with({"on": 1.001, "off": 1.0, "aa": 1.01}, 150, 0.002, r)}
                   for r in range(2)])
    said = verdicts(bad)
    assert "within" in said["on"] and "NOT TRUSTED: this run's own check failed (aa read 0.99" in said["on"]
    assert "off by more than 0.002" in said["aa"]
    unseen = analyse([{"rank": r, "blocks": blocks_with({"on": 1.0, "off": 1.0, "busy": 1.0}, 150, 0.002, r)}
                      for r in range(2)])
    assert "NOT TRUSTED" in verdicts(unseen)["on"] and "busy read" in verdicts(unseen)["on"]


def test_the_verdict_says_within_over_or_neither_shown():
    from ddptop.model.cost import ArmCost, Estimate

    def on(median, lo, hi):
        e = Estimate(median, lo, hi, 100)
        return ArmCost("on", e, e, e, 20.0)

    assert verdict(on(0.998, 0.995, 1.001)) == "cost within 0.5% (median ≥ 0.995 and lower bound ≥ 0.99)"
    assert verdict(on(0.985, 0.980, 0.990)).startswith("cost NOT within 0.5% (the whole interval is below 0.995)")
    wide = verdict(on(1.000, 0.970, 1.030))  # a noisy run: nothing shown either way
    assert wide.startswith("cost not shown within 0.5% nor over it") and "reaches 1.0300" in wide


def test_drift_between_groups_cancels_in_the_pairs():
    # the machine slows 40% over the run; pairs inside a group still read the true cost
    blocks = []
    for g in range(1, 101):
        slow = 1 + 0.4 * g / 100
        blocks += [{"group": g, "arm": "off", "steps": 5, "ms": 100 * slow},
                   {"group": g, "arm": "on", "steps": 5, "ms": 101 * slow}]
    (on,) = analyse([{"blocks": blocks}])
    assert on.ratio.median == pytest.approx(100 / 101)
    assert on.ratio.hi - on.ratio.lo < 1e-9


def test_a_group_a_rank_did_not_finish_is_left_out():
    r0 = {"blocks": [{"group": 1, "arm": "on", "steps": 4, "ms": 40}, {"group": 1, "arm": "off", "steps": 4, "ms": 40},
                     {"group": 2, "arm": "on", "steps": 4, "ms": 80}]}
    r1 = {"blocks": [{"group": 1, "arm": "on", "steps": 4, "ms": 40}, {"group": 1, "arm": "off", "steps": 4, "ms": 40}]}
    (on,) = analyse([r0, r1])
    assert on.ratio.n == 1 and on.ratio.median == 1.0


def test_median_ci_of_nothing_is_empty():
    assert median_ci([]).n == 0


class FakeTorch:
    class distributed:  # noqa: N801 - mimics torch.distributed
        @staticmethod
        def is_available():
            return False


def drive(monkeypatch, arms: str, steps: int, blocks: int = 0) -> tuple[CostAB, list[bool]]:
    """Steps of 1 ms each on the host clock (which also ticks 1 us a read: the busy arm spins on it)."""
    now = [0.0]

    def clock() -> float:
        now[0] += 1e-6
        return now[0]

    monkeypatch.setattr("ddptop.rank.cost_ab.time.perf_counter", clock)
    engaged = []
    cost = CostAB(FakeTorch, 0, {"cost_ab": 0.001, "cost_ab_arms": arms, "warmup": 2, "cost_ab_blocks": blocks},
                  engaged.append)
    for step in range(steps):
        now[0] += 0.001
        cost.step_ended(step)
    return cost, engaged


def test_blocks_run_every_arm_once_per_group_in_the_same_order_on_every_rank(monkeypatch):
    a, engaged = drive(monkeypatch, "on,off,aa,busy", 200)
    b, _ = drive(monkeypatch, "on,off,aa,busy", 200)
    arms = [x["arm"] for x in a.blocks]
    assert arms == [x["arm"] for x in b.blocks]  # every rank draws the same order
    assert len(arms) >= 8
    for g in range(len(arms) // 4):
        assert sorted(arms[4 * g: 4 * g + 4]) == ["aa", "busy", "off", "on"]
    assert a.steps_per_block == 1 and a.step_ms == pytest.approx(1.0, rel=0.01)  # 1 ms blocks of 1 ms steps
    assert all(x["steps"] == a.steps_per_block for x in a.blocks)
    # engaged exactly in the "on" blocks
    assert engaged[:len(arms)] == [arm == "on" for arm in arms]
    assert a.busy_ms == pytest.approx(a.step_ms * 0.005)


def test_a_block_count_sets_the_last_step_on_a_group_boundary(monkeypatch):
    cost, _ = drive(monkeypatch, "on,off", 400, blocks=6)
    calibrated = 2 + 10  # warmup, then the calibration's steps
    assert cost.last_step == calibrated + 6 * cost.steps_per_block


def test_bypassed_optimizer_steps_count_training_steps_by_the_script_cycle():
    cost = CostAB(FakeTorch, 0, {}, lambda on: None)
    ends = []
    for _ in range(4):  # two optimizers a step; GradScaler.step -> optimizer.step nests
        for _opt in range(2):
            cost.bypassed_opt(begin=True)
            cost.bypassed_opt(begin=True)
            cost.bypassed_opt(begin=False, cycle=2)
            ends.append(cost.bypassed_opt(begin=False, cycle=2))
    assert ends == [False, True] * 4


@pytest.mark.parametrize("version, expect", [("2.4.1", "TORCH_NCCL_TRACE_BUFFER_SIZE"), ("2.7.0a0", "TORCH_NCCL_TRACE_BUFFER_SIZE"),
                                             ("2.8.0", "TORCH_FR_BUFFER_SIZE"), ("2.14.1+cu130", "TORCH_FR_BUFFER_SIZE")])
def test_flight_recorder_variables_get_the_names_the_ranks_torch_reads(version, expect):
    env = {"DDPTOP_FR_BUFFER_SIZE": "2000", "DDPTOP_FR_DUMP_FILE": "/x/nccl_trace_rank_"}
    flight_recorder_env(env, version)
    assert env[expect] == "2000"
    assert not any(k.startswith("DDPTOP_FR") for k in env)
    dump = "TORCH_FR_DUMP_TEMP_FILE" if expect.startswith("TORCH_FR") else "TORCH_NCCL_DEBUG_INFO_TEMP_FILE"
    assert env[dump] == "/x/nccl_trace_rank_" and len(env) == 2


def test_a_flight_recorder_name_the_user_set_is_left_alone():
    env = {"DDPTOP_FR_BUFFER_SIZE": "2000", "DDPTOP_FR_DUMP_FILE": "/x", "TORCH_NCCL_TRACE_BUFFER_SIZE": "10"}
    flight_recorder_env(env, "2.11.0")
    assert env == {"TORCH_NCCL_TRACE_BUFFER_SIZE": "10", "TORCH_FR_DUMP_TEMP_FILE": "/x"}


@pytest.mark.e2e
def test_a_real_run_of_an_unchanged_script_times_blocks_on_both_ranks_and_ends_after_them(tmp_path):
    import subprocess

    cmd = [sys.executable, "-m", "ddptop", "--headless", "--json", "--runs-dir", str(tmp_path), "--nproc", "2",
           "--warmup", "3", "--cost", "8",  # 8 one-step blocks, arms on, off, aa, busy: two groups
           "--", sys.executable, str(HERE / "scripts" / "plain_ddp.py"), "--steps", "100000"]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=240)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    summary = json.loads(res.stdout.strip().splitlines()[-1])
    assert summary["status"] == "completed"
    files = sorted(tmp_path.glob("*/cost_ab/rank*.json"))
    assert [f.name for f in files] == ["rank0.json", "rank1.json"]
    r0, r1 = (json.loads(f.read_text()) for f in files)
    assert r0["steps_per_block"] == r1["steps_per_block"] >= 1
    assert [b["arm"] for b in r0["blocks"]] == [b["arm"] for b in r1["blocks"]]
    assert len(r0["blocks"]) == 8 and all(b["ms"] > 0 and b["steps"] == r0["steps_per_block"] for b in r0["blocks"])
    assert {c.arm for c in analyse([r0, r1])} == {"on", "aa", "busy"}
    # the run itself says what the layer cost, in its summary and its closing lines
    cost = summary["cost"]
    assert [a["arm"] for a in cost["arms"]] == ["on", "aa", "busy"] and cost["groups"] == 2
    assert all(a["verdict"] for a in cost["arms"]) and cost["step_ms"] > 0
    assert "ddptop's own cost (engaged vs bypassed inside this run, 2 groups" in res.stdout
    assert res.stdout.count(" us a step per rank [") == 3
    # the run stopped itself after its blocks, on both ranks at the same step, and says why
    last = [r["last_step"] for r in summary["ranks"]]
    assert last[0] == last[1] < 100000
    logs = "".join(p.read_text() for p in tmp_path.glob("*/logs/**/stderr.log"))
    assert logs.count("the cost measurement's blocks are done") == 2, logs[-2000:]


class EventClock:
    """CUDA-event-like stamps: done once `ran` is set past them; released ones are counted."""

    def __init__(self):
        self.n, self.ran, self.released = 0, -1, []

    def stamp(self):
        self.n += 1
        return [self.n]  # an object, as an event is (identity matters)

    def elapsed(self, a, b):
        return float(b[0] - a[0])

    def done(self, s):
        return s[0] <= self.ran

    def sync(self):
        self.ran = self.n

    def release(self, stamps):
        self.released.extend(stamps)


def test_blocks_become_numbers_once_their_stamps_ran_and_give_their_events_back(monkeypatch):
    cost = CostAB(FakeTorch, 0, {"cost_ab": 0.001, "cost_ab_arms": "on,off", "warmup": 2}, lambda on: None)
    clock = EventClock()
    cost.use_clock(clock, cuda=False)
    for step in range(60):  # a step is one stamp: 0.1 "ms", so blocks of 10 steps
        clock.ran = clock.n  # every stamp so far has run on the "device"
        cost.step_ended(step)
    read = [b for b in cost.blocks if "ms" in b]
    assert read and all("stamps" not in b for b in read) and all(b["step_ms"] for b in read)
    assert clock.released and len({id(s) for s in clock.released}) == len(clock.released)  # each event once
    result = cost.result()  # the rest at the end, after a sync
    assert all("ms" in b and "a" not in b for b in result["blocks"])


def test_each_hook_s_time_is_kept_per_arm_inside_blocks_only(monkeypatch):
    cost, _ = drive(monkeypatch, "on,off", 40)
    hook = cost.timed(lambda: None)
    hook()
    assert set(cost.per_hook) <= {"on", "off"} and sum(n for arm in cost.per_hook.values() for n, *_ in arm.values()) == 1
    # the run's end (Instrument.flush calls it first, on destroy_process_group and again at
    # exit): its flush, which waits 0.25 s for NCCL's last reports, is no hook's cost, even
    # before the last block closed (HF's 800 steps carried it as +312 us/step on 2x H100)
    cost.run_ends()
    hook()
    assert sum(n for arm in cost.per_hook.values() for n, *_ in arm.values()) == 1

