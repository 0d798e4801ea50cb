import pytest

from ddptop.model import figures
from ddptop.model.config import RunConfig
from ddptop.model.state import Histogram, RunState
from ddptop.wire.protocol import Bye, Hello, Steps


def hello(rank):
    return Hello(rank=rank, local_rank=rank, world_size=2, host="h", pid=100 + rank, token="t")


def rec(step, step_ms, **kw):
    base = {"step": step, "t": float(step), "step_ms": step_ms, "data_ms": 1.0, "forward_ms": 2.0,
            "backward_ms": step_ms - 4.0, "optimizer_ms": 1.0, "samples": 32}
    return {**base, **kw}


def make_state(warmup=2):
    return RunState(run_id="r", config=RunConfig(preset="baseline", steps=10), world_size=2, warmup=warmup)


def test_throughput_counts_only_steps_after_warmup():
    st = make_state(warmup=2)
    st.apply(hello(0), 0)
    st.apply(Steps(0, [rec(0, 1000.0), rec(1, 1000.0)] + [rec(i, 10.0) for i in range(2, 12)]), 1)
    rs = st.ranks[0]
    assert rs.steps == 12 and rs.measured == 10
    assert figures.rank_steps_per_s_run(rs) == pytest.approx(100.0)
    assert figures.rank_samples_per_s_run(rs) == pytest.approx(3200.0)
    assert figures.rank_phases_mean_run(rs) == {"data": 1.0, "forward": 2.0, "backward": 6.0, "optimizer": 1.0}


def test_run_throughput_is_bounded_by_the_slowest_rank():
    st = make_state(warmup=0)
    st.apply(Steps(0, [rec(i, 10.0) for i in range(5)]), 0)
    assert st.steps_per_s() is None  # rank 1 has not reported: no honest number yet
    st.apply(Steps(1, [rec(i, 20.0) for i in range(5)]), 0)
    assert st.steps_per_s() == pytest.approx(50.0)
    # samples/s is steps/s x samples per step (32 on each rank): the slowest rank bounds
    # both, not the sum of each rank's own rate (3200 + 1600)
    assert figures.job_samples_per_s_run(st.ranks.values()) == pytest.approx(50.0 * 64)


def test_percentiles_from_histogram_are_within_two_percent():
    st = make_state(warmup=0)
    st.apply(Steps(0, [rec(i, float(i + 1)) for i in range(1000)]), 0)
    assert st.ranks[0].step_hist.percentile(50) == pytest.approx(500, rel=0.02)
    assert st.ranks[0].step_hist.percentile(95) == pytest.approx(950, rel=0.02)


def test_histogram_memory_is_bounded():
    h = Histogram()
    for i in range(200_000):
        h.add(10.0 + (i % 1000) * 0.01)
    assert h.n == 200_000 and len(h.counts) < 200


def test_slowest_rank_is_the_one_doing_most_own_work():
    st = make_state(warmup=0)
    st.apply(Steps(0, [rec(i, 100.0, exposed_comm_ms=60.0) for i in range(5)]), 0)
    st.apply(Steps(1, [rec(i, 100.0, exposed_comm_ms=5.0) for i in range(5)]), 0)
    assert st.slowest_rank() == 1


def test_status_transitions_and_summary_contract():
    st = make_state(warmup=1)
    assert st.status == "starting"
    for r in (0, 1):
        st.apply(hello(r), 0)
        st.apply(Steps(r, [rec(i, 10.0) for i in range(3)]), 0)
    assert st.status == "running" and st.current_step == 2
    st.apply(Bye(0), 1)
    st.rank_disconnected(1)
    assert st.ranks[0].status == "done" and st.ranks[1].status == "lost"
    st.finish("failed", 2, error="boom", failed_rank=1)
    s = st.summary()
    for key in ("run_id", "preset", "config", "world_size", "backend", "status", "steps_per_s",
                "samples_per_s", "step_ms_p50", "step_ms_p95", "ranks"):
        assert key in s
    assert s["status"] == "failed" and s["failed_rank"] == 1
    assert [r["rank"] for r in s["ranks"]] == [0, 1]
    for r in s["ranks"]:
        assert {"rank", "pid", "host", "device", "steps", "step_ms_p50", "step_ms_p95", "phases_ms"} <= set(r)
        assert set(r["phases_ms"]) == {"data", "forward", "backward", "optimizer"}


