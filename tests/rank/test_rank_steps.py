"""The step tracker on scripted event sequences: the loops users write, a fake clock."""

import pytest

from ddptop.rank.steps import (
    MAX_SPANS,
    StepTracker,
    bounded_spans,
    offsets,
    phase_of,
    record,
    summarize_comm,
)


class FakeClock:
    """Time advances only when a test says so; stamps are plain floats in ms."""

    def __init__(self):
        self.now = 0.0

    def stamp(self):
        return self.now

    def elapsed(self, a, b):
        return b - a

    def done(self, stamp):
        return True

    def sync(self):
        pass

    def release(self, stamps):
        pass


def run(tracker, clock, events):
    """events: (ms to advance, event[, key or samples]). Returns steps closed."""
    closed = []
    for item in events:
        dt, kind, *arg = item
        clock.now += dt
        if kind == "opt":
            c = tracker.opt_begin(arg[0] if arg else "sgd")
        elif kind == "opt_end":
            c = tracker.opt_end(arg[0] if arg else "sgd")
        else:
            tracker.mark(kind, *arg)
            c = None
        if c is not None:
            closed.append(c)
    return closed


def plain_step(data=2, fwd=3, loss=1, bwd=4, comm_wait=1, opt=1, samples=32.0):
    return [(data, "fwd", samples), (fwd, "fwd_end"), (loss, "bwd"), (bwd, "bwd_end"),
            (comm_wait, "bwd_ret"), (0.5, "opt"), (opt, "opt_end")]


def test_plain_loop_phases_add_up_and_steps_close_once_the_cycle_is_known():
    clock, t = FakeClock(), None
    t = StepTracker(clock)
    closed = run(t, clock, plain_step() * 3)
    # the first step closes when the optimizer comes round again; later ones at once
    assert closed == [0, 1, 2]
    recs = t.ready(flush=True)
    assert [r["step"] for r in recs] == [0, 1, 2]
    later = recs[1]
    assert later["step_ms"] == pytest.approx(12.5)
    assert later["data_ms"] == pytest.approx(2.0)
    assert later["forward_ms"] == pytest.approx(4.0)  # model + loss
    assert later["backward_ms"] == pytest.approx(5.0)  # compute + the wait for the all-reduce
    assert later["optimizer_ms"] == pytest.approx(1.5)
    assert sum(later[k] for k in ("data_ms", "forward_ms", "backward_ms", "optimizer_ms")) == later["step_ms"]
    assert later["samples"] == 32.0
    assert recs[0]["data_ms"] == 0.0  # the first step starts at its first event


def test_gradient_accumulation_is_one_step_and_the_next_micro_batch_is_data():
    clock = FakeClock()
    t = StepTracker(clock)
    micro = [(2, "fwd", 8.0), (3, "fwd_end"), (1, "bwd"), (4, "bwd_end"), (0, "bwd_ret")]
    step = micro * 4 + [(0.5, "opt"), (1, "opt_end")]
    assert run(t, clock, step * 3) == [0, 1, 2]
    rec = t.ready()[1]
    assert rec["samples"] == 32.0
    assert rec["data_ms"] == pytest.approx(8.0)  # 4 fetches of 2 ms
    assert rec["forward_ms"] == pytest.approx(16.0) and rec["backward_ms"] == pytest.approx(16.0)


def test_two_optimizers_after_one_backward_are_one_step():
    clock = FakeClock()
    t = StepTracker(clock)
    step = [(2, "fwd"), (3, "fwd_end"), (1, "bwd"), (4, "bwd_end"), (0, "bwd_ret"),
            (0.5, "opt", "a"), (1, "opt_end", "a"), (0.2, "opt", "b"), (1, "opt_end", "b")]
    assert run(t, clock, step * 4) == [0, 1, 2, 3]
    rec = t.ready(flush=True)[2]
    assert rec["optimizer_ms"] == pytest.approx(2.7)


