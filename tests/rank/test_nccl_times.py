"""NcclTimes: NCCL's own per-collective timing read from a process group's completion hook
(the hook thread's WorkInfo), attributed to the steps whose host window issued them."""

from datetime import timedelta
from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")
from torch._C._distributed_c10d import OpType  # noqa: E402

from ddptop.rank.comm import NcclTimes  # noqa: E402


class Group:
    def __init__(self, backend="nccl", has_hook=False):
        self.backend, self.hook = backend, None
        self.has_hook = has_hook

    def _register_on_completion_hook(self, hook):
        if self.has_hook:
            raise RuntimeError("ProcessGroupNCCL OnCompletion hook already registered")
        self.hook = hook


def dist_for(group):
    return SimpleNamespace(get_backend=lambda pg: pg.backend)


def info(start_s, dur_ms, op=OpType.ALLREDUCE):
    return SimpleNamespace(op_type=op, time_started=timedelta(seconds=start_s),
                           active_duration=timedelta(milliseconds=dur_ms))


def test_only_where_nccl_times_its_work(monkeypatch):
    monkeypatch.delenv("TORCH_NCCL_ENABLE_TIMING", raising=False)
    assert NcclTimes.attach(dist_for(Group()), Group()) is None  # its hook would abort the communicator
    monkeypatch.setenv("TORCH_NCCL_ENABLE_TIMING", "1")
    assert NcclTimes.attach(dist_for(None), Group("gloo")) is None
    assert NcclTimes.attach(dist_for(None), Group(has_hook=True)) is None
    assert NcclTimes.attach(dist_for(None), SimpleNamespace(backend="nccl")) is None  # an older torch
    group = Group()
    assert NcclTimes.attach(dist_for(group), group) is not None and group.hook is not None


def test_all_reduces_go_to_the_step_that_issued_them_once_a_later_one_is_reported(monkeypatch):
    monkeypatch.setenv("TORCH_NCCL_ENABLE_TIMING", "1")
    group = Group()
    times = NcclTimes.attach(dist_for(group), group)
    for start, dur in ((10.0, 1.0), (10.1, 2.5), (10.2, 0.5)):  # step 0 closes at 10.5
        group.hook(info(start, dur))
    group.hook(info(10.3, 9.0, OpType.BROADCAST))  # not an all-reduce: not gradient communication
    assert not times.reported_after(10.5)
    group.hook(info(10.6, 1.0))  # step 1's first bucket: step 0 is complete
    assert times.reported_after(10.5)
    assert times.take(10.5) == pytest.approx([1.0, 2.5, 0.5])
    assert times.take(10.5) == [] and times.take(11.0) == pytest.approx([1.0])


def test_a_broken_work_info_is_counted_never_raised(monkeypatch):
    monkeypatch.setenv("TORCH_NCCL_ENABLE_TIMING", "1")
    group = Group()
    times = NcclTimes.attach(dist_for(group), group)
    group.hook(SimpleNamespace(op_type=OpType.ALLREDUCE, time_started=None, active_duration=None))
    assert times.errors == 1 and times.take(1e9) == []


def test_nccls_own_timing_is_asked_of_the_ranks_only_with_nccl_timing(tmp_path):
    """Issue 42: TORCH_NCCL_ENABLE_TIMING cost the ViT-L demo 1.4% of a step against plain
    torchrun (2x H200): a default run's ranks get neither it nor ddptop's NCCL plugin."""
    from ddptop.model.config import RunConfig
    from ddptop.run.launcher import build_plan

    def env(**kw):
        return build_plan(RunConfig(nproc=2, **kw), tmp_path, "unix:/x/hub.sock", "t", "run", base_env={},
                          nccl_plugin=(tmp_path / "p.so", "")).env

    assert "TORCH_NCCL_ENABLE_TIMING" not in env() and "NCCL_PROFILER_PLUGIN" not in env()  # exposed comm only
    assert env(nccl_timing=True)["TORCH_NCCL_ENABLE_TIMING"] == "1"  # total comm measured by NCCL itself
    assert env(nccl_timing=True)["NCCL_PROFILER_PLUGIN"] == str(tmp_path / "p.so")
    assert "TORCH_NCCL_ENABLE_TIMING" not in env(nccl_timing=True, comm_timing=False)


