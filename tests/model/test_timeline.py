"""The step timeline (issue 21): a known step's spans land at the right columns."""

from ddptop.model.timeline import step_timeline
from ddptop.tui.widgets.step_timeline import LABEL_W, timeline_lines

# 100 ms: data 10, forward 20, backward 50 (of which the last 10 wait for the all-reduce),
# optimizer 15, 5 unaccounted; the all-reduce is in flight for the last 30 ms of backward.
STEP = {"step": 7, "step_ms": 100.0, "data_ms": 10.0, "forward_ms": 20.0, "backward_ms": 50.0,
        "exposed_comm_ms": 10.0, "optimizer_ms": 15.0, "comm_ms": 30.0}


def test_spans_in_ms():
    tl = step_timeline(STEP)
    assert tl is not None and tl.step == 7 and tl.step_ms == 100.0
    assert [(s.what, s.start_ms, s.end_ms) for s in tl.lane] == [
        ("data", 0, 10), ("forward", 10, 30), ("backward", 30, 70), ("exposed", 70, 80),
        ("optimizer", 80, 95), ("other", 95, 100)]
    assert (tl.comm.start_ms, tl.comm.end_ms) == (50.0, 80.0)
    assert tl.hidden_ms == 20.0  # 30 in flight, 10 of them after compute ended


def test_spans_at_the_right_columns():
    tl = step_timeline(STEP)
    cols = {s.what: tl.columns(s, 50) for s in tl.lane}
    assert cols == {"data": (0, 5), "forward": (5, 15), "backward": (15, 35), "exposed": (35, 40),
                    "optimizer": (40, 48), "other": (48, 50)}
    assert tl.columns(tl.comm, 50) == (25, 40)


def test_the_drawn_lanes_match_the_columns():
    header, lane, comm, scale = timeline_lines(step_timeline(STEP), LABEL_W + 50)
    bar = lane.plain[LABEL_W:]
    assert bar == "█" * 35 + "▒" * 5 + "█" * 8 + "·" * 2
    assert comm.plain[LABEL_W:] == " " * 25 + "▀" * 15
    assert "all-reduce 30.0 ms: 20.0 hidden under backward (67%), 10.0 exposed" in header.plain
    assert scale.plain.endswith("100.0 ms")
    # colours by phase: data's cells are data's colour, forward's forward's
    styles = {str(span.style) for span in lane.spans}
    assert len(styles) >= 5


def test_no_comm_timed_and_no_record():
    rec = {k: v for k, v in STEP.items() if k != "comm_ms"}
    tl = step_timeline(rec)
    assert tl.comm is None and tl.hidden_ms is None
    assert "not timed" in timeline_lines(tl, 60)[2].plain
    assert step_timeline({"step": 1}) is None
    assert timeline_lines(None, 60)[0].plain == "no step recorded yet"


def test_a_tiny_span_still_gets_a_column():
    rec = {**STEP, "data_ms": 0.1, "step_ms": 90.1}
    tl = step_timeline(rec)
    a, b = tl.columns(tl.lane[0], 20)
    assert b - a == 1


# The same step with the buckets' own spans (hand-over, completion; ms from the step's
# start): three buckets handed over during backward's compute (30..70), going out one at a
# time; the last completes at 80, when backward returns.
SPANS = ((40.0, 52.0), (45.0, 66.0), (60.0, 80.0))


def test_buckets_are_laid_out_where_they_were():
    tl = step_timeline(STEP, SPANS)
    # each bucket from the previous one's completion (or its own hand-over) to its own completion
    assert [(b.start_ms, b.end_ms) for b in tl.buckets] == [(40, 52), (52, 66), (66, 80)]
    assert (tl.comm.start_ms, tl.comm.end_ms) == (40.0, 80.0)
    assert tl.in_flight_ms == 40.0  # the union of the spans
    assert tl.hidden_ms == 30.0  # 40..70 ran under backward's compute, 70..80 was the wait
    assert [tl.columns(b, 50) for b in tl.buckets] == [(20, 26), (26, 33), (33, 40)]


def test_the_bucket_lane_is_drawn_at_those_columns_in_alternating_shades():
    header, lane, buckets, scale = timeline_lines(step_timeline(STEP, SPANS), LABEL_W + 50)
    assert buckets.plain.startswith("buckets")
    assert buckets.plain[LABEL_W:] == " " * 20 + "▀" * 20 + " " * 10
    shade = {c: str(span.style) for span in buckets.spans for c in range(span.start, span.end)}
    first, second, third = (shade[LABEL_W + c] for c in (20, 26, 33))
    assert first != second and first == third
    assert {shade[LABEL_W + c] for c in range(20, 26)} == {first}
    assert "all-reduce 40.0 ms in 3 buckets: 30.0 hidden under backward (75%), 10.0 exposed" in header.plain