def test_gan_style_two_forwards_two_optimizers_one_step_each_iteration():
    clock = FakeClock()
    t = StepTracker(clock)
    d = [(1, "fwd"), (1, "fwd_end"), (1, "bwd"), (1, "bwd_end"), (0, "bwd_ret"), (0, "opt", "d"), (1, "opt_end", "d")]
    g = [(1, "fwd"), (1, "fwd_end"), (1, "bwd"), (1, "bwd_end"), (0, "bwd_ret"), (0, "opt", "g"), (1, "opt_end", "g")]
    assert run(t, clock, (d + g) * 5) == [0, 1, 2, 3, 4]


def wgan_round(critic_steps=5):
    def one(key):
        return [(1, "fwd", 16.0 if key == "d" else 0.0), (1, "fwd_end"), (1, "bwd"), (1, "bwd_end"), (0, "bwd_ret"),
                (0, "opt", key), (1, "opt_end", key)]
    return [e for _ in range(critic_steps) for e in one("d")] + one("g")


def test_optimizers_at_different_rates_count_the_frequent_ones_steps_and_say_so():
    """A WGAN: 5 critic steps, then one generator step. A step is a critic step (the
    generator's falls inside the next one); the generator's last step, after the last critic
    step, is no step of its own (it was: 16 steps and 15.0 samples a step for 15 and 16.0)."""
    clock = FakeClock()
    t = StepTracker(clock)
    assert run(t, clock, wgan_round() * 3) == list(range(15))
    assert t.finish() is None
    recs = t.ready(flush=True)
    assert len(recs) == 15 and sum(r["samples"] for r in recs) / len(recs) == 16.0
    assert t.rates_differ


def test_an_optimizer_that_steps_in_the_first_iteration_only_now_and_then_leaves_the_cycle():
    """Teacher/student: the teacher steps with the student in the first iteration and every
    4th after. A step is a student's step; the last one counts (it read 11 steps of 12)."""
    clock = FakeClock()
    t = StepTracker(clock)
    def iteration(i):
        one = [(1, "fwd", 16.0), (1, "fwd_end"), (1, "bwd"), (1, "bwd_end"), (0, "bwd_ret")]
        teacher = [*one, (0, "opt", "t"), (1, "opt_end", "t")] if i % 4 == 0 else []
        return [*teacher, *one, (0, "opt", "s"), (1, "opt_end", "s")]
    closed = run(t, clock, [e for i in range(12) for e in iteration(i)])
    assert closed == list(range(12)) and t.finish() is None and t.rates_differ


def test_optimizers_at_one_rate_are_not_said_to_differ():
    clock = FakeClock()
    t = StepTracker(clock)
    assert run(t, clock, wgan_round(critic_steps=1) * 4) == [0, 1, 2, 3]
    assert t.finish() is None and not t.rates_differ


def test_lightning_closure_runs_forward_and_backward_inside_the_optimizer_step():
    clock = FakeClock()
    t = StepTracker(clock)
    step = [(2, "opt"), (0.5, "fwd"), (3, "fwd_end"), (1, "bwd"), (4, "bwd_end"), (1, "bwd_ret"), (1, "opt_end")]
    run(t, clock, step * 3)
    rec = t.ready(flush=True)[1]
    assert rec["data_ms"] == pytest.approx(2.5)  # the loop's own work before the closure
    assert rec["forward_ms"] == pytest.approx(4.0)
    assert rec["backward_ms"] == pytest.approx(5.0)
    assert rec["optimizer_ms"] == pytest.approx(1.0)


def test_grad_scaler_step_around_optimizer_step_counts_once_even_when_skipped():
    clock = FakeClock()
    t = StepTracker(clock)
    nested = [(2, "fwd"), (1, "fwd_end"), (1, "opt", "scaler"), (0, "opt", "sgd"), (1, "opt_end", "sgd"),
              (0, "opt_end", "scaler")]
    skipped = [(2, "fwd"), (1, "fwd_end"), (1, "opt", "scaler"), (0, "opt_end", "scaler")]
    assert run(t, clock, nested + skipped + nested + nested) == [0, 1, 2, 3]


