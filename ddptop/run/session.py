"""Session: one run in this process, end to end. It composes the parts and owns the
lifecycle: the run directory, the hub, torchrun, the stop, and the final summary.

- `collector` (ddptop.run.collector): the hub's sink, into `state` and the recorder;
- `watchdog` (ddptop.run.watchdog): ticks, logs, NCCL, stalls and stacks, hardware;
- `capture_pipeline` (ddptop.run.capture_pipeline): profiling windows and their summaries;
- `procs` (ddptop.run.rank_procs): which processes and directories are the ranks.

Any front end (headless printer, TUI, a supervisor) observes `session.state` and calls
`request_stop()` (a `ddptop.run.handle.RunHandle`); nothing here assumes a terminal.
"""

from __future__ import annotations

import asyncio
import secrets
import shutil
import socket
import tempfile
import time
from pathlib import Path

from ddptop.analysis.capture import Capture
from ddptop.hw.hardware import HardwareSampler
from ddptop.model.config import RunConfig
from ddptop.model.failures import last_exception
from ddptop.model.options import CaptureOptions, NodeOptions, python_ignores_pythonpath
from ddptop.model.run_ids import new_run_id
from ddptop.model.state import RunState
from ddptop.run import nccl_plugin, outcome
from ddptop.run.capture_pipeline import CapturePipeline, agreed_step
from ddptop.run.collector import Collector
from ddptop.run.cost_files import cost_of, read_cost_blocks
from ddptop.run.hub import Hub
from ddptop.run.launcher import SOCKET_DIR_PREFIX, Launcher, build_plan, remove_stale_socket_dirs
from ddptop.run.multinode import hub_bind_host, join_instructions
from ddptop.run.rank_procs import RankProcesses
from ddptop.run.recorder import Recorder, disk_error, new_run_dir, runs_dir_warning
from ddptop.run.stopping import Stopper
from ddptop.run.watchdog import Watchdog
from ddptop.wire import protocol

DRAIN_S = 0.5  # after torchrun exits, at most this long for the ranks' last frames (Hub.drained)
AGREED_SLACK_S = 0.5  # beyond the agreed step's expected time: its report, the ranks' exit

