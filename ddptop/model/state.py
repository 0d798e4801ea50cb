"""RunState: everything known about one run, updated by applying events.

Pure: no I/O, no asyncio, no UI. Memory is bounded whatever the run length:
recent records live in ring buffers, whole-run percentiles in log-binned
histograms (about 1% resolution), sums in counters. Each rank's part is a RankState
(ddptop.model.rank_state); summary.json's per-rank entries come from ddptop.model.run_summary.
"""

from __future__ import annotations

import collections
import dataclasses
from dataclasses import dataclass, field

from ddptop.hw.host_load import HostSample
from ddptop.hw.samples import GpuSample
from ddptop.hw.topology import TopologyMatrix
from ddptop.model import figures, straggler
from ddptop.model.advice import Advice
from ddptop.model.capture import Capture
from ddptop.model.config import RunConfig
from ddptop.model.cost import RunCost
from ddptop.model.figures import STALL_MIN_S, STALL_STEPS, RankFigures, RankWindow
from ddptop.model.host_load import KEEP_S, HostHistory
from ddptop.model.nccl_facts import NcclFacts
from ddptop.model.plain_data import NsysReport
from ddptop.model.rank_state import RECENT, Histogram, RankState
from ddptop.model.run_summary import (
    STEPS_PER_S_DIGITS,
    bus_bandwidth,
    host_dict,
    nccl_facts,
    rank_summary,
    round_or_none,
    straggler_dict,
    verdict_dict,
)
from ddptop.model.status import (
    RUN_TERMINAL,
    RankStatus,
    RunStatus,
    StatusField,
    rank_in_loop,
    rank_is_live,
    rank_status,
    run_is_live,
    run_status,
)
from ddptop.model.straggler import Finding, Verdict
from ddptop.model.text import printable
from ddptop.wire.protocol import Bye, Hello, Info, Steps

__all__ = ["LOG_LINES", "RECENT", "STALL_MIN_S", "STALL_STEPS", "Histogram", "RankState", "RunState",
           "Stall", "bus_bandwidth", "nccl_facts"]

LOG_LINES = 2000  # log lines kept per rank for live views (all of them are on disk)
HISTORY = 900  # throughput samples (one per tick)
# hardware samples kept (one a second): five minutes, so the GPU tab's charts span a 200-column
# terminal (120 left a third of it blank, issue 46)
HW_HISTORY = 300

TERMINAL = RUN_TERMINAL
MAX_FACTS = 64  # facts kept per rank (a rank cannot grow our memory without bound)
MAX_NOTES = 50
HELLO_FACTS = ("backend", "model", "device")  # facts that complete the rank's hello


@dataclass
class Stall:
    since: float  # our clock: last progress of any rank
    bound_s: float
    last_steps: dict[int, int]
    suspects: list[int]  # ranks behind, or whose process is stopped/gone
    process_status: dict[int, str] = field(default_factory=dict)
    stacks: dict[int, str] = field(default_factory=dict)  # rank -> file with its Python stacks
    cleared_at: float | None = None
    cause: str = ""  # a known reason, e.g. nsys writing a capture window

    def to_dict(self) -> dict[str, object]:
        return {
            "since": self.since, "bound_s": self.bound_s, "last_steps": self.last_steps,
            "suspects": self.suspects, "process_status": self.process_status,
            "stacks": self.stacks, "cleared_at": self.cleared_at, "cause": self.cause,
        }


CHECK_MAX_S = 1.0  # the straggler check's full pass at least this often while steps come


