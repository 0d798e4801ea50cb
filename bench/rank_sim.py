"""Simulated ranks for scale: asyncio tasks that speak ddptop.wire.protocol over TCP to a real
Hub with the run's token, one connection each, as a rank's probe does (no torch).

Each rank: connects at a moment of its own inside `connect_window_s` (retrying a refused
connect with the probe's own waits), says hello with its node, then steps: `step_ms` with
some jitter, split into the four phases and comm, batched into one frame per `flush_s`.
It obeys a `stop` command at the step boundary it names (finishes that step, sends what it
holds and a bye), and a `capture` by marking those steps `profiled`. One rank may be a
straggler (its compute `straggler_factor` times longer), one may stall (stops stepping and
reporting at `stall_at`, still connected, deaf to stop), one may crash (closes its socket
without a bye at `crash_at`).

    from rank_sim import SimSpec, simulate   # bench/ on sys.path
    results = await simulate(SimSpec(ranks=256, nodes=32), "127.0.0.1", port, token)
    DDPTOP_TOKEN=... python bench/rank_sim.py HOST PORT [--ranks 64] [--nodes 8] [--step-ms 50]
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import time
from dataclasses import dataclass, field

from ddptop.wire import protocol

RETRY_S = (0.05, 0.1, 0.2, 0.5, 1.0, 2.0)  # as ddptop.rank.client: a busy listen queue is not fatal


@dataclass
class SimSpec:
    ranks: int = 8
    nodes: int = 1
    step_ms: float = 50.0
    jitter: float = 0.05  # each step's time: step_ms * (1 +- jitter), uniformly
    phases: tuple[float, float, float, float] = (0.05, 0.30, 0.55, 0.10)  # data, forward, backward, optimizer
    comm_share: float = 0.25  # of the step, inside backward
    straggler: int | None = None  # a rank whose compute takes straggler_factor times longer
    straggler_factor: float = 1.5
    stall: int | None = None  # a rank that stops at stall_at (hangs: connected, silent, deaf)
    stall_at: int = 20
    crash: int | None = None  # a rank that drops its connection at crash_at, no bye
    crash_at: int = 20
    steps: int | None = None  # stop by itself after this many steps (None: until told)
    flush_s: float = 0.2
    connect_window_s: float = 1.0  # every rank connects at a random moment within this
    seed: int = 0


@dataclass
class RankResult:
    rank: int
    node: int
    connected_at: float = 0.0  # s after the simulation started, 0: never connected
    last_step: int = -1  # the last step it finished
    stop_at: int | None = None  # the step it was told to stop after
    ended: str = ""  # "stopped", "completed", "closed" (the hub closed it), "crashed", "stalled"
    records: int = 0
    profiled: list[int] = field(default_factory=list)


class SimRank:
    def __init__(self, spec: SimSpec, rank: int, rng: random.Random) -> None:
        self.spec = spec
        self.rank = rank
        self.node = rank * spec.nodes // spec.ranks
        self.local_rank = rank - (self.node * spec.ranks + spec.nodes - 1) // spec.nodes
        self.rng = rng
        self.result = RankResult(rank, self.node)
        self.stop_at: int | None = None
        self.capture: tuple[int, int] | None = None  # (first step, count)
        self.held: list[dict[str, float]] = []

    async def run(self, host: str, port: int, token: str, t0: float) -> RankResult:
        await asyncio.sleep(self.rng.random() * self.spec.connect_window_s)
        conn = await self._connect(host, port)
        if conn is None:
            self.result.ended = "refused"
            return self.result
        reader, writer = conn
        self.result.connected_at = time.monotonic() - t0
        hello = protocol.Hello(rank=self.rank, local_rank=self.local_rank, world_size=self.spec.ranks,
                               host=f"sim{self.node:03d}", pid=100_000 + self.rank, token=token,
                               backend="gloo", node=self.node)
        writer.write(protocol.encode(hello))
        listener = asyncio.create_task(self._listen(reader))
        try:
            self.result.ended = await self._steps(writer, listener)
        except (ConnectionError, OSError):
            self.result.ended = "closed"
        finally:
            listener.cancel()
            writer.close()
        return self.result

    async def _connect(self, host: str, port: int):  # -> (reader, writer) | None
        for wait in (*RETRY_S, *([RETRY_S[-1]] * 10)):
            try:
                return await asyncio.open_connection(host, port)
            except OSError:
                await asyncio.sleep(wait)
        return None

    async def _listen(self, reader: asyncio.StreamReader) -> None:
        """Commands from the hub: stop at a step, capture some steps."""
        while True:
            line = await reader.readline()
            if not line:
                return
            msg = protocol.decode(line)
            if isinstance(msg, protocol.Command) and msg.name == "stop":
                self.stop_at = msg.at_step if msg.at_step >= 0 else max(self.result.last_step, 0)
                self.result.stop_at = self.stop_at
            elif isinstance(msg, protocol.Command) and msg.name == "capture":
                self.capture = (int(msg.args.get("start", msg.at_step)), int(msg.args.get("count", 3)))

    def _record(self, step: int, ms: float, wait: float) -> dict[str, float]:
        """A step of `ms` own work, `wait` ms of it spent in the all-reduce waiting for a
        straggler at backward's end (as DDP's ranks meet there)."""
        data, fwd, bwd, opt = (ms * p for p in self.spec.phases)
        transfer = self.spec.step_ms * self.spec.comm_share
        rec = {"step": step, "t": time.time(), "step_ms": ms + wait, "data_ms": data, "forward_ms": fwd,
               "backward_ms": bwd + wait, "optimizer_ms": opt, "comm_ms": transfer + wait,
               "exposed_comm_ms": transfer * 0.2 + wait, "comm_bytes": 4.0e8, "buckets": 4,
               "samples": 32, "loss": 2.3 - step * 1e-4}
        if self.capture and self.capture[0] <= step < self.capture[0] + self.capture[1]:
            rec["profiled"] = 1
            self.result.profiled.append(step)
        return rec

    async def _flush(self, writer: asyncio.StreamWriter) -> None:
        if self.held:
            writer.write(protocol.encode(protocol.Steps(rank=self.rank, records=self.held)))
            self.result.records += len(self.held)
            self.held = []
        await writer.drain()

    async def _steps(self, writer: asyncio.StreamWriter, listener: asyncio.Task[None]) -> str:
        spec, step, flushed = self.spec, 0, time.monotonic()
        while True:
            if listener.done():  # the hub closed us: a rank would reconnect; the benchmark counts it
                return "closed"
            if self.rank == spec.stall and step >= spec.stall_at:
                await self._flush(writer)
                await asyncio.wait({listener})  # hung in a collective: silent, deaf to stop, until the hub closes
                return "stalled"
            if self.rank == spec.crash and step >= spec.crash_at:
                writer.transport.abort()
                return "crashed"
            ms = spec.step_ms * (1 + spec.jitter * (2 * self.rng.random() - 1))
            wait = 0.0
            if self.rank == spec.straggler:
                ms *= spec.straggler_factor
            elif spec.straggler is not None:  # the others wait for it in the all-reduce
                wait = spec.step_ms * (spec.straggler_factor - 1)
            await asyncio.sleep((ms + wait) / 1000.0)
            self.held.append(self._record(step, ms, wait))
            self.result.last_step = step
            done = (self.stop_at is not None and step >= self.stop_at) or (spec.steps is not None and step + 1 >= spec.steps)
            if done or time.monotonic() - flushed >= spec.flush_s:
                await self._flush(writer)
                flushed = time.monotonic()
            if done:
                reason = "stopped" if self.stop_at is not None and step >= self.stop_at else "completed"
                writer.write(protocol.encode(protocol.Bye(rank=self.rank, reason=reason)))
                await writer.drain()
                return reason
            step += 1


async def simulate(spec: SimSpec, host: str, port: int, token: str) -> list[RankResult]:
    """Run every simulated rank to its end; their results, by rank."""
    rng = random.Random(spec.seed)
    sims = [SimRank(spec, r, random.Random(rng.random())) for r in range(spec.ranks)]
    t0 = time.monotonic()
    return list(await asyncio.gather(*(s.run(host, port, token, t0) for s in sims)))


def summary(results: list[RankResult]) -> dict[str, object]:
    ends: dict[str, int] = {}
    for r in results:
        ends[r.ended] = ends.get(r.ended, 0) + 1
    connected = [r.connected_at for r in results if r.connected_at]
    return {"ranks": len(results), "ends": ends, "records": sum(r.records for r in results),
            "last_connect_s": round(max(connected, default=0.0), 3),
            "stop_steps": sorted({r.last_step for r in results if r.ended == "stopped"})}


if __name__ == "__main__":  # play ranks against a hub elsewhere: HOST PORT, token in $DDPTOP_TOKEN
    import argparse

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("host")
    p.add_argument("port", type=int)
    p.add_argument("--ranks", type=int, default=64)
    p.add_argument("--nodes", type=int, default=8)
    p.add_argument("--step-ms", type=float, default=50.0)
    p.add_argument("--steps", type=int)
    a = p.parse_args()
    res = asyncio.run(simulate(SimSpec(ranks=a.ranks, nodes=a.nodes, step_ms=a.step_ms, steps=a.steps),
                               a.host, a.port, os.environ[protocol.ENV_TOKEN]))
    print(json.dumps(summary(res)))
