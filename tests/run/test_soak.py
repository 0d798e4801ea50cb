"""Soak (issue 9): 1,000,000 step records through the real socket, Hub, RunState and
Recorder (a Session as the hub's sink, as in a run): RSS stays bounded and every record
reaches steps.jsonl."""

from __future__ import annotations

import asyncio
import multiprocessing as mp
import os
import socket
import time

import psutil
import pytest

from ddptop.model.config import RunConfig
from ddptop.run.recorder import Recorder, new_run_dir
from ddptop.run.session import Session
from ddptop.wire import protocol

TOTAL = 1_000_000
RANKS = 2
BATCH = 1000  # records per frame, as the probe's MAX_BATCH
BOUND_MB = 100.0


def rank_sender(path: str, token: str, rank: int, records: int) -> None:
    """A synthetic rank in its own process: frames encoded once, only `t` patched in, so the
    sender costs far less than the hub and the test measures the hub."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(path)
    sock.sendall(
        protocol.encode(
            protocol.Hello(
                rank=rank,
                local_rank=rank,
                world_size=RANKS,
                host="soak",
                pid=os.getpid(),
                token=token,
            )
        )
    )
    frames = []
    for f in range(8):  # a few distinct frames so step numbers move
        recs = [
            {
                "step": f * BATCH + i,
                "t": "@T",
                "step_ms": 100.0 + i % 7,
                "data_ms": 2.0,
                "forward_ms": 30.0,
                "backward_ms": 60.0,
                "optimizer_ms": 4.0,
                "comm_ms": 25.0,
                "exposed_comm_ms": 5.0,
                "samples": 32,
            }
            for i in range(BATCH)
        ]
        frames.append(protocol.encode(protocol.Steps(rank=rank, records=recs)))
    for n in range(records // BATCH):
        sock.sendall(frames[n % len(frames)].replace(b'"@T"', repr(time.time()).encode()))
    sock.sendall(protocol.encode(protocol.Bye(rank=rank)))
    sock.close()


@pytest.mark.slow  # the suite stays under 10 min on 2 cores: `pytest -m slow` runs it (covered: bench/bench_hub.py and the state's bounded windows)
def test_million_records_bounded_memory_all_on_disk(tmp_path):
    session = Session(
        RunConfig(nproc=RANKS, steps=10**9, warmup=5), tmp_path / "runs", run_id="soak"
    )
    me = psutil.Process()

    # the collector (the hub's sink: state + recorder) on its own, no torchrun
    collector = session.collector
    run_dir = new_run_dir(tmp_path / "runs", "soak")
    collector.recorder = recorder = Recorder(run_dir)

    async def main() -> tuple[float, float, float]:
        session.state.started_at = time.time()
        sock_dir = tmp_path / "s"
        sock_dir.mkdir(mode=0o700)
        path = str(sock_dir / "hub.sock")
        await session.hub.start_unix(path)
        ctx = mp.get_context("spawn")
        procs = [
            ctx.Process(target=rank_sender, args=(path, session.token, r, TOTAL // RANKS))
            for r in range(RANKS)
        ]
        started = time.monotonic()
        for p in procs:
            p.start()

        def received() -> int:
            return sum(rs.steps for rs in session.state.ranks.values())

        baseline = None
        while received() < TOTAL:
            if baseline is None and received() >= 100_000:
                baseline = me.memory_info().rss
            assert time.monotonic() - started < 120, f"only {received():,} records after 120 s"
            await asyncio.sleep(0.01)
        elapsed = time.monotonic() - started
        final = me.memory_info().rss
        for p in procs:
            await asyncio.to_thread(p.join, 10)
            assert p.exitcode == 0
        await session.hub.close()
        recorder.close()
        return elapsed, baseline / 2**20, final / 2**20

    elapsed, base_mb, final_mb = asyncio.run(main())
    print(
        f"\nsoak: {TOTAL:,} records in {elapsed:.1f}s ({TOTAL / elapsed:,.0f}/s), "
        f"RSS {base_mb:.1f} MB after 100k -> {final_mb:.1f} MB after 1M"
    )
    assert final_mb - base_mb < BOUND_MB
    with open(run_dir / "steps.jsonl", "rb") as f:
        lines = sum(1 for _ in f)
    assert lines == TOTAL == recorder.records_written
    state = session.state
    assert all(rs.steps == TOTAL // RANKS and len(rs.recent) <= 256 for rs in state.ranks.values())
    assert state.total_dropped == 0 and state.summary()["steps_per_s"] is not None