def test_a_gap_between_buckets_is_not_counted_in_flight():
    tl = step_timeline(STEP, ((35.0, 40.0), (60.0, 80.0)))
    assert tl.in_flight_ms == 25.0 and tl.hidden_ms == 15.0
    assert [(b.start_ms, b.end_ms) for b in tl.buckets] == [(35, 40), (60, 80)]


def test_a_rank_shows_the_newest_step_that_has_spans_while_it_is_recent():
    from ddptop.model.rank_state import RankState

    rs = RankState(0)
    assert rs.timeline_record() == (None, ())
    for step in range(5):
        rs.add({**STEP, "step": step}, warmup=0, now=0.0)
    assert rs.timeline_record() == (rs.recent[-1], ())  # no spans: the newest step, as it is
    rs.add_spans({2: SPANS, 1: ((1.0, 2.0),)})
    rec, spans = rs.timeline_record()
    assert rec["step"] == 2 and spans == SPANS
    for step in range(5, 300):  # step 2 leaves the recent window: back to the newest step
        rs.add({**STEP, "step": step}, warmup=0, now=0.0)
    assert rs.timeline_record() == (rs.recent[-1], ())


def test_only_the_labels_are_dim_not_the_bars():
    """A Text's own style is the base of all of it: labels are dim spans, so the phase
    colours of the bars are drawn as they are."""
    for line in timeline_lines(step_timeline(STEP, SPANS), LABEL_W + 50)[1:3]:
        assert "dim" not in str(line.style)
        assert all("dim" not in str(span.style) for span in line.spans if span.start >= LABEL_W)


def test_without_spans_a_rank_shows_the_newest_step_whose_all_reduce_was_timed():
    """ddptop's NCCL plugin stamps one step in 10: the nine between carry no comm_ms, and the
    timeline of the newest of them could only say the all-reduce was not timed."""
    from ddptop.model.rank_state import RankState

    rs = RankState(0)
    untimed = {k: v for k, v in STEP.items() if k != "comm_ms"}
    for step in range(12):
        rs.add({**(STEP if step % 10 == 0 else untimed), "step": step}, warmup=0, now=0.0)
    rec, spans = rs.timeline_record()
    assert rec["step"] == 10 and "comm_ms" in rec and spans == ()
    lines = timeline_lines(step_timeline(untimed), 80)
    assert "a GPU times one step in comm_timing_every" in lines[2].plain


def _bucket_line(header: str) -> tuple[float, float, float]:
    import re
    m = re.search(r"all-reduce ([\d.]+) ms.*?: ([\d.]+) hidden under backward \(\d+%\), ([\d.]+) exposed", header)
    assert m, header
    return float(m[1]), float(m[2]), float(m[3])


def test_hidden_plus_exposed_is_the_all_reduce_on_every_step():
    """Issue 46 point 1: the line read `1.0 ms in 1 bucket: 1.0 hidden (100%), 1.0 exposed`:
    its exposed was the wait lane, not the all-reduce's unhidden part. Any step, any spans:
    hidden + exposed = in flight (to the printed digit); the wait, when it differs, is named apart."""
    import random

    rng = random.Random(46)
    for _ in range(400):
        data, fwd, bwd = rng.uniform(0, 5), rng.uniform(0.5, 10), rng.uniform(0.5, 20)
        wait = rng.uniform(0, bwd)
        rec = {"step": 3, "step_ms": data + fwd + bwd + 2, "data_ms": data, "forward_ms": fwd,
               "backward_ms": bwd, "exposed_comm_ms": wait, "optimizer_ms": 1.0,
               "comm_ms": rng.uniform(0.1, bwd + 5)}
        end = data + fwd + bwd
        spans = tuple(sorted((a, a + rng.uniform(0.05, 6)) for a in
                             (rng.uniform(data + fwd, end) for _ in range(rng.randint(0, 4)))))
        header = timeline_lines(step_timeline(rec, spans), 80)[0].plain
        total, hidden, exposed = _bucket_line(header)
        assert abs(hidden + exposed - total) <= 0.1 + 1e-9, header
        if "wait" in header:
            assert "backward's wait after compute" in header


def test_a_bucket_done_before_compute_ends_is_all_hidden_and_the_wait_is_named_apart():
    # the reading: 1 ms in flight under compute, then a 1 ms wait after compute
    rec = {"step": 0, "step_ms": 6.0, "data_ms": 0.0, "forward_ms": 1.0, "backward_ms": 4.0,
           "exposed_comm_ms": 1.0, "optimizer_ms": 1.0}
    header = timeline_lines(step_timeline(rec, ((1.5, 2.5),)), 80)[0].plain
    assert "all-reduce 1.0 ms in 1 bucket: 1.0 hidden under backward (100%), 0.0 exposed" in header
    assert "backward's wait after compute 1.0 ms" in header