def test_phase_rules():
    assert phase_of("start", "fwd") == "data"
    assert phase_of("bwd_ret", "fwd") == "data"
    assert phase_of("bwd_end", "bwd_ret") == "backward"
    assert phase_of("bwd_end", "opt") == "optimizer"
    assert phase_of("opt", "fwd") == "data"
    assert phase_of("fwd_end", "opt") == "forward"


def test_keep_last_holds_the_newest_step_for_the_scripts_own_values():
    clock = FakeClock()
    t = StepTracker(clock)
    run(t, clock, plain_step() * 3)
    assert [r["step"] for r in t.ready(keep_last=True)] == [0, 1]
    t.last_closed["loss"] = 0.5
    assert t.ready(keep_last=True) == []
    assert t.ready(keep_last=True, flush=True)[0]["loss"] == 0.5


def test_finish_closes_a_step_whose_optimizer_stepped():
    clock = FakeClock()
    t = StepTracker(clock)
    run(t, clock, plain_step())
    assert t.finish() == 0
    assert t.finish() is None


def test_comm_summary_with_and_without_completion_stamps():
    elapsed = lambda a, b: b - a  # noqa: E731
    marks = [("start", 0.0, 0), ("fwd", 1.0, 0), ("bwd", 5.0, 0), ("bwd_end", 60.0, 0), ("bwd_ret", 75.0, 0)]
    both = [[10.0, 30.0, 100], [50.0, 70.0, 300]]  # hand-over, completion, bytes
    at = offsets(marks, elapsed)
    out = summarize_comm(both, marks, elapsed, at)
    assert out["comm_ms"] == pytest.approx(40.0) and out["exposed_comm_ms"] == pytest.approx(20.0)
    assert out["buckets"] == 2 and out["comm_bytes"] == 400
    assert out["comm_spans"] == [[10.0, 30.0], [50.0, 70.0]]  # for the live timeline, in hand-over order
    untimed = [[None, None, 100], [None, None, 300]]
    out = summarize_comm(untimed, marks, elapsed, at)
    assert "comm_ms" not in out and out["exposed_comm_ms"] == pytest.approx(15.0)


def test_a_stamp_is_read_once_and_exposed_comes_from_the_backward_that_waited():
    reads = []

    def elapsed(a, b):
        reads.append((a, b))
        return b - a

    same = 40.0
    # two micro-batches: the first under no_sync (no return mark), the second waited for DDP
    marks = [("start", 0.0, 0), ("fwd", 1.0, 8), ("fwd_end", 3.0, 0), ("bwd", 4.0, 0), ("bwd_end", 9.0, 0),
             ("fwd", 10.0, 8), ("fwd_end", 12.0, 0), ("bwd", 13.0, 0), ("bwd_end", 20.0, 0), ("bwd_ret", 26.0, 0),
             ("opt", same, 0), ("opt_end", same, 0)]
    rec = record(3, marks, [], {}, elapsed, comm_elsewhere=True)
    assert len(reads) == len(marks) - 2  # every stamp but the start, the shared one once
    assert rec["step_ms"] == 40.0 and rec["exposed_comm_ms"] == pytest.approx(6.0)
    assert rec["data_ms"] + rec["forward_ms"] + rec["backward_ms"] + rec["optimizer_ms"] == pytest.approx(40.0)
    assert rec["data_ms"] == pytest.approx(1.0 + 1.0) and rec["samples"] == 16
    # a last backward under no_sync (the script syncs by hand): no exposed wait is made up
    lone = [*marks[:5], ("opt", 11.0, 0), ("opt_end", 12.0, 0)]
    assert "exposed_comm_ms" not in record(0, lone, [], {}, lambda a, b: b - a, comm_elsewhere=True)


def test_comm_entries_go_with_the_step_they_were_handed_over_in():
    clock = FakeClock()
    t = StepTracker(clock)
    for i in range(3):
        for item in plain_step():
            clock.now += item[0]
            if item[1] == "opt":
                t.opt_begin("sgd")
            elif item[1] == "opt_end":
                t.opt_end("sgd")
            else:
                t.mark(item[1], *item[2:])
            if item[1] == "bwd":
                t.add_comm([clock.now, clock.now + 2, 10 * (i + 1)])
    recs = t.ready(flush=True)
    assert [r["comm_bytes"] for r in recs] == [10.0, 20.0, 30.0]