__all__ = ["Session", "last_exception", "new_run_id"]


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
        self.token = self.node.token if self.node.multi else secrets.token_hex(16)
        self.capture = capture or CaptureOptions()
        self.state = RunState(
            run_id=self.run_id,
            config=config.script_view() if user_cmd else config,
            world_size=config.world_size * self.node.nnodes,
            warmup=config.warmup,
            nnodes=self.node.nnodes,
            command=list(user_cmd) if user_cmd else None,
        )
        run_dir = Path(runs_dir) / self.run_id
        self.procs = RankProcesses(self.state, self.node, run_dir)
        self.capture_pipeline = CapturePipeline(self.state, self.capture, run_dir)
        self.collector = Collector(self.state, self.procs, on_capture=self.capture_pipeline.report)
        self.hub = Hub(self.token, self.collector, world_size=self.state.world_size)
        self._stop_requested = asyncio.Event()
        self._stop_reason = ""
        self._started_mono = 0.0  # time.monotonic() at the run's start
        self.stopper = Stopper(self.state, self.procs, config.stop_grace)
        self.watchdog = Watchdog(self.state, self.procs, hardware or HardwareSampler(), config.nccl_env,
                                 self.request_stop, self._stop_requested.is_set)
        self._sock_dir: str | None = None
        self._done = asyncio.Event()

    # --- the parts' shared facts ------------------------------------------------------
    @property
    def run_dir(self) -> Path:
        return self.procs.run_dir

    @run_dir.setter
    def run_dir(self, path: Path) -> None:
        self.procs.run_dir = self.capture_pipeline.run_dir = path

    @property
    def recorder(self) -> Recorder | None:
        return self.collector.recorder

    @property
    def launcher(self) -> Launcher | None:
        return self.procs.launcher

    # --- lifecycle --------------------------------------------------------------------
    @property
    def done(self) -> bool:
        return self._done.is_set()

    async def wait_done(self) -> None:
        await self._done.wait()

    async def run(self) -> RunState:
        """Start the run and return its final state once torchrun has exited."""
        try:
            await self._launch()
            rc = await self._supervise()
            await self._wind_down(rc)
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
            await self._close()
        return self.state

    async def _launch(self) -> None:
        self.run_dir = new_run_dir(self.run_dir.parent, self.run_id)
        recorder = Recorder(self.run_dir)
        unmeasured = python_ignores_pythonpath(self.user_cmd)
        if unmeasured:  # said where every view looks, and in the summary's notes
            self.state.notes.append(unmeasured)
            self.state.add_log(-1, f"[ddptop] {unmeasured}")
        shared = runs_dir_warning(self.run_dir.parent)
        if shared:  # said once, where every view looks (the run stops if its directory is swapped)
            self.state.notes.append(shared)
            self.state.add_log(-1, f"[ddptop] {shared}")
        self.collector.recorder = self.watchdog.recorder = recorder
        self.state.started_at = time.time()
        self._started_mono = time.monotonic()  # the run's length: a wall-clock step is not part of it
        addr = await self._start_hub()
        plugin = await asyncio.to_thread(nccl_plugin.build_for, self.config, self.run_dir)
        plan = build_plan(self.config, self.run_dir, addr, self.token, self.run_id, self.user_cmd,
                          nsys=self.capture.nsys, node=self.node, nccl_plugin=plugin)
        recorder.write_config(
            self.config.to_dict(), run_id=self.run_id, argv=plan.argv, host=socket.gethostname(),
            user_cmd=self.user_cmd, **self._node_facts(),
        )
        launcher = Launcher(plan, leftovers=(self._sock_dir,) if self._sock_dir else ())
        self.procs.launcher = launcher
        for start, count in self.capture.windows:  # the windows asked for on the command line
            await self.request_capture(count, start)
        await launcher.start()

    async def _start_hub(self) -> str:
        """The hub's address for the ranks. On one node the socket lives in a private (0700)
        temp dir: Unix paths are short, and nobody else on a shared node may even reach it."""
        if self.node.multi:
            await self.hub.start_tcp(hub_bind_host(self.node), self.node.hub_port)
            for line in join_instructions(self.config, self.node, self.user_cmd).splitlines():
                self.state.add_log(-1, "[ddptop] " + line.removeprefix("ddptop: "))
            return self.node.hub_addr
        remove_stale_socket_dirs(Path(tempfile.gettempdir()))  # of ddptops killed outright
        self._sock_dir = tempfile.mkdtemp(prefix=SOCKET_DIR_PREFIX)
        return await self.hub.start_unix(str(Path(self._sock_dir) / "hub.sock"))

    async def _supervise(self) -> int:
        """torchrun's exit code, the watchdog's and the stop's loops running meanwhile."""
        launcher = self.launcher
        assert launcher is not None, "launched first"
        loops = [
            asyncio.create_task(self.watchdog.tick_loop()),
            asyncio.create_task(self._stop_loop()),
            asyncio.create_task(self.watchdog.hardware_loop()),
        ]
        try:
            return await launcher.wait()
        finally:
            for task in loops:
                task.cancel()

    async def _wind_down(self, rc: int) -> None:
        await self.hub.drained(DRAIN_S)
        await self.capture_pipeline.drain()
        await self.capture_pipeline.nsys_stats()
        self.watchdog.poll_logs()
        if self.config.cost_ab > 0:
            await self._read_costs()
        self._finish(rc)

    async def _read_costs(self) -> None:
        """`--set cost_ab`: what the rank-side layer cost this run, from the ranks' blocks."""
        results, problems = read_cost_blocks(self.run_dir, self.state.world_size)
        self.state.notes.extend(problems)
        # a few seconds of bootstrap, off the event loop
        self.state.cost, problem = await asyncio.to_thread(cost_of, results, self.config.cost_ab_busy_pct)
        if problem:
            self.state.notes.append(problem)

    async def _close(self) -> None:
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

    def request_stop(self, reason: str = "stopped by user") -> None:
        """Stop the run as torchrun stops it on Ctrl-C (ddptop.run.stopping): every rank asked to
        leave its loop at one agreed step, SIGINT at once unless that has ended the run."""
        if not self._stop_requested.is_set():
            self._stop_reason = reason
            self._stop_requested.set()

    @property
    def stop_requested(self) -> bool:
        return self._stop_requested.is_set()

    def escalate_stop(self, reason: str = "stopped by user") -> str:
        """A second Ctrl-C: SIGTERM to the ranks still running, as torchrun's second does.
        Returns what was done ('': nothing)."""
        if self._stop_requested.is_set():
            return self.stopper.escalate()
        self.request_stop(reason)
        return ""

    def stop_step(self) -> int:
        """A step no rank has reached yet, allowing for the probes' report delay."""
        return agreed_step(self.state)

    async def request_capture(self, count: int = 3, start: int | None = None) -> Capture:
        """Profile `count` steps on every rank from `start` (default: the first step no
        rank can have reached yet), so every rank records the same steps."""
        cap, command = self.capture_pipeline.schedule(count, start)
        await self.hub.broadcast(command)
        self.state.add_log(-1, f"[ddptop] capture {cap.capture_id}: steps {cap.steps} with {cap.profiler}")
        return cap

    def update_advice(self) -> None:
        self.watchdog.update_advice()

    async def _stop_loop(self) -> None:
        await self._stop_requested.wait()
        at_step = self.stop_step()
        self.state.add_log(-1, f"[ddptop] stop requested ({self._stop_reason}): ranks stop after step {at_step}")
        await self.hub.broadcast(protocol.StopCommand(at_step).to_command())
        # the agreed step's moment: as long as the rank furthest from it takes to reach it (ranks
        # that never sync can be far apart); none where they step not at all (a validation pass,
        # hand-written updates): the signal then follows at once
        etas = [(at_step - rs.last_step) * p50 / 1000.0 for rs in self.state.ranks.values()
                if (p50 := rs.recent_pct(50) or 0.0) > 0]
        agreed_s = max(etas) + AGREED_SLACK_S if etas else 0.0
        # a user's Ctrl-C reaches the ranks within AGREED_MAX_S, as under torchrun; a stop of
        # ddptop's own (its records can no longer be kept) waits for the ranks to leave at the
        # step it agreed on (a rank starved of CPU runs far slower than its p50 says), where
        # they take steps at all
        await self.stopper.run(agreed_s, patient=bool(self.state.error and etas))

    def _node_facts(self) -> dict[str, object]:
        n = self.node
        if not n.multi:
            return {}
        return {"nnodes": n.nnodes, "node_rank": n.node_rank, "rdzv_endpoint": n.endpoint,
                "rdzv_id": n.rdzv_id, "hub": f"{n.rdzv_host}:{n.hub_port}"}

    def _finish(self, rc: int) -> None:
        self.capture_pipeline.settle()
        # the end: its start plus the monotonic time since (a +3600 s step read elapsed_s 3638)
        end = self.state.started_at + (time.monotonic() - self._started_mono) if self.state.started_at else time.time()
        outcome.settle(self.state, rc, self.procs, end, recorder_error=self.recorder.error if self.recorder else "",
                       stopped=self._stop_requested.is_set(), stop_reason=self._stop_reason,
                       user_script=bool(self.user_cmd))
        self.watchdog.update_advice()