def test_ring_buffers_stay_bounded():
    st = make_state(warmup=0)
    for chunk in range(100):
        st.apply(Steps(0, [rec(chunk * 100 + i, 10.0) for i in range(100)]), 0)
        st.add_log(0, "line")
        st.tick(float(chunk))
    assert len(st.ranks[0].recent) <= 256
    assert st.ranks[0].steps == 10_000


def test_finish_rejects_non_terminal_status():
    with pytest.raises(ValueError):
        make_state().finish("running", 0)


def test_straggler_is_named_with_its_phase():
    st = RunState(run_id="r", config=RunConfig(), world_size=4, warmup=0)
    for r in range(4):
        slow = r == 2
        recs = [rec(i, 100.0, data_ms=31.0 if slow else 1.0, exposed_comm_ms=0.5 if slow else 30.5)
                for i in range(60)]  # checks at steps 19, 29, ...: the third names it
        st.apply(Steps(r, recs), 0)
    s = st.straggler()
    assert s is not None and s.rank == 2 and s.phase == "data"
    assert s.excess_ms == pytest.approx(30.0) == s.cost_ms and s.n == 50


def test_no_straggler_when_ranks_are_even():
    st = make_state(warmup=0)
    for r in (0, 1):
        st.apply(Steps(r, [rec(i, 100.0 + r * 0.5) for i in range(60)]), 0)
    assert st.straggler() is None
    assert st.straggler_verdict.describe() == "no straggler (largest: rank 1 +0.5 ms, 0%; the rule sees >= 3.0 ms here)"


def test_stall_flagged_after_bound_and_cleared_on_progress():
    st = make_state(warmup=0)
    for r in (0, 1):
        st.apply(hello(r), 0)
        st.apply(Steps(r, [rec(i, 10.0) for i in range(5)]), now=100.0)
    assert st.stall_bound_s() == 10.0  # 20 x 10 ms is below the 10 s floor
    assert st.check_stall(105.0, {0: "sleeping", 1: "sleeping"}) is None
    stall = st.check_stall(111.0, {0: "sleeping", 1: "stopped"})
    assert stall is not None and stall.suspects == [1] and st.stalls == 1
    assert st.check_stall(112.0, {}) is None  # flagged once
    st.apply(Steps(0, [rec(5, 10.0)]), now=113.0)
    st.check_stall(113.5, {})
    assert st.stall.cleared_at == 113.5


def test_bus_bandwidth_as_nccl_tests_define_it():
    from ddptop.model.state import bus_bandwidth

    bw = bus_bandwidth(nbytes=1e9, comm_ms=100.0, world=4)  # 10 GB/s algorithm bandwidth
    assert bw["algbw_gbps"] == 10.0 and bw["busbw_gbps"] == 15.0
    assert bus_bandwidth(1e9, 100.0, 1) == {"algbw_gbps": None, "busbw_gbps": None}


def test_comm_timed_on_some_steps_counts_share_and_bandwidth_over_those_steps():
    # GPU runs time all-reduce completion every Nth step only; exposed comm comes every step
    st = RunState(run_id="r", config=RunConfig(), world_size=2, warmup=0)
    for rank in (0, 1):
        recs = []
        for step in range(40):
            rec = {"step": step, "step_ms": 100.0, "exposed_comm_ms": 5.0, "comm_bytes": 1e9}
            if step % 10 == 0:
                rec["comm_ms"] = 20.0
            recs.append(rec)
        st.apply(Steps(rank, recs), 1.0)
    s = st.summary()
    r0 = s["ranks"][0]
    assert r0["comm_timed_steps"] == 4
    assert r0["comm_share"] == 0.2  # 20 ms of 100, not 80 ms over 4000 ms
    assert r0["exposed_comm_share"] == 0.05 and r0["exposed_comm_ms_p50"] == pytest.approx(5.0, rel=0.02)
    assert r0["algbw_gbps"] == 50.0  # 1 GB in 20 ms, from the timed steps only
    assert s["comm_share"] == 0.2


