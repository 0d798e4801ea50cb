"""Which steps the rank-side layer times: every step at first, then one step in K.

What the layer costs a step is its hooks' (docs/BENCHMARKS.md, session 15: +0.7 ms a step of a
launch-bound GPT at one rank, nine CUDA-event stamps and the forward and backward hooks of its
micro-batches: 2-3% of its 35 ms step). Engaged one step in K, it costs about 1/K of that: the other
steps run with its forward hooks removed and no stamp, as cost_ab's bypassed arm does (the
instrument's `_engage`), and send no record; the optimizer hooks still count every step, so the
agreed stop and the step limit stay exact. The figures are then the engaged steps' (a sample of the
run's steps; every rank the same ones).

`phase_every=0` (auto, the default): every step for the first FULL_STEPS, then K the smallest power
of two with K steps at least SPACING_S apart (the median of the last steps' host time, boundary to
boundary), at most MAX_K, chosen again every FULL_STEPS steps, and a step timed at least every
MAX_GAP_S whatever K (steps that slow down): a 35 ms step is timed one in 8 (its hooks' ~0.7 ms
then ~0.3% of the run), a 1 s step every step. A step is engaged when its index is a multiple of K:
ranks whose K differ (a power of two each) still share the multiples of the larger one.
`phase_every=K` fixes K (1: every step). A capture window's steps, and the two before it that start
its profiler, are engaged. Not with cost_ab, which switches the layer itself. Pure: no torch, no I/O.
"""

from __future__ import annotations

import collections
import sys
import time
from collections.abc import Callable
from typing import Any

from ddptop.rank.capture import WARMUP_STEPS

FULL_STEPS = 50  # every step timed at first (start-up, compilation, the first live view)
SPACING_S = 0.25  # auto: timed steps at least this far apart, a few records a second for the live view
MAX_K = 64
PERIODS = 15  # the steps whose median host time decides K
MAX_GAP_S = 1.0  # auto: a step is timed at least this often (the stall rule waits 10 s or more)
# a capture window from step S: the steps from S - WARMUP_STEPS - 1 on are timed (the boundary after
# step `s` engages step s + 1 when s + CAPTURE_LEAD >= S), for the close of the first of them begins
# the profiler's warm-up steps: not every step from when the window is asked for
CAPTURE_LEAD = WARMUP_STEPS + 2


# `ddptop cost --lockstep`: its stamp (ddptop.rank.stamp) keeps the seconds this rank waited for its
# turn (the other job's step) in this module's `total_s`; without them the job's pace, K and spans
# read as the job alone would have them (session 17: K = 4 in turns against 16 alone)
TURN_WAIT_MODULE = "_ddptop_turn_wait"


def working_clock() -> float:
    """The host's clock less the time this rank waited for its turn in a lock-step cost run."""
    return time.perf_counter() - getattr(sys.modules.get(TURN_WAIT_MODULE), "total_s", 0.0)


class PhaseEvery:
    def __init__(self, settings: dict[str, Any], sampled: Callable[[int], None] = lambda _k: None,
                 clock: Callable[[], float] | None = None) -> None:
        every = int(settings.get("phase_every", 0) or 0)
        self.auto = every == 0
        self.k = 1 if self.auto else max(1, every)
        self._sampled = sampled  # sampled(K): K has changed (the first time too, K > 1)
        # the lock-step clock only where a lock-step cost run's stamp opened its turns (at the
        # interpreter's start, before torch is imported and this is made): nothing more a step elsewhere
        self._clock = clock or (working_clock if TURN_WAIT_MODULE in sys.modules else time.perf_counter)
        if self.k > 1:
            sampled(self.k)
        self._at: float | None = None  # the last boundary's host time
        self._timed_at: float | None = None  # the boundary that began the last timed step
        self._step = -1  # the step that ended at the last boundary
        self._paced: tuple[float, int] | None = None  # (host time, step) of the last pace()
        self._periods: collections.deque[float] = collections.deque(maxlen=PERIODS)

    @property
    def on(self) -> bool:
        return self.auto or self.k > 1

    def engaged_after(self, step: int, captures: Any, commands: Any) -> bool:
        """Whether the layer is engaged from the boundary after step `step` (0-based): steps whose
        index is a multiple of K, and every step while a command waits to be read (a capture's
        request) or a window is close (CAPTURE_LEAD steps), warming up or running. Auto: also the next step once MAX_GAP_S have passed
        since the last timed one (the steps slowed down: K is chosen again then), so records keep
        coming at least that often and a slow spell never reads as a stall."""
        late = self._learn(step) if self.auto else self._tick(step)
        engaged = late or (step + 1) % self.k == 0 or bool(commands) or captures is not None and (
            captures.active is not None or captures.warming is not None
            or any(step + CAPTURE_LEAD >= w.start for w in captures.scheduled))
        if engaged:
            self._timed_at = self._at
        return engaged

    def pace(self) -> dict[str, float]:
        """For the record of the step that begins now (a timed one): the steps since the previous
        call and their host time (the job's pace, the untimed steps' too); nothing the first time,
        nor where the step before was timed too (a span of one step would be that step's, a step
        late: its own record has it)."""
        at, step = self._at, self._step
        if at is None:
            return {}
        last, self._paced = self._paced, (at, step)
        if last is None or step - last[1] <= 1:  # every step timed: the record's own step_ms says it
            return {}
        return {"span_steps": float(step - last[1]), "span_ms": 1000.0 * (at - last[0])}

    def _tick(self, step: int) -> bool:
        """This boundary's host time (after step `step`)."""
        self._at, self._step = self._clock(), step
        return False

    def _learn(self, step: int) -> bool:
        """Take this boundary's host time; choose K every FULL_STEPS steps (or when late). Late: the
        last timed step is MAX_GAP_S ago."""
        now = self._clock()
        if self._at is not None:
            self._periods.append(now - self._at)
        self._at, self._step = now, step
        late = self._timed_at is not None and now - self._timed_at >= MAX_GAP_S
        if (step + 1) % FULL_STEPS and not late or not self._periods or step + 1 < FULL_STEPS:
            return False  # K is chosen every FULL_STEPS steps: it does not flap with each step's time
        period = sorted(self._periods)[len(self._periods) // 2]
        k = 1
        while k < MAX_K and k * period < SPACING_S:
            k *= 2
        if k != self.k:
            self.k = k
            self._sampled(k)
        return late