def test_comm_timed_elsewhere_gives_exposed_comm_from_backwards_events_every_step():
    clock = FakeClock()
    tracker = StepTracker(clock)
    tracker.comm_elsewhere = True  # NCCL's own timing: no per-bucket entries come
    steps = [(1, "fwd"), (2, "fwd_end"), (0, "bwd"), (5, "bwd_end"), (1.5, "bwd_ret"), (0, "opt"), (1, "opt_end")]
    run(tracker, clock, steps * 2)
    recs = tracker.ready(flush=True)
    assert [r["exposed_comm_ms"] for r in recs] == [1.5, 1.5]
    assert all("comm_ms" not in r and "buckets" not in r for r in recs)
    plain = StepTracker(FakeClock())  # no DDP: nothing about communication
    run(plain, plain.clock, steps * 2)
    assert all("exposed_comm_ms" not in r for r in plain.ready(flush=True))


def test_many_buckets_are_merged_pairwise_to_what_the_wire_takes():
    from ddptop.wire.protocol import MAX_SPANS as WIRE_MAX

    assert MAX_SPANS == WIRE_MAX
    spans = [(i * 1.0, i * 1.0 + 0.51234567) for i in range(301)]
    out = bounded_spans(spans)
    assert len(out) <= MAX_SPANS and out[0][0] == 0.0 and out[-1][1] == 300.512
    assert all(a <= b for a, b in out) and all(out[i][1] <= out[i + 1][0] for i in range(len(out) - 1))
    assert bounded_spans([(1.23456789, 2.0)]) == [[1.235, 2.0]]


def test_a_backward_under_no_sync_gets_no_return_mark_unless_a_syncing_forward_feeds_it():
    """BackwardMarks on real autograd (CPU): a backward waits for DDP (a return mark) when any
    forward watched since the last backward syncs; under no_sync alone its compute end ends it."""
    torch = pytest.importorskip("torch")
    from ddptop.rank.forward_hooks import BackwardMarks

    class Clock:
        n = 0

        def stamp(self):
            Clock.n += 1
            return float(Clock.n)

    tracker = StepTracker(Clock())
    marks = BackwardMarks(torch, tracker, guard=lambda fn: fn)
    w = torch.ones(3, requires_grad=True)

    def micro_batch(*waits):
        losses = [(w * 2).sum() for _ in waits]
        for loss, wait in zip(losses, waits):
            marks.watch(loss, wait)
        sum(losses).backward()
        return [kind for kind, _, _ in tracker.marks]

    assert micro_batch(False)[-2:] == ["bwd", "bwd_end"]  # no_sync: no return
    assert micro_batch(True)[-3:] == ["bwd", "bwd_end", "bwd_ret"]
    assert micro_batch(True, False)[-3:] == ["bwd", "bwd_end", "bwd_ret"]  # two models, one syncs
    assert micro_batch(False)[-2:] == ["bwd", "bwd_end"]


def test_closure_calls_inside_an_optimizer_step_are_the_optimizers_time():
    """LBFGS: data, then opt.step() calls its closure 3 times (forward, backward each) with 2 ms
    of line search between calls: those 4 ms are the optimizer's, not data (issue 43)."""
    clock = FakeClock()
    t = StepTracker(clock)
    closure = [(0, "fwd", 8.0), (1, "bwd"), (2, "bwd_end"), (0, "bwd_ret")]
    step = [(0.5, "opt"), *closure, (2, *closure[0][1:]), *closure[1:], (2, *closure[0][1:]), *closure[1:],
            (1, "opt_end")]
    assert run(t, clock, step + step) == [0, 1]
    rec = t.ready(flush=True)[1]  # the second: its time from the first's end
    assert rec["data_ms"] == pytest.approx(0.5)
    assert rec["optimizer_ms"] == pytest.approx(2 + 2 + 1)
    assert rec["forward_ms"] + rec["backward_ms"] == pytest.approx(9)
    assert rec["samples"] == 24.0  # the tracker sums what it is given: the sample count gives the closure's first call only
