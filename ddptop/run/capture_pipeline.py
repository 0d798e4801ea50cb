"""CapturePipeline: plan the same steps on every rank (the session sends the command), follow
the ranks' reports, and summarize each window once every rank has written its trace, in a
child process (ddptop.run.trace_job: the UI's loop never waits on it; and, after an nsys run,
put nsys's stats into the captures). Also `agreed_step`, the step no rank has reached
yet that captures and stops are scheduled at. No UI, no torch, no sockets.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from pathlib import Path

from ddptop.analysis.capture import Capture, compare_with_timer, discount_late, perturbation
from ddptop.model.options import CaptureOptions
from ddptop.model.rank_state import timed_every
from ddptop.model.state import RunState
from ddptop.run.nsys import attach_nsys, nsys_report
from ddptop.run.recorder import write_json
from ddptop.run.trace_files import TraceError
from ddptop.run.trace_job import summarize_capture
from ddptop.wire import protocol

DRAIN_TIMEOUT_S = 30.0  # summaries still being made when the run ends


def agreed_step(state: RunState) -> int:
    """A step no rank has reached yet: the latest step seen, plus the untimed steps a rank may
    have run since its last record (one step in K timed: K - 1), plus the steps the ranks make
    while the command travels: at least 0.4 s worth (the probes batch records for 0.2 s), or
    twice how late their records reach the state now (a hub backed up by a thousand ranks:
    0.8 s at p99 on one core), whichever is more (the lag counted up to 10 s)."""
    ranks = state.ranks.values()
    latest = max((rs.last_step for rs in ranks), default=-1)
    # one step in K timed (phase_every): a rank's last record can be K - 1 steps behind it
    unseen = timed_every(rs.info for rs in ranks) - 1
    p50 = max((rs.recent_pct(50) or 0.0 for rs in ranks), default=0.0)
    lags = sorted(rs.last_seen - rs.last_t for rs in ranks if rs.last_t > 0)
    lag = min(max(lags[len(lags) // 2], 0.0), 10.0) if lags else 0.0
    ahead_ms = 1000.0 * max(0.4, 2 * lag)
    # no cap in steps: ranks of sub-ms steps run thousands of steps in that time (a cap of 1,000
    # let a rank be past the agreed step when the command reached it: ranks 400 steps apart)
    return latest + 2 + unseen + (math.ceil(ahead_ms / p50) if p50 > 0 else 0)


class CapturePipeline:
    def __init__(self, state: RunState, options: CaptureOptions, run_dir: Path) -> None:
        self.state = state
        self.options = options  # --capture windows, --profiler, nsys
        self.run_dir = run_dir  # captures go to <run_dir>/captures/<id>/
        self._background: set[asyncio.Task[None]] = set()

    def schedule(self, count: int = 3, start: int | None = None) -> tuple[Capture, protocol.Command]:
        """A window of `count` steps from `start` (default: the first step no rank can have
        reached yet), kept in the state, and the command that asks every rank to record it:
        the session sends it, so every rank records the same steps."""
        capture_id = len(self.state.captures) + 1
        start = agreed_step(self.state) + 1 if start is None else start
        out_dir = self.run_dir / "captures" / str(capture_id)
        cap = Capture(capture_id, start, count, self.options.profiler, str(out_dir))
        self.state.captures[capture_id] = cap
        memory = self.state.config.capture_memory
        return cap, protocol.CaptureCommand(capture_id, start, count, str(out_dir), cap.profiler, memory).to_command()

    def report(self, msg: protocol.CaptureReport) -> None:
        """A rank's news about a window: recording, written (files), or failed."""
        cap = self.state.captures.get(msg.capture_id)
        if cap is None:
            self.state.drop("unknown-capture")
            return
        cap.ranks[msg.rank] = msg.status
        if msg.files:
            cap.files[msg.rank] = msg.files
        if msg.status == "failed":
            cap.status, cap.error = "failed", f"rank {msg.rank}: {msg.error}"
        elif msg.status == "recording":
            cap.warmup = msg.warmup if cap.warmup is None else min(cap.warmup, msg.warmup)
            if cap.status == "scheduled":
                cap.status = "recording"
        world = self.state.world_size
        if cap.status != "failed" and sum(1 for v in cap.ranks.values() if v == "written") == world:
            cap.status = "processing"
            task = asyncio.get_running_loop().create_task(self._process(cap))
            self._background.add(task)
            task.add_done_callback(self._background.discard)

    async def drain(self, timeout_s: float = DRAIN_TIMEOUT_S) -> None:
        """Let the summaries under way finish (the run has ended)."""
        if self._background:
            await asyncio.wait(self._background, timeout=timeout_s)

    def settle(self) -> None:
        """The run has ended: a window still scheduled or recording will never be written (a
        stop, a SIGTERM right after SIGUSR1 asked for it); it ends failed, saying so, never
        left `recording` in the final summary."""
        world = self.state.world_size
        for cap in self.state.captures.values():
            if cap.status in ("scheduled", "recording"):
                wrote = sum(1 for v in cap.ranks.values() if v == "written")
                cap.status = "failed"
                cap.error = cap.error or f"the run ended before steps {cap.steps} were recorded ({wrote}/{world} rank(s) wrote theirs)"

    async def _process(self, cap: Capture) -> None:
        try:
            # in a child process: parsing holds the GIL, and a large trace would stall the UI
            summary = await summarize_capture(cap.files)
            window = range(cap.start, cap.start + cap.count)
            await self._records_arrived(window[-1])
            records = {r: list(rs.recent) for r, rs in self.state.ranks.items()}
            compare_with_timer(summary, records, window)
            summary["perturbation"] = perturbation(records, window, cap.warmup or 0)
            found = self.state.straggler_verdict.straggler
            # what the discount reads, kept so that `ddptop trace DIR` says the same (issue 45)
            summary["window_steps"] = cap.count
            summary["unprofiled_straggler"] = None if found is None else found.describe()
            discount_late(summary.get("cross_rank"), summary["perturbation"], cap.count,
                          summary["unprofiled_straggler"])
            cap.summary = summary
            cap.status = "done"  # before writing: the file on disk says how the capture ended
            write_json(Path(cap.out_dir) / "summary.json", cap.to_dict())
        except TraceError as exc:  # the child's one line: out of memory, killed, too slow
            cap.status, cap.error = "failed", f"summary: {exc}"
        except Exception as exc:  # noqa: BLE001 - a bad trace must not take the run down
            cap.status, cap.error = "failed", f"summary: {type(exc).__name__}: {exc}"

    async def _records_arrived(self, step: int, timeout_s: float = 5.0) -> None:
        """Wait (briefly) until every rank has reported `step`: a rank writes its trace
        before the step's record, which comes with the probe's next batch."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and any(rs.last_step < step for rs in self.state.ranks.values()):
            await asyncio.sleep(0.1)

    async def nsys_stats(self) -> None:
        """After an nsys run: nsys writes at range end/exit, after the ranks reported their
        windows written: import raw streams, `nsys stats` each report, and put both into
        the captures."""
        if not self.options.nsys:
            return
        state = self.state
        state.nsys = await nsys_report(self.options.nsys, self.run_dir / "captures")
        attach_nsys(state.captures.values(), state.nsys)
        for cap in state.captures.values():
            if cap.profiler == "nsys":
                with contextlib.suppress(OSError):
                    write_json(Path(cap.out_dir) / "summary.json", cap.to_dict())
        state.add_log(-1, f"[ddptop] nsys: {len(state.nsys['reports'])} report(s); "
                          f"{state.nsys.get('note', 'stats in the capture summaries')}")
