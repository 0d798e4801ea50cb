"""Telemetry pipeline benchmark: synthetic ranks (separate processes, raw sockets speaking
ddptop.wire.protocol) flood a real Hub whose sink is a real Session (RunState.apply +
Recorder.record_steps into a temporary run directory), over the real Unix socket.

    .venv/bin/python bench/bench_hub.py [--records 1000000] [--ranks 4] [--batch 100]

flood   every rank sends as fast as the socket takes it: records/s ingested, and per
        CPU-second of the hub process (the hub, state and recorder share one thread,
        so that is "on one core"); latency here is mostly queueing in socket buffers
paced   ranks send at fixed total rates (default 5,000, 20,000 and 50,000 records/s; one
        frame per rank every `batch / rate * ranks` s): step-to-state latency p50/p99, from
        `t` stamped just before the frame is sent to the moment RunState has applied it.
        An offered load above what the hub ingests only measures a growing queue.
memory  RSS of the hub process before the flood and after each phase (ring buffers and
        histograms: bounded whatever the run length)
and a check that every record reached steps.jsonl.
Targets (issue 7): >= 50,000 records/s on one core, p99 < 50 ms, bounded memory.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import multiprocessing as mp
import os
import secrets
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path

import psutil

from ddptop.model.config import RunConfig
from ddptop.model.options import NodeOptions
from ddptop.model.state import RunState
from ddptop.run.collector import Collector
from ddptop.run.hub import Hub
from ddptop.run.rank_procs import RankProcesses
from ddptop.run.recorder import Recorder, new_run_dir
from ddptop.wire import protocol

TARGET_RATE = 50_000.0
TARGET_P99_MS = 50.0
# The hub process gets CPU 0 to itself, the senders the rest (when there is a rest), so
# "records/s" is what one core ingests, not a share of a box busy encoding frames.
HUB_CPUS = {0}
SENDER_CPUS = set(range(1, os.cpu_count() or 1)) or {0}


def _pin(cpus: set[int]) -> None:
    try:
        os.sched_setaffinity(0, cpus)
    except (AttributeError, OSError):  # not Linux: share the CPUs
        pass


def _record(step: int, now: float) -> dict[str, float]:
    return {
        "step": step,
        "t": now,
        "step_ms": 101.5,
        "data_ms": 2.1,
        "forward_ms": 30.2,
        "backward_ms": 60.7,
        "optimizer_ms": 4.4,
        "comm_ms": 25.3,
        "exposed_comm_ms": 5.1,
        "comm_bytes": 1.2e9,
        "buckets": 4,
        "samples": 32,
        "loss": 2.302585,
    }


def sender(
    path: str,
    token: str,
    rank: int,
    world: int,
    records: int,
    batch: int,
    rate: float,
    start_step: int,
) -> None:
    """One synthetic rank: hello, then `records` step records in frames of `batch`, each
    frame's `t` stamped just before it is sent; `rate` > 0 paces this rank's frames.

    Frames are encoded once and only `t` is patched in, so one sender core keeps up with
    the hub's; the step numbers of a frame therefore repeat (RunState does not mind)."""
    _pin(SENDER_CPUS)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(path)
    sock.sendall(
        protocol.encode(
            protocol.Hello(
                rank=rank,
                local_rank=rank,
                world_size=world,
                host="bench",
                pid=os.getpid(),
                token=token,
            )
        )
    )
    templates: dict[int, bytes] = {}

    def frame(n: int, now: float) -> bytes:
        if n not in templates:
            recs = [{**_record(start_step + i, 0.0), "t": "@T"} for i in range(n)]
            templates[n] = protocol.encode(protocol.Steps(rank=rank, records=recs))
        return templates[n].replace(b'"@T"', repr(now).encode())

    period = batch / rate if rate > 0 else 0.0
    next_at = time.monotonic()
    sent = 0
    while sent < records:
        n = min(batch, records - sent)
        if period:
            delay = next_at - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            next_at += period
        sock.sendall(frame(n, time.time()))
        sent += n
    sock.sendall(protocol.encode(protocol.Bye(rank=rank)))
    sock.close()


