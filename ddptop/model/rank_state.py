"""RankState: what one rank has reported (its recent records, whole-run histograms and
sums after warmup, its facts). Its figures (rates, shares, phase means) are computed by
ddptop.model.figures (run_window), its Histogram is figures.stats'.

Pure: no I/O, no asyncio, no UI. Bounded memory whatever the run length.
"""

from __future__ import annotations

import collections
from collections.abc import Iterable
from dataclasses import dataclass, field

from ddptop.model import figures
from ddptop.model.figures import Histogram
from ddptop.model.status import RankStatus, StatusField, rank_status
from ddptop.wire.protocol import PHASES, Fact, Hello

__all__ = ["RECENT", "Histogram", "RankState", "timed_every"]

RECENT = 256  # records kept per rank for live views
_PHASE_KEYS = tuple((p, p + "_ms") for p in PHASES)
# eval_ms: forwards without grad (validation, generation), apart from the four phases
_EXTRA_KEYS = ("comm_ms", "exposed_comm_ms", "comm_bytes", "buckets", "compressing", "eval_ms")


@dataclass
class RankState:
    rank: int
    hello: Hello | None = None
    status: str = StatusField(RankStatus.STARTING, rank_status)  # type: ignore[assignment]  # a RankStatus (or a goodbye reason ddptop does not know); see RunState.status
    steps: int = 0  # records received
    last_step: int = -1
    last_t: float = 0.0  # the rank's wall clock at its last step
    last_seen: float = 0.0  # our clock when its last record arrived
    lost_at: float | None = None  # our clock when it crashed, or its connection dropped without a goodbye
    recent: collections.deque[dict[str, float]] = field(
        default_factory=lambda: collections.deque(maxlen=RECENT)
    )
    # after warmup only:
    measured: int = 0
    measured_ms: float = 0.0
    measured_samples: float = 0.0
    measured_tokens: float = 0.0  # only from a script that reports tokens through the probe
    # one step in K timed (ddptop.rank.phase_every): the steps the measured records' spans cover and
    # their host time, the untimed steps included: the job's own pace (figures.rank_steps_per_s_run)
    span_steps: float = 0.0
    span_ms: float = 0.0
    phase_ms: dict[str, float] = field(default_factory=lambda: dict.fromkeys(PHASES, 0.0))
    extra_ms: dict[str, float] = field(default_factory=dict)  # comm_ms, exposed_comm_ms, ...
    step_hist: Histogram = field(default_factory=Histogram)
    comm_hist: Histogram = field(default_factory=Histogram)
    exposed_hist: Histogram = field(default_factory=Histogram)
    hook_hist: Histogram = field(default_factory=Histogram)  # a comm hook's span where NCCL times comm
    # comm_ms may come on some steps only (GPU times completions every Nth step):
    # its share and bandwidth are over the steps that carry it
    timed_step_ms: float = 0.0
    timed_bytes: float = 0.0
    # the exposed part of each timed all-reduce (figures.exposed_of_comm), over those same
    # steps: the exposed share and p50 shown beside comm's are taken over comm's steps
    timed_exposed_ms: float = 0.0
    timed_exposed_hist: Histogram = field(default_factory=Histogram)
    ddp_timing: dict[str, float] = field(default_factory=dict)  # DDP's own logger, from the goodbye
    # the all-reduce buckets' [hand-over, completion] (ms from the step's start) of the newest
    # step the rank sent them for (a few times a second): the live step timeline
    spans_step: int = -1
    bucket_spans: tuple[tuple[float, float], ...] = ()
    # what the rank's instrument learnt: backend, model, params, batch_size, DDP settings...
    info: dict[str, Fact] = field(default_factory=dict)

    def add(self, rec: dict[str, float], warmup: int, now: float) -> None:
        self.steps += 1
        self.last_step = max(self.last_step, int(rec["step"]))
        self.last_t = rec.get("t", self.last_t)
        self.last_seen = now
        self.recent.append(rec)
        if self.status == RankStatus.STARTING:
            self.status = RankStatus.RUNNING
        step_ms = rec.get("step_ms")
        if rec["step"] < warmup or step_ms is None or rec.get("profiled"):
            return
        self.measured += 1
        self.measured_ms += step_ms
        self.measured_samples += rec.get("samples", 0.0)
        self.measured_tokens += rec.get("tokens", 0.0)
        if "span_steps" in rec and "span_ms" in rec:
            self.span_steps += rec["span_steps"]
            self.span_ms += rec["span_ms"]
        self.step_hist.add(step_ms)
        phase_ms, extra = self.phase_ms, self.extra_ms
        for phase, key in _PHASE_KEYS:
            phase_ms[phase] += rec.get(key, 0.0)
        for key in _EXTRA_KEYS:
            if key in rec:
                extra[key] = extra.get(key, 0.0) + rec[key]
        if "comm_ms" in rec:
            self.comm_hist.add(rec["comm_ms"])
            self.timed_step_ms += step_ms
            self.timed_bytes += rec.get("comm_bytes", 0.0)
            exposed = figures.exposed_of_comm(rec) or 0.0
            self.timed_exposed_ms += exposed
            self.timed_exposed_hist.add(exposed)
        if "exposed_comm_ms" in rec:
            self.exposed_hist.add(rec["exposed_comm_ms"])
        if "hook_ms" in rec:
            self.hook_hist.add(rec["hook_ms"])

    def add_spans(self, spans: dict[int, tuple[tuple[float, float], ...]]) -> None:
        for step, spans_of_step in spans.items():
            if step >= self.spans_step:
                self.spans_step, self.bucket_spans = step, spans_of_step

    def timeline_record(self) -> tuple[dict[str, float] | None, tuple[tuple[float, float], ...]]:
        """The step to draw as a timeline and its bucket spans: the newest step that has
        them while it is still among the recent records, else the newest step whose all-reduce
        was timed (on a GPU one step in comm_timing_every is), else the newest step."""
        if not self.recent:
            return None, ()
        if self.bucket_spans and self.recent[0]["step"] <= self.spans_step:
            for rec in reversed(self.recent):
                if rec["step"] == self.spans_step:
                    return rec, self.bucket_spans
        timed = next((rec for rec in reversed(self.recent) if "comm_ms" in rec), None)
        return timed or self.recent[-1], ()

    def steps_run(self) -> int:
        """The steps it ran as far as ddptop knows: what it said at its end (`steps_run`, a fact: the
        untimed steps too) where that is a whole number above what its records show, else its last
        record's step + 1 (one step in K timed: up to K - 1 behind while it runs) or its records."""
        said, seen = self.info.get("steps_run"), max(self.steps, self.last_step + 1)
        return said if type(said) is int and said > seen else seen

    def recent_values(self, key: str = "step_ms") -> list[float]:
        return [r[key] for r in self.recent if key in r]

    def recent_pct(self, q: float, key: str = "step_ms") -> float | None:
        """A percentile over the recent ring (all RECENT records, not the last-50 window)."""
        return figures.percentile(self.recent_values(key), q)


def timed_every(infos: Iterable[dict[str, Fact]]) -> int:
    """One step in how many the ranks time (their `phase_every` fact: ddptop.rank.phase_every), the
    largest any said; 1: every step. A value that is no whole number from 2 to 1024 is not believed."""
    said = [info.get("phase_every") for info in infos]
    return max([k for k in said if type(k) is int and 2 <= k <= 1024], default=1)
