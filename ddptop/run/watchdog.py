"""Watchdog: the run's periodic eyes while torchrun runs. Every tick it tails the ranks'
logs and NCCL's, samples throughput, checks the recorder and stalls (collecting the
ranks' stacks when one begins) and refreshes live advice; a second loop samples the
hardware. It only reads processes and files and writes into the state; stopping the
run is asked of the run object through `request_stop`. No UI, no torch.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable, Mapping

from ddptop.analysis.advisor import advise_run
from ddptop.analysis.capture import nsys_window_at
from ddptop.analysis.nccl import NcclParser
from ddptop.hw.hardware import HardwareSampler
from ddptop.hw.host_load import read_host
from ddptop.model.state import RunState, Stall
from ddptop.model.status import rank_in_loop
from ddptop.run.logtail import LogTail, rank_log_files
from ddptop.run.rank_procs import RankProcesses
from ddptop.run.recorder import Recorder
from ddptop.run.stacks import collect_stacks

TICK_S = 0.5
HARDWARE_S = 1.0
HARDWARE_ENV = "DDPTOP_HARDWARE_S"  # seconds between hardware samples; 0: none (to measure what sampling costs)
ADVICE_TICKS = 10  # every 5 s: live advice for the views


def _pid_of(nccl_log_name: str) -> int:
    parts = nccl_log_name.split(".")
    return int(parts[-2]) if len(parts) >= 3 and parts[-2].isdigit() else -1


def hardware_interval(text: str | None) -> tuple[float, str]:
    """Seconds between hardware samples from DDPTOP_HARDWARE_S (unset: 1), and a line when the
    value is not one (pure)."""
    if text is None or not text.strip():
        return HARDWARE_S, ""
    try:
        every = float(text)
    except ValueError:
        every = -1.0
    if every == 0 or 0.1 <= every <= 3600:
        return every, ""
    return HARDWARE_S, f"{HARDWARE_ENV}={text[:40]!r} is not 0 or 0.1-3600 seconds: sampling every {HARDWARE_S:g} s"


class Watchdog:
    def __init__(self, state: RunState, procs: RankProcesses, hardware: HardwareSampler,
                 nccl_env: Mapping[str, str], request_stop: Callable[[str], None],
                 stopping: Callable[[], bool]) -> None:
        self.state = state
        self.procs = procs  # the ranks' pids and torchrun's directories (procs.run_dir)
        self.hardware = hardware
        self.nccl_env = nccl_env  # the run's NCCL settings, for the advisor
        self.recorder: Recorder | None = None  # checked every tick, once the run has one
        self.request_stop = request_stop
        self.stopping = stopping
        self._tail = LogTail()
        self._nccl = NcclParser()

    async def tick_loop(self) -> None:
        ticks = 0
        while True:
            await asyncio.sleep(TICK_S)
            self.poll_logs()
            now = time.time()
            self.state.tick(now)
            self._check_recorder()
            ticks += 1
            if ticks % ADVICE_TICKS == 0:
                self.update_advice()
            if self.stopping():
                continue  # ranks in their stop handlers (a checkpoint's save) take no steps: no stall
            stall = self.state.check_stall(now, self.procs.process_status())
            if stall is not None:
                self._announce(stall, now)
                await self._collect_stacks(stall)

    def _check_recorder(self) -> None:
        if self.recorder is not None and self.recorder.check() and not self.stopping():
            # records can no longer be kept: stop at an agreed step rather than lose them
            self.state.add_log(-1, f"[ddptop] {self.recorder.error}: stopping the run")
            self.state.error = self.recorder.error  # on every view at once
            self.request_stop(self.recorder.error)

    def _announce(self, stall: Stall, now: float) -> None:
        cap = nsys_window_at(self.state.captures.values(), max(stall.last_steps.values(), default=-1))
        if cap is not None:
            # cudaProfilerStart/Stop block each rank while nsys works (2 min on H200)
            stall.cause = f"nsys is recording or writing capture {cap.capture_id} at steps {cap.steps}"
        self.state.add_log(-1, f"[ddptop] stalled: no step for {now - stall.since:.0f}s "
                               f"(bound {stall.bound_s:.0f}s); suspects {stall.suspects}"
                               + (f"; {stall.cause}" if stall.cause else ""))

    async def _collect_stacks(self, stall: Stall) -> None:
        signalable = {r for r, rs in self.state.ranks.items() if rs.info.get("stacks")}
        # only processes of the run alive now (a finished rank's pid may be someone else's
        # by now) and ranks still in their loop: one that said goodbye is tearing down
        alive = self.procs.alive_pids()
        pids = {r: pid for r, pid in self.procs.rank_pids().items()
                if pid in alive and rank_in_loop(self.state.ranks[r].status)}
        stacks_dir = self.procs.run_dir / "stacks"
        stall.stacks = await collect_stacks(stacks_dir, pids, stall.process_status, signalable)

    def poll_logs(self) -> None:
        """New lines of the ranks' logs, torchrun's and NCCL's (parsed for the NCCL report)."""
        # read through the recorder's descriptor of the run dir: a swap of it is never followed
        run_dir = self.recorder.reading_dir() if self.recorder is not None else self.procs.run_dir
        multi = self.procs.node.multi
        to_rank = self.procs.local_to_rank()
        for local, paths in rank_log_files(run_dir / "logs").items():
            # a line read before that rank's hello goes to the run's log, not a wrong rank
            rank = to_rank.get(local, -1) if multi else local
            for path in paths:
                for line in self._tail.read(path):
                    self.state.add_log(rank, line)
        for line in self._tail.read(run_dir / "torchrun.log"):
            self.state.add_log(-1, line)
        fresh = 0
        pid_rank = {pid: rank for rank, pid in self.procs.rank_pids().items()}
        for path in sorted((run_dir / "nccl").glob("*")):
            lines = self._tail.read(path)
            self._nccl.feed_lines(lines)
            fresh += len(lines)
            rank = pid_rank.get(_pid_of(path.name), -1)  # nccl.<host>.<pid>.log
            for line in lines:
                self.state.add_log(rank, line)
        if fresh:
            self.state.nccl = self._nccl.report()

    async def hardware_loop(self) -> None:
        """GPU samples from NVML (or, without it, each rank's CPU% and RSS) every second
        (DDPTOP_HARDWARE_S; 0: no sampling, said on the GPU panel)."""
        state, hw = self.state, self.hardware
        every, said = hardware_interval(os.environ.get(HARDWARE_ENV))
        if said:
            state.add_log(-1, f"[ddptop] {said}")
        if every == 0:
            state.gpu_unavailable = f"hardware sampling is off ({HARDWARE_ENV}=0)"
            return
        state.gpu_unavailable = await asyncio.to_thread(hw.unavailable)
        if not state.gpu_unavailable:
            state.topology = await asyncio.to_thread(hw.topology)
        while True:
            rank_pids = self.procs.rank_pids()
            gpu, procs, children = await asyncio.to_thread(hw.sample, list(rank_pids.values()))
            state.proc_stats, state.proc_children = procs, children
            state.proc_history.append(procs)
            # the host's CPU for the straggler rule (a busy host is not a straggler)
            host = await asyncio.to_thread(read_host, rank_pids, time.monotonic())
            if host is not None:
                state.add_host(host)
            if gpu is not None:
                state.gpu = gpu
                state.gpu_history.append(gpu)
            await asyncio.sleep(every)

    def update_advice(self) -> None:
        env = {**os.environ, **self.nccl_env}
        try:
            self.state.advice = advise_run(self.state.summary(), self.state.nccl, self.state.topology, env=env)
        except Exception as exc:  # noqa: BLE001 - advice is a nicety; never fail a run over it
            self.state.add_log(-1, f"[ddptop] advisor failed: {type(exc).__name__}: {exc}")