@dataclass
class RunState:
    run_id: str
    # the run's knobs; a user's script's run holds RunConfig.script_view() (what applies to it)
    config: RunConfig
    world_size: int
    warmup: int = 0
    nnodes: int = 1  # ddptop nodes in the run; ranks say which one is theirs (Hello.node)
    # A RunStatus; annotated by its word because the viewer codec (ddptop.viewer_wire.schema)
    # builds its wire form from these annotations and sends statuses as plain strings.
    status: str = StatusField(RunStatus.STARTING, run_status)  # type: ignore[assignment]
    started_at: float = 0.0  # our wall clock
    ended_at: float | None = None
    failed_rank: int | None = None
    error: str = ""
    failure_log: list[str] = field(default_factory=list)  # the failed rank's last lines on stderr
    ranks: dict[int, RankState] = field(default_factory=dict)
    dropped: collections.Counter[str] = field(default_factory=collections.Counter)
    refused: int = 0
    logs: dict[int, collections.deque[str]] = field(default_factory=dict)
    history: collections.deque[tuple[float, float]] = field(
        default_factory=lambda: collections.deque(maxlen=HISTORY)
    )
    notes: list[str] = field(default_factory=list)  # one-time messages ("no NVML: ...")
    # Hardware telemetry, set by the session's sampler: the latest sample (None until the
    # first one), a short history of them, and why there is none.
    gpu: GpuSample | None = None
    gpu_history: collections.deque[GpuSample] = field(default_factory=lambda: collections.deque(maxlen=HW_HISTORY))
    gpu_unavailable: str = ""
    # psutil, every second: pid -> (cpu_percent, rss_bytes) of each rank and its children
    proc_stats: dict[int, tuple[float, int]] = field(default_factory=dict)
    proc_children: dict[int, list[int]] = field(default_factory=dict)  # a rank's pid -> its children's
    # the last proc_stats samples (the GPU tab's CPU history where there is no NVML)
    proc_history: collections.deque[dict[int, tuple[float, int]]] = field(
        default_factory=lambda: collections.deque(maxlen=HW_HISTORY))
    nccl: NcclFacts | None = None  # latest ddptop.analysis.nccl.NcclReport parsed from the run's NCCL logs
    topology: TopologyMatrix | None = None  # once, when NVML is there
    advice: Advice | None = None  # latest from ddptop.analysis.advisor
    stall: Stall | None = None  # set while no rank finishes a step (see stall_bound_s)
    stalls: int = 0  # how many times the run stalled
    # ddptop.model.straggler: checked as records arrive, so it depends on the records, not on
    # how often anyone looks; viewers get it with the state
    straggler_verdict: Verdict = field(default_factory=Verdict)
    captures: dict[int, Capture] = field(default_factory=dict)  # by id
    nsys: NsysReport | None = None  # what nsys wrote and its stats, after an nsys run
    cost: RunCost | None = None  # --set cost_ab: what the rank-side layer cost this run
    command: list[str] | None = None  # the user's own script (None: ddptop's trainer)

    def __post_init__(self) -> None:
        for rank in range(self.world_size):
            self.ranks.setdefault(rank, RankState(rank))
        # the straggler check's gate: the ranks past the step the next check ends on, counted
        # frame by frame, so a frame costs O(1), not a pass over every rank (422 us a frame at
        # 1,024 ranks, docs/BENCHMARKS.md); a full pass when all are past, or every CHECK_MAX_S
        self._check_due = straggler.next_check(-1, self.warmup)
        self._past_due: set[int] = set()
        self._checked_at = float("-inf")
        self.host = HostHistory()  # the host's CPU, as the monitor reads it (not sent to viewers)

    # --- events ------------------------------------------------------------------------
    def apply(self, msg: Hello | Steps | Bye | Info, now: float) -> None:
        if isinstance(msg, Hello):
            rs = self._rank(msg.rank)
            # its names as text: a token holder's bytes drive no terminal
            rs.hello = dataclasses.replace(
                msg, host=printable(msg.host), device=printable(msg.device), backend=printable(msg.backend),
                model=printable(msg.model), torch=printable(msg.torch), nccl=printable(msg.nccl))
            rs.last_seen = now
            if msg.world_size != self.world_size and msg.world_size > 0:
                self.world_size = max(self.world_size, msg.world_size)
        elif isinstance(msg, Steps):
            rs = self._rank(msg.rank)
            for rec in msg.records:
                rs.add(rec, self.warmup, now)
            if msg.spans:
                rs.add_spans(msg.spans)
            self._check_straggler(rs, now)
            if self.status == RunStatus.STARTING:
                self.status = RunStatus.RUNNING
        elif isinstance(msg, Info):
            self._info(self._rank(msg.rank), msg)
        elif isinstance(msg, Bye):
            rs = self._rank(msg.rank)
            rs.status = RankStatus.DONE if msg.reason == "completed" else rank_status(msg.reason)
            rs.ddp_timing = dict(msg.ddp_timing)
            if msg.reason == "crashed":
                rs.lost_at = now

    def _info(self, rs: RankState, msg: Info) -> None:
        for key, value in msg.facts.items():
            if key in rs.info or len(rs.info) < MAX_FACTS:
                rs.info[key] = printable(value) if isinstance(value, str) else value
        hello, facts = rs.hello, msg.facts
        if hello is not None and any(k in facts for k in HELLO_FACTS):  # as text, as the hello's own
            rs.hello = dataclasses.replace(hello, backend=printable(str(facts.get("backend", hello.backend))),
                                           model=printable(str(facts.get("model", hello.model))),
                                           device=printable(str(facts.get("device", hello.device))))
        for note in msg.notes:
            note = printable(str(note))
            text = f"rank {rs.rank}: {note}"
            if len(self.notes) < MAX_NOTES and not any(n.endswith(note) for n in self.notes):
                self.notes.append(text)
            self.add_log(rs.rank, f"[ddptop] {note}")

    def node_of(self, rank: int) -> int | None:
        """The ddptop node `rank` runs on (None until its hello arrives)."""
        rs = self.ranks.get(rank)
        return rs.hello.node if rs is not None and rs.hello is not None else None

    def rank_disconnected(self, rank: int, now: float = 0.0) -> None:
        rs = self.ranks.get(rank)
        if rs is not None and rank_is_live(rs.status):
            rs.status = RankStatus.LOST
            rs.lost_at = now

    def drop(self, reason: str) -> None:
        self.dropped[reason] += 1

    def add_log(self, rank: int, line: str) -> None:
        # as text from here on: no view can be handed a rank's escape sequences
        self.logs.setdefault(rank, collections.deque(maxlen=LOG_LINES)).append(printable(line))

    def finish(self, status: str, now: float, error: str = "", failed_rank: int | None = None,
               ranks_ended: str = "") -> None:
        """End the run; ranks still going read `ranks_ended` (default: as the run ended, but
        `done` for a completed run), the failed rank `failed`."""
        if status not in RUN_TERMINAL:
            raise ValueError(status)
        self.status = RunStatus(status)
        self.ended_at = now
        self.error = printable(error, newlines=True)
        self.failed_rank = failed_rank
        for rs in self.ranks.values():
            if rank_is_live(rs.status):
                rs.status = rank_status(ranks_ended or {"completed": "done"}.get(status, status))
        if failed_rank is not None and failed_rank in self.ranks:
            self.ranks[failed_rank].status = RankStatus.FAILED

    def tick(self, now: float) -> None:
        """Sample live throughput into the history (called about once a second)."""
        rate = self.live_steps_per_s()
        if rate is not None:
            self.history.append((now - self.started_at, rate))

    def _check_straggler(self, reporter: RankState, now: float) -> None:
        """Run the straggler checks due now that every rank (but the lost) has reported more
        steps: when every rank is past the next check's step (or CHECK_MAX_S went by: a lost
        rank never gets there)."""
        if reporter.last_step >= self._check_due:
            self._past_due.add(reporter.rank)
        if len(self._past_due) < len(self.ranks) and now - self._checked_at < CHECK_MAX_S:
            return
        self._checked_at = now
        ranks = {r: rs for r, rs in self.ranks.items() if rs.status not in (RankStatus.LOST, RankStatus.FAILED)}
        self.straggler_verdict = straggler.advance(self.straggler_verdict, ranks, self.warmup, self.host.over)
        self._check_due = straggler.next_check(self.straggler_verdict.checked, self.warmup)
        self._past_due = {r for r, rs in self.ranks.items() if rs.last_step >= self._check_due}

    def add_host(self, sample: HostSample) -> None:
        """A reading of the host's CPU (ddptop.hw.host_load, about once a second)."""
        self.host.add(sample)

    def _rank(self, rank: int) -> RankState:
        if rank not in self.ranks:
            self.ranks[rank] = RankState(rank)
        return self.ranks[rank]

    # --- aggregates --------------------------------------------------------------------
    @property
    def finished(self) -> bool:
        return not run_is_live(self.status)

    def elapsed(self, now: float) -> float:
        return (self.ended_at or now) - self.started_at if self.started_at else 0.0

    @property
    def current_step(self) -> int:
        """The step every rank has finished (the slowest rank's)."""
        if not self.ranks:
            return -1
        return min(rs.last_step for rs in self.ranks.values())

    @property
    def total_dropped(self) -> int:
        return sum(self.dropped.values())

    def steps_per_s(self) -> float | None:
        """Run throughput after warmup: the slowest rank bounds a DDP job."""
        return figures.job_steps_per_s_run(self.ranks.values())

    def rank_figures(self) -> dict[int, RankFigures]:
        """Every rank's recent-window figures (ddptop.model.figures), each recomputed only
        when its rank sent records since the last call."""
        # rank -> its window over `recent`, caught up on read: a cache, not the run's data
        # (no dataclass field, so viewers' snapshots and equality never see it)
        windows: dict[int, RankWindow] = self.__dict__.setdefault("_windows", {})
        if len(windows) > len(self.ranks):
            for r in [r for r in windows if r not in self.ranks]:
                del windows[r]
        return {r: windows.setdefault(r, RankWindow()).update(rs) for r, rs in self.ranks.items()}

    def live_steps_per_s(self) -> float | None:
        """The recent rate (the slowest rank's median step): the throughput history."""
        return figures.job_steps_per_s_last50(self.rank_figures())

    def step_ms_pcts(self, *qs: float) -> tuple[float | None, ...]:
        """Several whole-run percentiles over all ranks' measured steps."""
        return figures.step_ms_pcts_run(self.ranks.values(), *qs)

    def slowest_rank(self) -> int | None:
        """The straggler while one is named, else ddptop.model.figures.slowest: the rank doing
        the most own work per step over its last records."""
        named = self.straggler()
        return named.rank if named is not None else figures.slowest(self.rank_figures())

    def straggler(self) -> Finding | None:
        """The straggler named by ddptop.model.straggler's rule, with what it rests on."""
        return self.straggler_verdict.straggler

    def stall_bound_s(self) -> float:
        return figures.stall_bound_s(self.rank_figures())

    def check_stall(self, now: float, process_status: dict[int, str]) -> Stall | None:
        """Flag a stall when no rank has finished a step for stall_bound_s(); clear it
        when progress resumes. Returns a Stall only when it is newly flagged."""
        if self.status != RunStatus.RUNNING:
            return None
        last = max((rs.last_seen for rs in self.ranks.values() if rs.steps), default=0.0)
        if not last:
            return None
        if self.stall is not None and self.stall.cleared_at is None:
            if last > self.stall.since:
                self.stall.cleared_at = now
            return None
        bound = self.stall_bound_s()
        if now - last < bound:
            return None
        steps = {r: rs.last_step for r, rs in self.ranks.items()}
        # a rank that said goodbye (its script finished) is waiting for no one: never a suspect
        live = {r: st for r, st in steps.items() if rank_in_loop(self.ranks[r].status)} or steps
        behind = min(live.values())
        odd = [r for r, st in process_status.items() if st not in ("running", "sleeping", "disk-sleep") and r in live]
        suspects = sorted(set(odd) or {r for r, st in live.items() if st == behind})
        self.stall = Stall(since=last, bound_s=bound, last_steps=steps, suspects=suspects,
                           process_status=dict(process_status))
        self.stalls += 1
        return self.stall

    def summary(self) -> dict[str, object]:
        """The `summary.json` contract (see README); each rank's entry from ddptop.model.run_summary."""
        first = next((rs.hello for rs in self.ranks.values() if rs.hello), None)
        info = next((rs.info for rs in self.ranks.values() if rs.info), {})
        p50, p95 = self.step_ms_pcts(50, 95)
        figs = self.rank_figures()
        return {
            "run_id": self.run_id,
            "preset": self.config.preset,
            # a script's run: the knobs that mean something for it (RunConfig.script_dict)
            "config": self.config.script_dict() if self.command else self.config.to_dict(),
            "command": self.command,
            "params": info.get("params"),
            "batch_size": info.get("batch_size"),
            "notes": list(self.notes),
            "world_size": self.world_size,
            "nnodes": self.nnodes,
            "backend": first.backend if first else None,
            "model": first.model if first else None,
            "torch": first.torch if first else None,
            "nccl_version": first.nccl if first else None,
            "status": self.status,
            "error": self.error,
            "failed_rank": self.failed_rank,
            "failure_log": list(self.failure_log),
            "elapsed_s": round_or_none(self.elapsed(self.ended_at or self.started_at)),
            "warmup": self.warmup,
            "steps_per_s": round_or_none(figures.job_steps_per_s_run(self.ranks.values()), STEPS_PER_S_DIGITS),
            "samples_per_s": round_or_none(figures.job_samples_per_s_run(self.ranks.values())),
            "tokens_per_s": round_or_none(figures.job_tokens_per_s_run(self.ranks.values())),
            "step_ms_p50": round_or_none(p50),
            "step_ms_p95": round_or_none(p95),
            "slowest_rank": self.slowest_rank(),
            # the run's verdict (the one in force on most checks), not the one at the stop
            "straggler": straggler_dict(self.straggler_verdict.run_straggler()),
            "straggler_check": verdict_dict(self.straggler_verdict),
            "host_cpu": host_dict(self.host.over(KEEP_S)),
            "stalls": self.stalls,
            "stall": self.stall.to_dict() if self.stall else None,
            "comm_share": round_or_none(figures.mean_share_run(self.ranks.values(), "comm_ms"), 4),
            "exposed_comm_share": round_or_none(figures.mean_share_run(self.ranks.values(), "exposed_comm_ms"), 4),
            "comm_window": figures.comm_window_run(self.ranks.values()),
            "nccl": nccl_facts(self.nccl),
            "advice": self.advice.to_dict() if self.advice is not None else None,
            "captures": [c.to_dict() for c in self.captures.values()],
            "nsys": self.nsys,
            "cost": self.cost.to_dict() if self.cost is not None else None,
            "dropped_frames": dict(self.dropped),
            "refused_connections": self.refused,
            "ranks": [rank_summary(self.ranks[r], self.world_size, figs.get(r)) for r in sorted(self.ranks)],
        }
