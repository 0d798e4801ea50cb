"""A thousand ranks on a hundred nodes against node 0's hub: the real Hub (TCP, the token) and
its real sink (Collector: RunState + the recorder in a temporary run directory) in this
process; bench/rank_sim.py's simulated ranks in another (so the hub's CPU is its own).

    .venv/bin/python bench/bench_scale.py [--ranks 1024] [--nodes 128] [--step-ms 50] [--steady 10]

connect  every rank connects at a random moment inside one second: how many the hub admits
         (and refuses), and when the last hello arrived
steady   records/s ingested, the hub process's CPU (s per s) and RSS, step-to-state latency
         p50/p99 (a record's `t`, stamped at its step's end on the rank, to the moment RunState
         has applied it: includes the rank's 0.2 s batching, as in a real run)
stop     one `stop` at the agreed step: time until every rank's bye, and at which steps they left
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import secrets
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

from ddptop.model.config import RunConfig
from ddptop.model.options import NodeOptions
from ddptop.model.state import RunState
from ddptop.run.capture_pipeline import agreed_step
from ddptop.run.collector import Collector
from ddptop.run.hub import MAX_UNAUTHENTICATED, Hub
from ddptop.run.rank_procs import RankProcesses
from ddptop.run.recorder import Recorder, new_run_dir
from ddptop.wire import protocol

HERE = Path(__file__).resolve().parent


class TimedSink(Collector):
    """The run's real hub sink, plus when each record reached RunState."""

    def __init__(self, state: RunState, run_dir: Path, nnodes: int, apply: bool = True) -> None:
        super().__init__(state, RankProcesses(state, NodeOptions(nnodes=nnodes, node_rank=0), run_dir))
        self.apply = apply  # False: the hub alone (frames decoded and checked, no RunState, no disk)
        self.max_step = -1
        self.records = 0
        self.latency_ms: list[float] = []
        self.hello_at: list[float] = []
        self.byes = 0
        self.refusals: list[str] = []

    def hub_message(self, msg: protocol.Message, now: float) -> None:
        if self.apply:
            super().hub_message(msg, now)
        seen = time.time()
        if isinstance(msg, protocol.Steps):
            self.records += len(msg.records)
            self.max_step = max(self.max_step, int(msg.records[-1]["step"]))
            self.latency_ms.extend((seen - r["t"]) * 1000.0 for r in msg.records)
        elif isinstance(msg, protocol.Hello):
            self.hello_at.append(time.monotonic())
        elif isinstance(msg, protocol.Bye):
            self.byes += 1

    def hub_refused(self, reason: str) -> None:
        super().hub_refused(reason)
        self.refusals.append(reason)


class OldBoundHub(Hub):
    """The hub as it was before 2026-11-25: at most 64 connections waiting for their hello."""

    waiting_bound = MAX_UNAUTHENTICATED  # type: ignore[assignment]


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q / 100 * (len(ordered) - 1))))] if ordered else float("nan")


async def wait_for(cond, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.01)
    return True


async def bench(a: argparse.Namespace) -> dict[str, object]:
    token = secrets.token_hex(16)
    tmp = Path(tempfile.mkdtemp(prefix="ddptop-scale-"))
    state = RunState(run_id="scale", config=RunConfig(), world_size=a.ranks, warmup=0, nnodes=a.nodes)
    sink = TimedSink(state, new_run_dir(tmp, "scale"), a.nodes, apply=a.sink == "state")
    sink.recorder = Recorder(sink.procs.run_dir)
    hub = (OldBoundHub if a.old_bound else Hub)(token, sink, world_size=a.ranks)
    await hub.start_tcp("127.0.0.1", 0)
    port = int(hub.address.rsplit(":", 1)[1])
    me = psutil.Process()
    rss0 = me.memory_info().rss
    env = {**os.environ, protocol.ENV_TOKEN: token, "PYTHONPATH": os.pathsep.join([str(HERE.parent), str(HERE)])}
    sim = await asyncio.create_subprocess_exec(
        sys.executable, str(HERE / "rank_sim.py"), "127.0.0.1", str(port), "--ranks", str(a.ranks),
        "--nodes", str(a.nodes), "--step-ms", str(a.step_ms), stdout=subprocess.PIPE, env=env)
    t0 = time.monotonic()
    all_in = await wait_for(lambda: len(hub.connected_ranks) >= a.ranks or sim.returncode is not None, 20)
    print(f"connect: {len(hub.connected_ranks)} admitted, {state.refused} refused", file=sys.stderr, flush=True)
    connect = {"admitted": len(hub.connected_ranks), "refused": state.refused, "all_admitted": all_in,
               "last_hello_s": round(max(sink.hello_at, default=t0) - t0, 3),
               "refusals": sorted(set(sink.refusals))[:5]}
    await asyncio.sleep(2.0)  # past the start-up
    r0, cpu0, w0, lat0 = sink.records, me.cpu_times(), time.monotonic(), len(sink.latency_ms)
    await asyncio.sleep(a.steady)
    r1, cpu1, w1 = sink.records, me.cpu_times(), time.monotonic()
    lat = sink.latency_ms[lat0:]
    cpu = (cpu1.user - cpu0.user) + (cpu1.system - cpu0.system)
    steady = {"records_per_s": round((r1 - r0) / (w1 - w0)), "hub_cpu_s_per_s": round(cpu / (w1 - w0), 3),
              "latency_p50_ms": round(pct(lat, 50), 1), "latency_p99_ms": round(pct(lat, 99), 1),
              "rss_mb": round(me.memory_info().rss / 2**20, 1), "rss_growth_mb": round((me.memory_info().rss - rss0) / 2**20, 1)}
    print(f"steady: {steady}", file=sys.stderr, flush=True)
    at = agreed_step(state) if sink.apply else sink.max_step + 10
    ts = time.monotonic()
    await hub.broadcast(protocol.Command("stop", at_step=at))
    await wait_for(lambda: sink.byes >= len(hub.connected_ranks) or sim.returncode is not None, 30)
    stop_s = time.monotonic() - ts
    out, _ = await asyncio.wait_for(sim.communicate(), 60)
    sim_summary = json.loads(out.decode().strip().splitlines()[-1])
    await hub.close()
    sink.recorder.close()
    return {"sink": a.sink, "ranks": a.ranks, "nodes": a.nodes, "step_ms": a.step_ms, "connect": connect, "steady": steady,
            "stop": {"at_step": at, "all_byes_s": round(stop_s, 2), "left_at": sim_summary["stop_steps"]},
            "sim": sim_summary, "rss_end_mb": round(me.memory_info().rss / 2**20, 1),
            "mem_ranks_state": len(state.ranks)}


def main() -> None:
    import faulthandler
    import signal

    faulthandler.register(signal.SIGUSR1)  # where a stuck benchmark is: kill -USR1 <pid>
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ranks", type=int, default=1024)
    p.add_argument("--nodes", type=int, default=128)
    p.add_argument("--step-ms", type=float, default=50.0)
    p.add_argument("--steady", type=float, default=10.0)
    p.add_argument("--old-bound", action="store_true", help="the pre-hello bound of 64, as before")
    p.add_argument("--sink", choices=("state", "null"), default="state",
                   help="state: the run's real Collector (RunState + recorder); null: the hub alone")
    print(json.dumps(asyncio.run(bench(p.parse_args())), indent=1))


if __name__ == "__main__":
    main()