def test_under_a_comm_hook_comm_ms_is_the_collectives_and_the_hooks_span_is_kept_beside(monkeypatch):
    """A hooked DDP on NCCL: the timer's stamped span (hand-over to the hook's future done)
    becomes hook_ms; comm_ms is NCCL's own time of the collectives the hook issued; the
    timer's bucket count and bytes stay."""
    from ddptop.rank.ddp_comm import DdpComm
    from ddptop.rank.steps import StepTracker

    monkeypatch.setenv("TORCH_NCCL_ENABLE_TIMING", "1")
    group = Group()
    times = NcclTimes.attach(dist_for(group), group)
    comm = DdpComm(torch, StepTracker(None), True, 10, cuda=lambda: True, capturing=lambda: False,
                   guard=lambda f: f, send_facts=lambda facts: None, note=lambda text: None, script=None)
    comm.nccl_times[id(group)] = times
    comm._nccl_timed[1] = 0  # hooked: the timer's buckets say how many bytes travel
    comm._closed_at[0] = 10.5
    for start, dur in ((10.0, 1.0), (10.1, 1.5), (10.6, 1.0)):  # two collectives of step 0, one of step 1
        group.hook(info(start, dur))
    rec = {"step": 0, "comm_ms": 6.0, "buckets": 1.0, "comm_bytes": 4096.0}
    (out,) = comm.with_nccl_times([rec], flush=False)
    assert out["hook_ms"] == 6.0 and out["comm_ms"] == pytest.approx(2.5)
    assert out["buckets"] == 1.0 and out["comm_bytes"] == 4096.0
    # a step whose hook span was not stamped (GPU: every 10th step) still gets the collectives
    comm._closed_at[1] = 10.7
    group.hook(info(10.8, 1.0))
    (plain,) = comm.with_nccl_times([{"step": 1, "exposed_comm_ms": 1.6}], flush=False)
    assert plain["comm_ms"] == pytest.approx(1.0) and "hook_ms" not in plain
    # backward's return also waited for DDP's copy back: the exposed all-reduce is at most the
    # all-reduce (the wiring screen read "comm 34% of step, exposed 35%" on 2x H200)
    assert plain["exposed_comm_ms"] == pytest.approx(1.0)


def test_the_final_report_puts_the_hooks_own_work_beside_its_collectives():
    import json
    from pathlib import Path

    from ddptop.model.report import final_report

    line = (Path(__file__).parents[2] / "docs/measurements/2026-11-25-h100x2-commcheck-1.jsonl").read_text().splitlines()[1]
    summary = json.loads(line)  # the bf16 preset on 2x H100
    for r, hook in zip(summary["ranks"], (3.1, 3.0)):
        r["hook_ms_p50"] = hook
    text = final_report(summary, "/runs/x")
    assert "comm hook, p50 per rank: rank 0 3.1 ms, of which collectives 2.0 ms, rank 1 3.0 ms" in text


def test_a_capture_under_a_hook_reports_the_hook_span_beside_the_collectives_timer():
    import json
    from pathlib import Path

    from ddptop.model.report import final_report

    lines = (Path(__file__).parents[2] / "docs/measurements/2026-11-26-h200x2-call3/commcheck.jsonl").read_text().splitlines()
    powersgd = json.loads(lines[2])  # the powersgd preset on 2x H200: tiny collectives, a long hook
    assert powersgd["spec"] == "--preset powersgd"
    text = final_report(powersgd, "/runs/x")
    # the collectives' timer reads 1.05 of the trace's NCCL kernels; the hook's span, like with like, 1.00
    assert "(ddptop timer / trace = 1.05; hook span 1.00)" in text
    baseline = final_report(json.loads(lines[0]), "/runs/x")
    assert "(ddptop timer / trace = 1.00)" in baseline and "hook span" not in baseline


def nccl_timed_comm(monkeypatch, now: float):
    """A DdpComm timed by NCCL's completion hook on a fake group, its clock stopped at `now`:
    (the clock, the group whose hook reports, the DdpComm)."""
    from ddptop.rank import ddp_comm
    from ddptop.rank.ddp_comm import DdpComm
    from ddptop.rank.steps import StepTracker

    monkeypatch.setenv("TORCH_NCCL_ENABLE_TIMING", "1")
    clock = {"now": now}
    monkeypatch.setattr(ddp_comm.time, "monotonic", lambda: clock["now"])
    group = Group()
    comm = DdpComm(torch, StepTracker(None), True, 10, cuda=lambda: True, capturing=lambda: False,
                   guard=lambda f: f, send_facts=lambda facts: None, note=lambda text: None, script=None)
    comm.nccl_times[id(group)] = NcclTimes.attach(dist_for(group), group)
    return clock, group, comm