class TimedSession(Collector):
    """A run's real hub sink (the Collector: RunState + recorder), plus when each frame reached
    RunState and how many records; with the run's Hub on its token."""

    def __init__(self, state: RunState, run_dir: Path) -> None:
        super().__init__(state, RankProcesses(state, NodeOptions(), run_dir))
        self.token = secrets.token_hex(16)
        self.hub = Hub(self.token, self, world_size=state.world_size)
        self.run_dir = run_dir
        self.records = 0
        self.latency_ms: list[float] = []
        self.first_at = 0.0
        self.last_at = 0.0

    def hub_message(self, msg: protocol.Message, now: float) -> None:
        super().hub_message(msg, now)
        if isinstance(msg, protocol.Steps) and msg.records:
            seen = time.time()  # after apply + record
            self.latency_ms.append((seen - msg.records[0]["t"]) * 1000.0)
            self.records += len(msg.records)
            self.first_at = self.first_at or seen
            self.last_at = seen


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q / 100 * (len(ordered) - 1))))]


async def phase(
    session: TimedSession,
    path: str,
    ranks: int,
    records: int,
    batch: int,
    rate: float,
    start_step: int,
) -> dict[str, float]:
    """Run `ranks` sender processes until the session has seen all `records` of them."""
    ctx = mp.get_context("spawn")
    session.latency_ms.clear()
    session.first_at = session.last_at = 0.0
    before = session.records
    per_rank = records // ranks
    per_rank_rate = rate / ranks if rate > 0 else 0.0
    procs = [
        ctx.Process(
            target=sender,
            args=(path, session.token, r, ranks, per_rank, batch, per_rank_rate, start_step),
        )
        for r in range(ranks)
    ]
    for p in procs:
        p.start()
    me = psutil.Process()
    cpu0 = me.cpu_times()
    deadline = time.monotonic() + 600
    while session.records - before < per_rank * ranks and time.monotonic() < deadline:
        await asyncio.sleep(0.005)
    cpu1 = me.cpu_times()
    for p in procs:
        await asyncio.to_thread(p.join, 30)
    got = session.records - before
    wall = session.last_at - session.first_at
    cpu = (cpu1.user - cpu0.user) + (cpu1.system - cpu0.system)
    lat = session.latency_ms
    return {
        "records": got,
        "wall_s": wall,
        "records_per_s": got / wall if wall > 0 else float("nan"),
        "hub_cpu_s": cpu,
        "records_per_cpu_s": got / cpu if cpu > 0 else float("nan"),
        "frames": len(lat),
        "p50_ms": _pct(lat, 50),
        "p99_ms": _pct(lat, 99),
        "max_ms": max(lat),
        "mean_ms": statistics.fmean(lat),
    }


def rss_mb() -> float:
    gc.collect()
    return psutil.Process().memory_info().rss / 2**20


