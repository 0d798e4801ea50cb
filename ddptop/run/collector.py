"""Collector: the hub's sink. Every message from the ranks lands here and goes into the
run's state (and, for step records, the recorder on disk); capture reports go on to the
capture pipeline. Synchronous and UI-free: it never awaits, signals or launches.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from ddptop.model.state import RunState
from ddptop.model.status import RankStatus, rank_is_live
from ddptop.run.rank_procs import RankProcesses
from ddptop.run.recorder import Recorder
from ddptop.wire import protocol


class Collector:
    """A `ddptop.run.hub.HubSink` for one run."""

    def __init__(self, state: RunState, procs: RankProcesses,
                 on_capture: Callable[[protocol.CaptureReport], None] | None = None) -> None:
        self.state = state
        self.procs = procs  # who may connect (ranks of this node must be our processes)
        self.recorder: Recorder | None = None  # set once the run directory exists
        # where capture reports go (the capture pipeline); without one, none is expected
        self._on_capture = on_capture or self._unexpected_capture

    def hub_message(self, msg: protocol.Message, now: float) -> None:
        if isinstance(msg, protocol.CaptureReport):
            self._on_capture(msg)
            return
        if isinstance(msg, protocol.Command):  # ranks send none; the hub drops them before us
            self.state.drop("unexpected-command")
            return
        self.state.apply(msg, now)
        if isinstance(msg, protocol.Steps) and self.recorder is not None:
            self.recorder.record_steps(msg.rank, msg.records, msg.spans)

    def hub_dropped(self, reason: str) -> None:
        self.state.drop(reason)

    def hub_refused(self, reason: str) -> None:
        self.state.refused += 1
        n = self.state.refused
        if n <= 10 or n in (100, 1000) or n % 10000 == 0:  # a flood is counted, not logged line by line
            self.state.add_log(-1, f"[ddptop] refused a connection ({n} so far): {reason}")

    def hub_admit(self, hello: protocol.Hello) -> str | None:
        rs = self.state.ranks.get(hello.rank)
        # a rank that said goodbye has ended: a later hello in its name (a token holder's forgery,
        # which then vanishes) must not make a finished rank lost, and the run failed. A rank
        # whose connection dropped (lost) may come back.
        if rs is not None and rs.hello is not None and not rank_is_live(rs.status) and rs.status != RankStatus.LOST:
            return f"a hello for rank {hello.rank}, which has ended ({rs.status})"
        return self.procs.admit(hello)

    def hub_disconnected(self, rank: int) -> None:
        self.state.rank_disconnected(rank, time.time())

    def _unexpected_capture(self, msg: protocol.CaptureReport) -> None:
        self.state.drop("unknown-capture")