def test_a_fast_steps_record_waits_for_nccls_report_by_time_not_by_a_count_of_steps(monkeypatch):
    """8 ms steps: NCCL's watchdog reports ~0.1 s after a kernel ends, so a record released
    after 4 more steps (32 ms) mostly went without comm_ms (a toy model on 2x H200: 35 of 130
    steps timed). A record now waits up to HOLD_S for its report."""
    from ddptop.rank.ddp_comm import HOLD_S

    clock, group, comm = nccl_timed_comm(monkeypatch, 100.0)
    out = []
    for step in range(10):  # ten 8 ms steps, NCCL silent meanwhile
        clock["now"] += 0.008
        comm._closed_at[step] = clock["now"]
        out += comm.with_nccl_times([{"step": step}], flush=False)
    assert out == []  # 80 ms: every record still waits (it was let go after 4 steps before)
    group.hook(info(100.001, 1.5))  # step 0's all-reduce, reported now
    group.hook(info(100.010, 1.0))  # step 1's: step 0 is complete (one all-reduce a step)...
    clock["now"] += 0.001
    first, second = comm.with_nccl_times([], flush=False)  # ...so step 1's one is all of it
    assert first["step"] == 0 and first["comm_ms"] == pytest.approx(1.5)
    assert second["step"] == 1 and second["comm_ms"] == pytest.approx(1.0)
    clock["now"] += HOLD_S  # nothing more reported: the rest go without comm_ms
    rest = comm.with_nccl_times([], flush=False)
    assert [r["step"] for r in rest] == list(range(2, 10)) and all("comm_ms" not in r for r in rest)


def test_a_step_is_complete_when_its_count_of_all_reduces_is_reported(monkeypatch):
    """HF's Trainer gathers its token count before the next step's gradients: no later
    all-reduce comes for a step's time, so a step is complete once it has as many reported
    all-reduces as the last step proven complete (but never with fewer)."""
    clock, group, comm = nccl_timed_comm(monkeypatch, 200.0)
    comm._closed_at.update({0: 200.1, 1: 200.2})
    for start in (200.01, 200.02, 200.11, 200.12, 200.21):  # two buckets a step; step 2 began
        group.hook(info(start, 1.0))
    group.hook(info(200.15, 5.0, OpType.ALLGATHER))  # not gradients
    out = comm.with_nccl_times([{"step": 0}, {"step": 1}], flush=False)
    assert [r["comm_ms"] for r in out] == pytest.approx([2.0, 2.0])
    comm._closed_at[2] = 200.3
    group.hook(info(200.25, 5.0, OpType.ALLGATHER))
    assert comm.with_nccl_times([{"step": 2}], flush=False) == []  # one of two: it waits
    group.hook(info(200.22, 1.0))
    assert [r["comm_ms"] for r in comm.with_nccl_times([], flush=False)] == pytest.approx([2.0])


class FakeClock:
    """ddptop.rank.kernel_clock.KernelClock's reading, as NcclTimes asks it."""

    def __init__(self, kernels):
        self.kernels, self.asked = kernels, []

    def drain(self):
        self.asked.append("drain")

    def kernel_ms(self, issued, comm):
        self.asked.append((issued, comm))
        return self.kernels.pop(0), 7


def test_the_kernels_own_time_replaces_nccls_span_where_the_plugin_has_it(monkeypatch):
    monkeypatch.setenv("TORCH_NCCL_ENABLE_TIMING", "1")
    group = Group()
    times = NcclTimes.attach(dist_for(group), group)
    times.clock = FakeClock([0.17, None])
    group.hook(info(10.0, 0.19))  # NCCL's span: the kernel's launch included
    group.hook(info(10.1, 0.21))
    group.hook(info(10.6, 0.3))
    assert times.take(10.5, kernel=True) == pytest.approx([0.17, 0.21])  # no kernel record: the span
    assert times.clock.asked == ["drain", (10.0, None), (10.1, 7)]  # the group's communicator, once known
    assert times.take(11.0) == pytest.approx([0.3])  # a step the plugin did not stamp: NCCL's span


class SampledClock(FakeClock):
    """A plugin NCCL loaded: it stamps the kernels of the steps DdpComm switches it on for."""

    def __init__(self, kernels):
        super().__init__(kernels)
        self.on, self.matched = [], 2

    def enable(self, on):
        self.on.append(on)

    def loaded(self):
        return True