def test_profiled_steps_are_kept_but_left_out_of_throughput():
    st = RunState(run_id="r", config=RunConfig(), world_size=1, warmup=0)
    recs = [{"step": s, "step_ms": 100.0} for s in range(10)]
    recs[5] = {"step": 5, "step_ms": 128_000.0, "profiled": 1}  # nsys flushing its window
    st.apply(Steps(0, recs), 1.0)
    rs = st.ranks[0]
    assert rs.steps == 10 and rs.measured == 9 and st.steps_per_s() == pytest.approx(10.0)
    assert st.step_ms_pcts(95)[0] == pytest.approx(100.0, rel=0.02)


def test_a_rank_that_finished_is_never_a_stall_suspect():
    st = RunState(run_id="r", config=RunConfig(), world_size=2, warmup=0)
    st.status = "running"
    st.apply(Steps(0, [{"step": s, "step_ms": 10.0} for s in range(5)]), 1.0)
    st.apply(Steps(1, [{"step": s, "step_ms": 10.0} for s in range(9)]), 1.0)
    st.apply(Bye(0, "completed"), 1.0)  # rank 0's script ended; rank 1 hangs after step 8
    stall = st.check_stall(100.0, {0: "gone", 1: "sleeping"})
    assert stall is not None and stall.suspects == [1]


def test_bandwidth_under_a_compressing_hook_is_called_effective():
    from ddptop.model.report import comm_lines

    st = RunState(run_id="r", config=RunConfig(), world_size=2, warmup=0)
    for rank in (0, 1):
        recs = [{"step": s, "step_ms": 100.0, "exposed_comm_ms": 1.0, "comm_ms": 0.1, "comm_bytes": 1e9, "compressing": 1.0}
                for s in range(20)]
        st.apply(Steps(rank, recs), 1.0)
    s = st.summary()
    assert s["ranks"][0]["busbw_effective"] is True and s["ranks"][0]["busbw_gbps"] > 1000  # past any link
    assert "effective" in comm_lines(s)[0]


def test_the_straggler_check_passes_over_the_ranks_only_when_one_is_due(monkeypatch):
    """A frame costs O(1): the full pass over every rank runs when every rank is past the next
    check's step, or once a second (a lost rank never gets there)."""
    from ddptop.model import straggler

    calls = []
    real = straggler.advance
    monkeypatch.setattr(straggler, "advance", lambda *a: calls.append(1) or real(*a))
    st = RunState(run_id="r", config=RunConfig(), world_size=64, warmup=0)
    for step in range(40):
        for r in range(64):
            st.apply(Steps(r, [rec(step, 10.0)]), now=1.0)
    assert 0 < len(calls) <= 40 // 10 + 2  # one per check boundary, not one per frame (2,560)
    st.ranks[5].status = "lost"
    for step in range(40, 60):
        for r in range(64):
            if r != 5:
                st.apply(Steps(r, [rec(step, 10.0)]), now=1.0 + step)  # a second a step
    assert st.straggler_verdict.checked >= 49  # checks go on without the lost rank


def test_the_summary_says_the_config_as_before_it_was_typed():
    """summary.json's `config`: a demo run's whole RunConfig; a user's script's run (which holds
    its script_view) only the knobs that mean something for it, as RunConfig.script_dict says
    them (issue 48: the same keys and values as when the state held these dicts)."""
    from ddptop.model.config import SCRIPT_PRESETS, preset_config

    demo = preset_config("bf16", RunConfig(nproc=2, steps=40))
    summary = RunState(run_id="r", config=demo, world_size=2).summary()
    assert summary["config"] == demo.to_dict() and summary["preset"] == "bf16"
    for name in SCRIPT_PRESETS:
        config = preset_config(name, RunConfig(nproc=2, script=True, warmup=3, script_steps=7))
        state = RunState(run_id="r", config=config.script_view(), world_size=2, command=["python", "t.py"])
        summary = state.summary()
        assert summary["config"] == config.script_dict() and summary["preset"] == name
        assert list(summary["config"]) == list(config.script_dict())  # in the same order too
        assert state.config.total_steps == 0 and demo.total_steps == 40