async def main_async(args: argparse.Namespace) -> int:
    tmp = Path(tempfile.mkdtemp(prefix="ddptop-bench-"))
    sock_dir = tmp / "sock"
    sock_dir.mkdir(mode=0o700)
    state = RunState(run_id="bench", config=RunConfig(), world_size=max(args.ranks, args.paced_ranks), warmup=5,
                     started_at=time.time())
    session = TimedSession(state, new_run_dir(tmp / "runs", "bench"))
    session.recorder = Recorder(session.run_dir)
    path = str(sock_dir / "hub.sock")
    await session.hub.start_unix(path)

    _pin(HUB_CPUS)
    # warm up imports, allocator and the senders' spawn path before the first RSS reading
    await phase(session, path, args.ranks, 10_000 * args.ranks, args.batch, 0.0, 0)
    rss0 = rss_mb()
    flood = await phase(session, path, args.ranks, args.records, args.batch, 0.0, 10**6)
    rss1 = rss_mb()
    rows = [
        ("flood", f"{args.ranks} ranks x {args.records // args.ranks:,}, {args.batch}/frame", flood)
    ]
    paced: dict[float, dict[str, float]] = {}
    for i, rate in enumerate(args.rates):
        paced[rate] = r = await phase(
            session,
            path,
            args.paced_ranks,
            int(rate * args.paced_s),
            args.paced_batch,
            rate,
            10**8 * (i + 2),
        )
        rows.append(
            ("paced", f"{args.paced_ranks} ranks, {rate:,.0f}/s total, {args.paced_batch}/frame", r)
        )
    rss2 = rss_mb()
    await session.hub.close()
    session.recorder.close()
    with open(session.run_dir / "steps.jsonl", "rb") as f:
        lines = sum(1 for _ in f)
    expected = session.records

    print(
        f"ddptop hub benchmark: {os.cpu_count()} CPU(s) (hub pinned to {sorted(HUB_CPUS)}, senders to "
        f"{sorted(SENDER_CPUS)}), python {sys.version.split()[0]}, {time.strftime('%Y-%m-%d %H:%M')}"
    )
    print(
        f"{'phase':<6} {'load':<38} {'records':>9} {'rec/s':>9} {'rec/cpu-s':>10} "
        f"{'p50 ms':>8} {'p99 ms':>8} {'max ms':>8}"
    )
    for name, load, r in rows:
        print(
            f"{name:<6} {load:<38} {r['records']:>9,} {r['records_per_s']:>9,.0f} "
            f"{r['records_per_cpu_s']:>10,.0f} {r['p50_ms']:>8.2f} {r['p99_ms']:>8.2f} {r['max_ms']:>8.2f}"
        )
    print(
        f"RSS: {rss0:.1f} MB before the flood, {rss1:.1f} MB after {flood['records']:,} records "
        f"(+{rss1 - rss0:.1f} MB), {rss2:.1f} MB after the paced phases"
    )
    print(
        f"steps.jsonl: {lines:,} lines for {expected:,} records ingested "
        f"({'all there' if lines == expected else 'MISSING ' + str(expected - lines)})"
    )
    sustained = [rate for rate, r in paced.items() if r["p99_ms"] < TARGET_P99_MS]
    ok = {
        "rate": flood["records_per_s"] >= TARGET_RATE,
        f"p99 at {TARGET_RATE:,.0f}/s": paced.get(TARGET_RATE, {}).get("p99_ms", 1e9)
        < TARGET_P99_MS,
        "memory": rss1 - rss0 < 100.0,
        "complete": lines == expected,
    }
    print(
        "targets: "
        + ", ".join(f"{k} {'ok' if v else 'MISSED'}" for k, v in ok.items())
        + (
            f"; p99 < {TARGET_P99_MS:g} ms up to {max(sustained):,.0f}/s offered"
            if sustained
            else ""
        )
    )
    if args.json:
        print(
            json.dumps(
                {
                    "flood": flood,
                    "paced": {str(k): v for k, v in paced.items()},
                    "rss_mb": [rss0, rss1, rss2],
                    "lines": lines,
                    "records": expected,
                    "ok": ok,
                }
            )
        )
    import shutil

    shutil.rmtree(tmp, ignore_errors=True)
    return 0 if all(ok.values()) else 1


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--records", type=int, default=1_000_000, help="records in the flood phase")
    p.add_argument("--ranks", type=int, default=4, help="sender processes in the flood phase")
    p.add_argument("--batch", type=int, default=100, help="records per frame in the flood phase")
    p.add_argument(
        "--rates",
        type=lambda t: [float(x) for x in t.split(",")],
        default=[5_000.0, 20_000.0, TARGET_RATE],
        help="total records/s of each paced phase",
    )
    p.add_argument("--paced-s", type=float, default=4.0, help="seconds of each paced phase")
    p.add_argument("--paced-ranks", type=int, default=8)
    p.add_argument("--paced-batch", type=int, default=100)
    p.add_argument("--json", action="store_true")
    return asyncio.run(main_async(p.parse_args()))


if __name__ == "__main__":
    sys.exit(main())