def test_the_plugin_stamps_one_step_in_every_and_only_those_steps_carry_comm_ms(monkeypatch):
    """Its kernel stamps keep NCCL's proxy thread polling (Lightning +1.3% a step when on at
    every step, 2x H100): on for one step in `every` (and every step of a capture), and a
    step it did not stamp carries no comm_ms rather than NCCL's span (launch included)."""
    clock, group, comm = nccl_timed_comm(monkeypatch, 100.0)
    plugin = SampledClock([0.9, 0.8])
    comm.clock = plugin
    for times in comm.nccl_times.values():
        times.clock = plugin
    comm.set_timed(10)  # 10 % 10 == 0: stamped; it starts on, so nothing to switch
    comm.set_timed(11)
    comm.set_timed(12)
    assert plugin.on == [False] and comm._kernel_steps == {0, 10}  # on from the start: step 0 too
    comm._closed_at.update({10: 100.05, 11: 100.15})
    for start, dur in ((100.01, 1.0), (100.02, 1.1), (100.11, 1.2), (100.2, 1.3)):
        group.hook(info(start, dur))
    ten, eleven = comm.with_nccl_times([{"step": 10}, {"step": 11}], flush=False)
    assert ten["comm_ms"] == pytest.approx(1.7) and ten["buckets"] == 2.0  # the kernels' 0.9 + 0.8
    assert "comm_ms" not in eleven  # NCCL's span of 1.2 ms is not the kernel's
    comm.pause()
    comm.resume(20)
    assert plugin.on == [False, False, True]  # bypassed: off; engaged again at a stamped step


def test_the_report_says_whose_clock_the_all_reduce_times_are_and_what_it_missed(monkeypatch):
    from ddptop.model.report import clock_lines

    clock, group, comm = nccl_timed_comm(monkeypatch, 100.0)
    said = []
    comm.send_facts = said.append
    plugin = SampledClock([0.9, None])
    plugin.dropped = lambda: 0
    comm.clock = plugin
    for times in comm.nccl_times.values():
        times.clock = plugin
    comm._closed_at[0] = 100.05
    group.hook(info(100.01, 1.0))
    group.hook(info(100.02, 1.1))
    plugin.matched, plugin.missed = 1, 1  # what KernelClock counts as it matches
    (rec,) = comm.with_nccl_times([{"step": 0}], flush=True)
    assert rec["comm_ms"] == pytest.approx(2.0)  # 0.9 from the kernel, 1.1 NCCL's span stood in
    clock_fact, missed_fact = said
    assert "the kernel's own time of each all-reduce, on one step in 10" in clock_fact["comm_clock"]
    assert missed_fact == {"comm_clock_missed": "1 of 2 all-reduces on stamped steps had no kernel record "
                                                 "(NCCL's span stood in); the plugin dropped 0"}
    ranks = [{"rank": 0, "info": {**clock_fact, **missed_fact}},
             {"rank": 1, "info": {"comm_clock": "NCCL's own timing (no cc)"}}]
    assert clock_lines({"ranks": ranks}) == [
        f"all-reduce time, rank 0: {clock_fact['comm_clock']}",
        "all-reduce time, rank 1: NCCL's own timing (no cc)",
        f"rank 0: {missed_fact['comm_clock_missed']}"]
    assert clock_lines({"ranks": ranks[1:]}) == ["all-reduce time: NCCL's own timing (no cc)"]


def test_a_first_stamped_step_without_a_record_does_not_settle_whose_clock_it_is(monkeypatch):
    clock, group, comm = nccl_timed_comm(monkeypatch, 100.0)
    said = []
    comm.send_facts = said.append
    plugin = SampledClock([None, 0.5])
    plugin.matched = 0  # NCCL loaded the plugin; its first record is not in yet
    comm.clock = plugin
    for times in comm.nccl_times.values():
        times.clock = plugin
    comm._kernel_steps = {0, 1}
    comm._closed_at.update({0: 100.05, 1: 100.15})
    group.hook(info(100.01, 1.0))
    group.hook(info(100.11, 1.1))
    group.hook(info(100.2, 1.0))
    comm.with_nccl_times([{"step": 0}], flush=False)
    plugin.matched = 1
    comm.with_nccl_times([{"step": 1}], flush=False)
    assert [f["comm_clock"][:40] for f in said] == ["NCCL's own timing of each all-reduce, st",
                                                    "the kernel's own time of each all-reduce"]
