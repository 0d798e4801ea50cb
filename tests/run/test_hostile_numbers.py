"""Out-of-range numbers from a token holder (issue 33.2): a peer that knows the token speaks
the protocol over a raw socket to a real Hub whose sink is the run's own Collector and
RunState. Every number out of range (step 10^400, step_ms -1e308, samples -1e308, t 1e300)
refuses its frame, counted; the run's figures are those of the good records alone. A hello
for a node the run does not have is refused and the real rank still gets in."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from ddptop.model import figures
from ddptop.model.config import RunConfig
from ddptop.model.options import NodeOptions
from ddptop.model.state import RunState
from ddptop.run.collector import Collector
from ddptop.run.hub import Hub
from ddptop.run.rank_procs import RankProcesses
from ddptop.wire import protocol

TOKEN = "t0ken"


def hello(rank: int, node: int = 0) -> bytes:
    return protocol.encode(protocol.Hello(rank=rank, local_rank=rank, world_size=2, host="h", pid=1,
                                          token=TOKEN, node=node))


def frame(rank: int, record: str) -> bytes:
    return b'{"v":1,"kind":"steps","rank":%d,"records":[%s]}\n' % (rank, record.encode())


def good(step: int) -> str:
    return f'{{"step":{step},"step_ms":100.0,"samples":32,"t":1700000000.5}}'


HOSTILE = [
    '{"step":1%s,"step_ms":100.0}' % ("0" * 400),  # step 10^400
    '{"step":7,"step_ms":-1e308}',
    '{"step":7,"step_ms":100.0,"samples":-1e308}',
    '{"step":7,"step_ms":100.0,"t":1e300}',
    '{"step":7,"step_ms":1e308}',
    '{"step":7,"step_ms":100.0,"comm_ms":-5.0}',
    '{"step":7,"step_ms":100.0,"profiled":1e9}',
]


@pytest.mark.parametrize("record", HOSTILE + ['{"step":7,"step_ms":100.0,"mem_peak_mb":-1}'])
def test_each_out_of_range_number_refuses_its_record(record: str) -> None:
    with pytest.raises(protocol.ProtocolError) as err:
        protocol.decode(frame(0, record))
    assert err.value.reason == "bad-record"


def test_in_range_numbers_pass_and_a_hair_below_zero_reads_zero() -> None:
    msg = protocol.decode(frame(0, '{"step":3,"step_ms":100.0,"data_ms":-0.01,"loss":-2.5,"t":1.7e9}'))
    assert isinstance(msg, protocol.Steps)
    assert msg.records == [{"step": 3, "step_ms": 100.0, "data_ms": 0.0, "loss": -2.5, "t": 1.7e9}]


def test_a_token_holders_out_of_range_numbers_are_refused_counted_and_figures_intact(tmp_path: Path) -> None:
    async def main() -> None:
        state = RunState("r", RunConfig(steps=100), world_size=2, warmup=0)
        procs = RankProcesses(state, NodeOptions(), tmp_path)  # no launcher: pids not checked here
        hub = Hub(TOKEN, Collector(state, procs), world_size=2)
        d = tmp_path / "s"
        d.mkdir(mode=0o700)
        path = protocol.parse_addr(await hub.start_unix(str(d / "hub.sock")))[1]
        assert isinstance(path, str)

        # a "node 1" hello in a one-node run: refused, and the real rank 1 still gets in
        _, w1 = await asyncio.open_unix_connection(path)
        w1.write(hello(1, node=1))
        await w1.drain()
        await until(lambda: state.refused == 1)
        assert any("node 1: this run has 1 node(s)" in line for line in state.logs[-1])

        sockets = []
        for rank in (0, 1):
            _, w = await asyncio.open_unix_connection(path)
            w.write(hello(rank))
            for step in range(5):
                w.write(frame(rank, good(step)))
            if rank == 0:
                for record in HOSTILE:
                    w.write(frame(0, record))
            for step in range(5, 10):
                w.write(frame(rank, good(step)))
            await w.drain()
            sockets.append(w)
        await until(lambda: all(state.ranks[r].steps == 10 for r in (0, 1)))
        assert state.refused == 1 and state.dropped == {"bad-record": len(HOSTILE)}
        for r in (0, 1):
            rs = state.ranks[r]
            assert rs.last_step == 9 and rs.measured_ms == 1000.0 and rs.measured_samples == 320
            assert rs.hello is not None and rs.hello.node == 0
        assert state.steps_per_s() == pytest.approx(10.0)
        assert figures.job_samples_per_s_run(state.ranks.values()) == pytest.approx(640.0)  # both ranks
        assert state.summary()["dropped_frames"] == {"bad-record": len(HOSTILE)}  # shown in the summary
        for w in sockets + [w1]:
            w.close()
        await hub.close()

    asyncio.run(main())


async def until(cond, timeout: float = 5.0) -> None:  # noqa: ANN001
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.01)

