"""Session: one run, end to end: run directory, hub, torchrun, log tailing,
state, and the final summary. Any front end (headless printer, TUI, a
supervisor) observes `session.state` and calls `request_stop()`; nothing here
assumes a terminal.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import secrets
import shutil
import socket
import tempfile
import time
from pathlib import Path

import psutil

from ddptop.analysis.advisor import advise_run
from ddptop.analysis.capture import (
    Capture,
    compare_with_timer,
    nsys_window_at,
)
from ddptop.analysis.nccl import NcclParser
from ddptop.hw.hardware import HardwareSampler
from ddptop.model.config import RunConfig
from ddptop.model.failures import ErrorFile, blame, last_exception, last_words, parse_error_file
from ddptop.model.options import CaptureOptions, NodeOptions
from ddptop.model.run_ids import new_run_id
from ddptop.model.state import RunState, Stall
from ddptop.run.hub import Hub
from ddptop.run.launcher import SOCKET_DIR_PREFIX, Launcher, build_plan, remove_stale_socket_dirs
from ddptop.run.logtail import LogTail, rank_log_files
from ddptop.run.multinode import hub_bind_host, join_instructions
from ddptop.run.nsys import attach_nsys, nsys_report, summarize_capture
from ddptop.run.recorder import Recorder, disk_error, new_run_dir, write_json
from ddptop.run.stacks import collect_stacks
from ddptop.wire import protocol

TICK_S = 0.5
HARDWARE_S = 1.0
DRAIN_S = 0.5  # after torchrun exits, let the last frames arrive
STOP_GRACE_S = 5.0  # after the agreed stop step, before signals
STOP_DEADLINE_S = 8.0  # a stop never takes longer than this (plus the final sweep of strays)
STOP_KILL_S = 2.0  # from torchrun's SIGTERM to SIGKILL


def _pid_of(nccl_log_name: str) -> int:
    parts = nccl_log_name.split(".")
    return int(parts[-2]) if len(parts) >= 3 and parts[-2].isdigit() else -1


__all__ = ["Session", "last_exception", "new_run_id"]
FAILURE_LOG_LINES = 8  # of the failed rank's stderr, in the summary and the final report
ERROR_FILE_MAX = 1 << 16  # bytes of an error.json read (a traceback, not a data dump)


class Session:
    def __init__(
        self,
        config: RunConfig,
        runs_dir: Path,
        user_cmd: list[str] | None = None,
        run_id: str | None = None,
        hardware: HardwareSampler | None = None,
        capture: CaptureOptions | None = None,
        node: NodeOptions | None = None,
    ) -> None:
        self.config = config
        # node 0 of a multi-node run (the other nodes run ddptop.run.multinode instead): the
        # hub takes every node's ranks over TCP with the token all nodes were given
        self.node = node or NodeOptions()
        self.user_cmd = user_cmd
        self.run_id = run_id or new_run_id(config.preset)
        self.run_dir = Path(runs_dir) / self.run_id
        self.token = self.node.token if self.node.multi else secrets.token_hex(16)
        self.state = RunState(
            run_id=self.run_id,
            config=config.script_dict() if user_cmd else config.to_dict(),
            world_size=config.world_size * self.node.nnodes,
            warmup=config.warmup,
            nnodes=self.node.nnodes,
            command=list(user_cmd) if user_cmd else None,
        )
        self.hub = Hub(self.token, self, world_size=self.state.world_size)
        self._our_pids: set[int] = set()  # rank pids seen to be in torchrun's tree
        self.launcher: Launcher | None = None
        self.recorder: Recorder | None = None
        self._tail = LogTail()
        self._nccl = NcclParser()
        self.hardware = hardware or HardwareSampler()
        self.capture = capture or CaptureOptions()
        self._stop_requested = asyncio.Event()
        self._stop_reason = ""
        self._sock_dir: str | None = None
        self._done = asyncio.Event()
        self._background: set[asyncio.Task[None]] = set()

    # --- HubSink ----------------------------------------------------------------------
    def hub_message(self, msg: protocol.Message, now: float) -> None:
        if isinstance(msg, protocol.CaptureReport):
            self._capture_report(msg)
            return
        self.state.apply(msg, now)
        if isinstance(msg, protocol.Steps) and self.recorder is not None:
            self.recorder.record_steps(msg.rank, msg.records)

    def hub_dropped(self, reason: str) -> None:
        self.state.drop(reason)

    def hub_refused(self, reason: str) -> None:
        self.state.refused += 1
        n = self.state.refused
        if n <= 10 or n in (100, 1000) or n % 10000 == 0:  # a flood is counted, not logged line by line
            self.state.add_log(-1, f"[ddptop] refused a connection ({n} so far): {reason}")

    def hub_admit(self, hello: protocol.Hello) -> str | None:
        """A rank on this node must be a process of this run's torchrun: its pid is what ddptop
        would signal. Ranks of other nodes are vouched for by the token alone."""
        if hello.node != self.node.node_rank or self.launcher is None:
            return None
        if hello.pid <= 1 or hello.pid == os.getpid() or hello.pid not in self._tree_pids():
            return f"rank {hello.rank}'s pid {hello.pid} is not a process of this run"
        return None

    def _tree_pids(self) -> set[int]:
        if self.launcher is not None:
            self._our_pids |= {p.pid for p in self.launcher.tree()[1:]} - {0, 1, os.getpid()}
        return self._our_pids

    def hub_disconnected(self, rank: int) -> None:
        self.state.rank_disconnected(rank, time.time())

    # --- lifecycle --------------------------------------------------------------------
    @property
    def done(self) -> bool:
        return self._done.is_set()

    async def wait_done(self) -> None:
        await self._done.wait()

    async def run(self) -> RunState:
        """Start the run and return its final state once torchrun has exited."""
        try:
            self.run_dir = new_run_dir(self.run_dir.parent, self.run_id)
            self.recorder = Recorder(self.run_dir)
            self.state.started_at = time.time()
            # The socket lives in a private (0700) temp dir: Unix paths are short, and
            # nobody else on a shared node may even reach it.
            if self.node.multi:
                await self.hub.start_tcp(hub_bind_host(self.node), self.node.hub_port)
                addr = self.node.hub_addr
                for line in join_instructions(self.config, self.node, self.user_cmd).splitlines():
                    self.state.add_log(-1, "[ddptop] " + line.removeprefix("ddptop: "))
            else:
                remove_stale_socket_dirs(Path(tempfile.gettempdir()))  # of ddptops killed outright
                self._sock_dir = tempfile.mkdtemp(prefix=SOCKET_DIR_PREFIX)
                addr = await self.hub.start_unix(str(Path(self._sock_dir) / "hub.sock"))
            plan = build_plan(self.config, self.run_dir, addr, self.token, self.run_id, self.user_cmd,
                              nsys=self.capture.nsys, node=self.node)
            self.recorder.write_config(
                self.config.to_dict(), run_id=self.run_id, argv=plan.argv, host=socket.gethostname(),
                user_cmd=self.user_cmd, **self._node_facts(),
            )
            self.launcher = Launcher(plan, leftovers=(self._sock_dir,) if self._sock_dir else ())
            for start, count in self.capture.windows:
                await self.request_capture(count, start)
            await self.launcher.start()
            loops = [
                asyncio.create_task(self._tick_loop()),
                asyncio.create_task(self._stop_loop()),
                asyncio.create_task(self._hardware_loop()),
            ]
            try:
                rc = await self.launcher.wait()
            finally:
                for task in loops:
                    task.cancel()
            await asyncio.sleep(DRAIN_S)
            if self._background:
                await asyncio.wait(self._background, timeout=30)
            await self._nsys_stats()
            self._poll_logs()
            self._finish(rc)
        except asyncio.CancelledError:
            self._stop_reason = self._stop_reason or "cancelled"
            if self.launcher is not None:
                await self.launcher.stop(grace_s=2.0)
            self._finish(-1)
            raise
        except OSError as exc:  # the runs directory: full, gone, read-only
            self.state.finish("failed", time.time(), error=disk_error(self.run_dir, exc))
        except Exception as exc:  # a run that cannot start is a failed run, not a crash
            self.state.finish("failed", time.time(), error=f"could not run: {type(exc).__name__}: {exc}")
        finally:
            if self.launcher is not None:
                # whatever ended the run (torchrun killed, a script's daemon left behind)
                await self.launcher.sweep(grace_s=2.0)
            await self.hub.close()
            if self._sock_dir:
                shutil.rmtree(self._sock_dir, ignore_errors=True)
            if self.recorder is not None:
                why = self.recorder.write_summary(self.state.summary())
                if why:  # the final report still says how the run went
                    self.state.notes.append(f"summary.json not written: {why}")
                self.recorder.close()
            self._done.set()
        return self.state

    def request_stop(self, reason: str = "stopped by user") -> None:
        """Ask every rank to leave its loop at one agreed step; signals follow if not."""
        if not self._stop_requested.is_set():
            self._stop_reason = reason
            self._stop_requested.set()

    def stop_step(self) -> int:
        """A step no rank has reached yet, allowing for the probes' report delay."""
        latest = max((rs.last_step for rs in self.state.ranks.values()), default=-1)
        p50 = max((rs.recent_pct(50) or 0.0 for rs in self.state.ranks.values()), default=0.0)
        margin = 2 + (math.ceil(2000.0 * 0.2 / p50) if p50 > 0 else 0)
        return latest + min(margin, 200)

    async def request_capture(self, count: int = 3, start: int | None = None) -> Capture:
        """Profile `count` steps on every rank from `start` (default: the first step no
        rank can have reached yet), so every rank records the same steps."""
        capture_id = len(self.state.captures) + 1
        start = self.stop_step() + 1 if start is None else start
        out_dir = self.run_dir / "captures" / str(capture_id)
        cap = Capture(capture_id, start, count, self.capture.profiler, str(out_dir))
        self.state.captures[capture_id] = cap
        args = {"id": capture_id, "count": count, "dir": str(out_dir), "profiler": cap.profiler}
        await self.hub.broadcast(protocol.Command("capture", at_step=start, args=args))
        self.state.add_log(-1, f"[ddptop] capture {capture_id}: steps {cap.steps} with {cap.profiler}")
        return cap

    def _capture_report(self, msg: protocol.CaptureReport) -> None:
        cap = self.state.captures.get(msg.capture_id)
        if cap is None:
            self.state.drop("unknown-capture")
            return
        cap.ranks[msg.rank] = msg.status
        if msg.files:
            cap.files[msg.rank] = msg.files
        if msg.status == "failed":
            cap.status, cap.error = "failed", f"rank {msg.rank}: {msg.error}"
        elif msg.status == "recording" and cap.status == "scheduled":
            cap.status = "recording"
        world = self.state.world_size
        if cap.status != "failed" and sum(1 for v in cap.ranks.values() if v == "written") == world:
            cap.status = "processing"
            task = asyncio.get_running_loop().create_task(self._process_capture(cap))
            self._background.add(task)
            task.add_done_callback(self._background.discard)

    async def _process_capture(self, cap: Capture) -> None:
        try:
            summary = await asyncio.to_thread(summarize_capture, cap.files)
            window = range(cap.start, cap.start + cap.count)
            await self._records_arrived(window[-1])
            compare_with_timer(summary, {r: list(rs.recent) for r, rs in self.state.ranks.items()}, window)
            cap.summary = summary
            cap.status = "done"  # before writing: the file on disk says how the capture ended
            write_json(Path(cap.out_dir) / "summary.json", cap.to_dict())
        except Exception as exc:  # noqa: BLE001 - a bad trace must not take the run down
            cap.status, cap.error = "failed", f"summary: {type(exc).__name__}: {exc}"

    async def _records_arrived(self, step: int, timeout_s: float = 5.0) -> None:
        """Wait (briefly) until every rank has reported `step`: a rank writes its trace
        before the step's record, which comes with the probe's next batch."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and any(rs.last_step < step for rs in self.state.ranks.values()):
            await asyncio.sleep(0.1)

    async def _stop_loop(self) -> None:
        await self._stop_requested.wait()
        at_step = self.stop_step()
        self.state.add_log(-1, f"[ddptop] stop requested ({self._stop_reason}): ranks stop after step {at_step}")
        await self.hub.broadcast(protocol.Command("stop", at_step=at_step))
        p50 = max((rs.recent_pct(50) or 0.0 for rs in self.state.ranks.values()), default=0.0)
        latest = max((rs.last_step for rs in self.state.ranks.values()), default=-1)
        # one deadline for the whole stop (< 10 s, a stuck rank included): the agreed step,
        # then torchrun's SIGTERM, then SIGKILL
        wait_s = min(STOP_GRACE_S + (at_step - latest) * p50 / 1000.0, STOP_DEADLINE_S - STOP_KILL_S)
        await asyncio.sleep(wait_s)
        if self.launcher is not None and self.launcher.running:
            self.state.add_log(-1, "[ddptop] ranks did not stop in time: terminating torchrun")
            await self.launcher.stop(grace_s=STOP_KILL_S)

    async def _tick_loop(self) -> None:
        ticks = 0
        while True:
            await asyncio.sleep(TICK_S)
            self._poll_logs()
            now = time.time()
            self.state.tick(now)
            if self.recorder is not None and self.recorder.check() and not self._stop_requested.is_set():
                # records can no longer be kept: stop at an agreed step rather than lose them
                self.state.add_log(-1, f"[ddptop] {self.recorder.error}: stopping the run")
                self.state.error = self.recorder.error  # on every view at once
                self.request_stop(self.recorder.error)
            ticks += 1
            if ticks % 10 == 0:  # every 5 s: live advice for the views
                self.update_advice()
            stall = self.state.check_stall(now, self._rank_process_status())
            if stall is not None:
                cap = nsys_window_at(self.state.captures.values(), max(stall.last_steps.values(), default=-1))
                if cap is not None:
                    # cudaProfilerStart/Stop block each rank while nsys works (2 min on H200)
                    stall.cause = f"nsys is recording or writing capture {cap.capture_id} at steps {cap.steps}"
                self.state.add_log(-1, f"[ddptop] stalled: no step for {now - stall.since:.0f}s "
                                       f"(bound {stall.bound_s:.0f}s); suspects {stall.suspects}"
                                       + (f"; {stall.cause}" if stall.cause else ""))
                await self._collect_stacks(stall)

    def _node_facts(self) -> dict[str, object]:
        n = self.node
        if not n.multi:
            return {}
        return {"nnodes": n.nnodes, "node_rank": n.node_rank, "rdzv_endpoint": n.endpoint,
                "rdzv_id": n.rdzv_id, "hub": f"{n.rdzv_host}:{n.hub_port}"}

    def _rank_pids(self) -> dict[int, int]:
        """Pids of the ranks on this node that are processes of this run's torchrun: a pid
        in a hello is a claim, and ddptop signals these (stacks on a stall)."""
        here = self.node.node_rank
        claimed = {r: rs.hello.pid for r, rs in self.state.ranks.items()
                   if rs.hello is not None and rs.hello.node == here}
        if any(pid not in self._our_pids for pid in claimed.values()):
            self._tree_pids()
        return {r: pid for r, pid in claimed.items() if pid in self._our_pids}

    def _local_to_rank(self) -> dict[int, int]:
        """torchrun names each rank's log directory by local rank; on one node that is the
        rank, across nodes the hellos say which rank each local rank is."""
        if not self.node.multi:
            return {}
        here = self.node.node_rank
        return {rs.hello.local_rank: r for r, rs in self.state.ranks.items()
                if rs.hello is not None and rs.hello.node == here}

    def _rank_dirs(self) -> dict[int, Path]:
        """rank -> torchrun's directory for it (<logs>/<id>/attempt_<n>/<local_rank>/, the last
        attempt): its stdout.log, stderr.log and, when it raised under @record, error.json."""
        to_rank = self._local_to_rank()
        out: dict[int, Path] = {}
        attempts = sorted((self.run_dir / "logs").glob("*/attempt_*"),
                          key=lambda d: int(d.name.removeprefix("attempt_") or 0)
                          if d.name.removeprefix("attempt_").isdigit() else -1)
        for attempt in attempts:
            for d in attempt.iterdir() if attempt.is_dir() else ():
                if d.name.isdigit():
                    rank = to_rank.get(int(d.name)) if self.node.multi else int(d.name)
                    if rank is not None:
                        out[rank] = d
        return out

    def _error_files(self) -> dict[int, ErrorFile]:
        """What each rank's error.json says (written by torchrun's @record in the rank)."""
        out = {}
        for rank, d in self._rank_dirs().items():
            try:
                with open(d / "error.json", "rb") as f:
                    text = f.read(ERROR_FILE_MAX).decode("utf-8", "replace")
            except OSError:
                continue
            parsed = parse_error_file(text)
            if parsed is not None:
                out[rank] = parsed
        return out

    def _stderr_tail(self, rank: int, lines: int = FAILURE_LOG_LINES) -> list[str]:
        """The last lines `rank` wrote to stderr (the end of a traceback, the interpreter's or
        the shell's complaint), from its log file: the in-memory log mixes in stdout."""
        d = self._rank_dirs().get(rank)
        if d is None:
            return []
        try:
            with open(d / "stderr.log", "rb") as f:
                start = max(0, f.seek(0, os.SEEK_END) - 16384)
                f.seek(start)
                data = f.read()
        except OSError:
            return []
        text = data.decode("utf-8", "replace").replace("\r\n", "\n").replace("\r", "\n")
        cut = text.splitlines()[1 if start else 0:]  # the first line read may be a piece of one
        kept = [line.rstrip()[:500] for line in cut if line.strip()]
        return kept[-lines:]

    def _rank_process_status(self) -> dict[int, str]:
        out = {}
        for rank, pid in self._rank_pids().items():
            try:
                out[rank] = psutil.Process(pid).status()
            except psutil.Error:
                out[rank] = "gone"
        return out

    async def _collect_stacks(self, stall: Stall) -> None:
        signalable = {r for r, rs in self.state.ranks.items() if rs.info.get("stacks")}
        # only processes of the run alive now (a finished rank's pid may be someone else's
        # by now) and ranks still in their loop: one that said goodbye is tearing down
        alive = {p.pid for p in self.launcher.run_processes()} if self.launcher is not None else set()
        pids = {r: pid for r, pid in self._rank_pids().items()
                if pid in alive and self.state.ranks[r].status in ("starting", "running", "lost")}
        stall.stacks = await collect_stacks(self.run_dir / "stacks", pids, stall.process_status, signalable)

    def _poll_logs(self) -> None:
        to_rank = self._local_to_rank()
        for local, paths in rank_log_files(self.run_dir / "logs").items():
            # a line read before that rank's hello goes to the run's log, not a wrong rank
            rank = to_rank.get(local, -1) if self.node.multi else local
            for path in paths:
                for line in self._tail.read(path):
                    self.state.add_log(rank, line)
        for line in self._tail.read(self.run_dir / "torchrun.log"):
            self.state.add_log(-1, line)
        fresh = 0
        pid_rank = {pid: rank for rank, pid in self._rank_pids().items()}
        for path in sorted((self.run_dir / "nccl").glob("*")):
            lines = self._tail.read(path)
            self._nccl.feed_lines(lines)
            fresh += len(lines)
            rank = pid_rank.get(_pid_of(path.name), -1)  # nccl.<host>.<pid>.log
            for line in lines:
                self.state.add_log(rank, line)
        if fresh:
            self.state.nccl = self._nccl.report()

    async def _hardware_loop(self) -> None:
        """GPU samples from NVML (or, without it, each rank's CPU% and RSS) every second."""
        state, hw = self.state, self.hardware
        state.gpu_unavailable = await asyncio.to_thread(hw.unavailable)
        if not state.gpu_unavailable:
            state.topology = await asyncio.to_thread(hw.topology)
        while True:
            pids = list(self._rank_pids().values())
            gpu, procs = await asyncio.to_thread(hw.sample, pids)
            state.proc_stats = procs
            if gpu is not None:
                state.gpu = gpu
                state.gpu_history.append(gpu)
            await asyncio.sleep(HARDWARE_S)

    async def _nsys_stats(self) -> None:
        if self.capture.nsys:
            # nsys writes at range end/exit, after the ranks reported their windows written:
            # import raw streams, `nsys stats` each report, and put both into the captures
            self.state.nsys = await nsys_report(self.capture.nsys, self.run_dir / "captures")
            attach_nsys(self.state.captures.values(), self.state.nsys)
            for cap in self.state.captures.values():
                if cap.profiler == "nsys":
                    with contextlib.suppress(OSError):
                        write_json(Path(cap.out_dir) / "summary.json", cap.to_dict())
            self.state.add_log(-1, f"[ddptop] nsys: {len(self.state.nsys['reports'])} report(s); "
                                   f"{self.state.nsys.get('note', 'stats in the capture summaries')}")

    def update_advice(self) -> None:
        env = {**os.environ, **self.config.nccl_env}
        try:
            self.state.advice = advise_run(self.state.summary(), self.state.nccl, self.state.topology, env=env)
        except Exception as exc:  # noqa: BLE001 - advice is a nicety; never fail a run over it
            self.state.add_log(-1, f"[ddptop] advisor failed: {type(exc).__name__}: {exc}")

    def _finish(self, rc: int) -> None:
        self._finish_status(rc)
        self.update_advice()

    def _finish_status(self, rc: int) -> None:
        now = time.time()
        if self.recorder is not None and self.recorder.error:
            self.state.finish("failed", now, error=self.recorder.error)
            return
        if self._stop_requested.is_set() or rc == -1:
            self.state.finish("stopped", now, error=self._stop_reason)
            return
        ranks = self.state.ranks.values()
        if rc == 0 and (self.user_cmd or all(rs.status in ("done", "exited") for rs in ranks)):
            self.state.finish("completed", now)
            return
        log = ""
        try:
            log = (self.run_dir / "torchrun.log").read_text(errors="replace")
        except OSError:
            pass
        lost = sorted((rs.lost_at, rs.rank) for rs in ranks if rs.lost_at is not None)
        cause = blame(log, lost[0][1] if lost else None, self._error_files())
        failed = cause.rank if cause else None
        own = last_exception(log.splitlines()[-200:]) if cause is None and rc > 0 else ""
        if own and "ChildFailedError" not in own:  # that one is the report of a rank's failure
            # torchrun itself failed (a command that does not exist, a bad rendezvous): no rank ran
            self.state.finish("failed", now, error=f"torchrun exited with code {rc}: {own}")
            return
        if failed is None:
            running = [rs for rs in ranks if rs.status in ("lost", "crashed", "starting", "running")]
            failed = running[0].rank if running else None
        tail = self._stderr_tail(failed) if failed is not None else []
        if failed is not None and tail:
            self.state.failure_log = tail
        if cause and cause.message:
            error = cause.message
        elif cause and cause.exitcode is not None:
            # a script without torchrun's @record leaves no error file: its own last words
            # (its exception, or what the interpreter or the shell said on its stderr)
            last = (last_exception(self.state.logs.get(failed, ())) or last_words(tail)) if failed is not None else ""
            error = f"{last} (exit code {cause.exitcode})" if last else f"exit code {cause.exitcode}"
        elif rc == 0:
            error = "torchrun exited 0 but not every rank reported completion"
        else:
            error = f"torchrun exited with code {rc}"
        rs = self.state.ranks.get(failed) if failed is not None else None
        if rs is not None and rs.hello is None and rs.lost_at is None:
            # it never reached `import torch` with ddptop's layer, or died before its hello
            error = f"rank {failed} failed before connecting to ddptop: {error}"
        killed = cause is None or cause.exitcode is None or cause.exitcode < 0
        if all(rs.status == "done" for rs in ranks) and killed:
            # Every rank said goodbye after its last step: the training completed, and a
            # process died in teardown (gloo has aborted at interpreter exit, "terminate
            # called without an active exception"). Say both, and keep the run's result.
            rank = f"rank {failed}: " if failed is not None else ""
            self.state.finish("completed", now, error=f"every rank completed; then at exit {rank}{error}")
            self.state.add_log(-1, f"[ddptop] run completed, but {rank}{error} after its last step")
            return
        self.state.finish("failed", now, error=error, failed_rank=failed)
