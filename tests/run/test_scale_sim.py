"""256 simulated ranks on 32 nodes (bench/rank_sim.py: the real protocol, no torch) through the
real TCP hub with the token and the run's real sink (Collector: RunState + recorder): every
rank admitted within the connect second, the straggler named (and its node), and a stop at one
agreed step."""

from __future__ import annotations

import asyncio
import secrets
import sys
import time
from pathlib import Path

from ddptop.model.config import RunConfig
from ddptop.model.options import NodeOptions
from ddptop.model.state import RunState
from ddptop.run.capture_pipeline import agreed_step
from ddptop.run.collector import Collector
from ddptop.run.hub import MAX_UNAUTHENTICATED, Hub
from ddptop.run.rank_procs import RankProcesses
from ddptop.run.recorder import Recorder, new_run_dir
from ddptop.wire import protocol

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
from rank_sim import SimSpec, simulate  # noqa: E402

RANKS, NODES = 256, 32


async def until(cond, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.02)


STRAGGLER = 137  # on node 17 (8 ranks a node)


def test_256_simulated_ranks_on_32_nodes_are_all_admitted_a_straggler_named_and_stop_at_one_step(tmp_path):
    async def main():
        token = secrets.token_hex(16)
        state = RunState(run_id="sim", config=RunConfig(), world_size=RANKS, nnodes=NODES)
        sink = Collector(state, RankProcesses(state, NodeOptions(nnodes=NODES, node_rank=0), tmp_path))
        sink.recorder = Recorder(new_run_dir(tmp_path, "sim"))
        hub = Hub(token, sink, world_size=RANKS)
        addr = await hub.start_tcp("127.0.0.1", 0)
        spec = SimSpec(ranks=RANKS, nodes=NODES, step_ms=10.0, connect_window_s=0.5, straggler=STRAGGLER,
                       straggler_factor=1.5)
        t0 = time.monotonic()
        ranks = asyncio.create_task(simulate(spec, "127.0.0.1", int(addr.rsplit(":", 1)[1]), token))
        await until(lambda: len(hub.connected_ranks) == RANKS, 20)
        connect_s = time.monotonic() - t0
        await until(lambda: state.straggler_verdict.rank is not None, 30)
        at = agreed_step(state)
        await hub.broadcast(protocol.Command("stop", at_step=at))
        results = await asyncio.wait_for(ranks, 20)
        await hub.close()
        sink.recorder.close()
        return state, results, at, connect_s

    state, results, at, connect_s = asyncio.run(main())
    print(f"256 ranks admitted in {connect_s:.2f} s; stop after step {at}")
    assert state.straggler_verdict.rank == STRAGGLER and state.ranks[STRAGGLER].hello.node == 17
    assert RANKS > MAX_UNAUTHENTICATED  # more ranks at once than the old pre-hello bound let in
    assert state.refused == 0 and sorted(state.ranks) == list(range(RANKS))
    assert {r.ended for r in results} == {"stopped"}
    assert {r.last_step for r in results} == {at}  # one agreed boundary: nobody ahead, nobody behind
    assert {rs.last_step for rs in state.ranks.values()} == {at}  # and the hub has every record to it
    assert sorted({rs.hello.node for rs in state.ranks.values() if rs.hello}) == list(range(NODES))



def test_a_crashed_and_a_stalled_simulated_rank_are_seen_as_such_and_the_rest_stop(tmp_path):
    """Rank 3 drops its connection at step 5 (no bye): the state says lost; rank 13 hangs at
    step 5, connected and deaf to stop: still running when the 14 others have stopped."""
    others = [r for r in range(16) if r not in (3, 13)]

    async def main():
        token = secrets.token_hex(16)
        state = RunState(run_id="sim", config=RunConfig(), world_size=16, nnodes=4)
        sink = Collector(state, RankProcesses(state, NodeOptions(nnodes=4, node_rank=0), tmp_path))
        hub = Hub(token, sink, world_size=16)
        addr = await hub.start_tcp("127.0.0.1", 0)
        spec = SimSpec(ranks=16, nodes=4, step_ms=20.0, connect_window_s=0.2, crash=3, crash_at=5,
                       stall=13, stall_at=5)
        ranks = asyncio.create_task(simulate(spec, "127.0.0.1", int(addr.rsplit(":", 1)[1]), token))
        await until(lambda: len(state.ranks) == 16 and min(state.ranks[r].last_step for r in others) >= 10, 20)
        at = agreed_step(state)
        await hub.broadcast(protocol.Command("stop", at_step=at))
        await until(lambda: all(state.ranks[r].status == "stopped" for r in others), 20)
        seen = {r: (state.ranks[r].status, state.ranks[r].last_step) for r in (3, 13)}
        await hub.close()  # the stalled rank's connection ends with the hub's
        return await asyncio.wait_for(ranks, 10), at, seen

    results, at, seen = asyncio.run(main())
    assert seen[3][0] == "lost" and seen[13] == ("running", 4)  # a crash loses what it had not sent
    ends = {r.rank: (r.ended, r.last_step) for r in results}
    assert ends[3] == ("crashed", 4) and ends[13] == ("stalled", 4)
    assert {ends[r] for r in others} == {("stopped", at)}


def test_the_agreed_stop_step_allows_for_how_late_records_reach_the_state():
    """1,024 simulated ranks on one core (docs/BENCHMARKS.md, 2026-11-26): records reached the
    state 0.8 s late at p99 and the old margin (0.4 s of steps) was passed before the command
    arrived. Now: at least 0.4 s worth of steps, or twice the ranks' median report lag."""
    from ddptop.wire.protocol import Steps

    def state_with(lag_s: float) -> RunState:
        state = RunState(run_id="lag", config=RunConfig(), world_size=2)
        now = 1000.0
        for r in (0, 1):
            recs = [{"step": s, "t": now - lag_s - (99 - s) * 0.05, "step_ms": 50.0} for s in range(100)]
            state.apply(Steps(r, recs), now)
        return state

    assert agreed_step(state_with(0.05)) == 99 + 2 + 8  # 0.4 s of 50 ms steps
    assert agreed_step(state_with(0.8)) == 99 + 2 + 32  # 2 x 0.8 s
    assert agreed_step(state_with(60.0)) == 99 + 2 + 400  # a lag beyond 10 s counts as 10 s
    # one step in K timed (phase_every): a rank's last record can be K - 1 steps behind it, and
    # ranks past the agreed step would stop apart (or miss a capture) (session 17)
    sampled = state_with(0.05)
    sampled.ranks[1].info["phase_every"] = 16
    assert agreed_step(sampled) == 99 + 2 + 15 + 8
