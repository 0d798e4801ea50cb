"""The hub over a real Unix socket: auth, framing, bad input, commands to probes."""

import asyncio
import os
import socket
import stat

import pytest
from recording_sink import Sink

from ddptop.probe import Probe
from ddptop.run.hub import Hub
from ddptop.wire import protocol


def hello(rank=0, token="secret"):
    return protocol.Hello(rank=rank, local_rank=rank, world_size=2, host="h", pid=1, token=token)


async def start(tmp_path, token="secret"):
    sink = Sink()
    hub = Hub(token, sink)
    d = tmp_path / "sock"
    d.mkdir(mode=0o700)
    addr = await hub.start_unix(str(d / "hub.sock"))
    return hub, sink, addr


async def connect(addr):
    return await asyncio.open_unix_connection(protocol.parse_addr(addr)[1])


async def until(cond, timeout=5.0):
    for _ in range(int(timeout / 0.01)):
        if cond():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("condition not met in time")


def test_socket_is_private(tmp_path):
    async def main():
        hub, _, addr = await start(tmp_path)
        path = protocol.parse_addr(addr)[1]
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
        await hub.close()

    asyncio.run(main())


@pytest.mark.parametrize("first", [hello(token="wrong"), hello(token=""), protocol.Bye(0), b"garbage"])
def test_peer_without_the_token_is_refused_and_logged(tmp_path, first):
    async def main():
        hub, sink, addr = await start(tmp_path)
        reader, writer = await connect(addr)
        writer.write(first if isinstance(first, bytes) else protocol.encode(first))
        writer.write(protocol.encode(protocol.Steps(0, [{"step": 0, "step_ms": 1.0}])))
        await writer.drain()
        assert await asyncio.wait_for(reader.read(), 5) == b""  # closed on us
        assert len(sink.refused) == 1 and sink.messages == []
        assert hub.connected_ranks == []
        await hub.close()

    asyncio.run(main())


def test_bad_frames_are_counted_and_the_connection_survives(tmp_path):
    async def main():
        hub, sink, addr = await start(tmp_path)
        _, writer = await connect(addr)
        writer.write(protocol.encode(hello(0)))
        writer.write(b"not json\n")
        writer.write(b"x" * (protocol.MAX_FRAME + 10) + b"\n")  # oversized
        writer.write(protocol.encode(protocol.Steps(1, [{"step": 0}])))  # claims another rank
        writer.write(protocol.encode(protocol.Command("stop")))  # ranks may not command
        writer.write(protocol.encode(protocol.Steps(0, [{"step": 5, "step_ms": 3.0}])))
        await writer.drain()
        await until(lambda: any(isinstance(m, protocol.Steps) for m in sink.messages))
        assert sorted(sink.dropped) == sorted(["not-json", "oversized", "rank-mismatch", "unexpected-command"])
        steps = [m for m in sink.messages if isinstance(m, protocol.Steps)]
        assert steps[0].records == [{"step": 5, "step_ms": 3.0}]
        writer.close()
        await until(lambda: sink.gone == [0])
        await hub.close()

    asyncio.run(main())


def test_drained_returns_once_every_connection_is_read_to_its_end_or_at_its_bound(tmp_path):
    """A run's end waits for the ranks' last frames: until each connection's end is read (the
    frames sent before it all applied), not a fixed pause; a connection still open holds it no
    longer than the bound."""
    async def main():
        hub, sink, addr = await start(tmp_path)
        _, writer = await connect(addr)
        writer.write(protocol.encode(hello(0)))
        writer.write(protocol.encode(protocol.Steps(0, [{"step": s, "step_ms": 1.0} for s in range(500)])))
        await writer.drain()
        _, other = await connect(addr)
        other.write(protocol.encode(hello(1)))
        await other.drain()
        await until(lambda: hub.connected_ranks == [0, 1])
        writer.close()
        t0 = asyncio.get_running_loop().time()
        await hub.drained(0.3)  # rank 1 still connected: the bound
        assert asyncio.get_running_loop().time() - t0 >= 0.3
        assert sum(len(m.records) for m in sink.messages if isinstance(m, protocol.Steps)) == 500
        other.close()
        t0 = asyncio.get_running_loop().time()
        await hub.drained(30.0)  # both ends read: returns then, not at the bound
        assert asyncio.get_running_loop().time() - t0 < 10.0
        assert hub.connected_ranks == [] and sorted(sink.gone) == [0, 1]
        await hub.close()

    asyncio.run(main())


def test_probe_streams_records_and_receives_stop(tmp_path, monkeypatch):
    async def main():
        hub, sink, addr = await start(tmp_path)
        monkeypatch.setenv(protocol.ENV_ADDR, addr)
        monkeypatch.setenv(protocol.ENV_TOKEN, "secret")
        monkeypatch.setenv("RANK", "1")
        monkeypatch.setenv("WORLD_SIZE", "2")
        probe = await asyncio.to_thread(Probe.connect, device="cpu", backend="gloo")
        assert probe.enabled
        for step in range(2000):  # a burst: batched, not one frame per step
            probe.record(step, step_ms=1.0, samples=8)
        await until(lambda: sum(len(m.records) for m in sink.messages if isinstance(m, protocol.Steps)) == 2000)
        frames = [m for m in sink.messages if isinstance(m, protocol.Steps)]
        assert len(frames) < 100
        assert await hub.broadcast(protocol.Command("stop", at_step=7)) == 1
        await until(lambda: probe.stop_at == 7)
        assert not probe.should_stop(6) and probe.should_stop(7)
        await asyncio.to_thread(probe.close, "stopped")
        await until(lambda: any(isinstance(m, protocol.Bye) for m in sink.messages))
        hello_msg = sink.messages[0]
        assert isinstance(hello_msg, protocol.Hello) and hello_msg.rank == 1 and hello_msg.backend == "gloo"
        await hub.close()

    asyncio.run(main())


def test_probe_without_ddptop_does_nothing(monkeypatch):
    monkeypatch.delenv(protocol.ENV_ADDR, raising=False)
    probe = Probe.connect()
    assert not probe.enabled
    assert probe.tick(samples=4) is False
    probe.close()


def test_probe_with_unreachable_hub_keeps_training(monkeypatch, tmp_path, capsys):
    monkeypatch.setenv(protocol.ENV_ADDR, f"unix:{tmp_path / 'nothing.sock'}")
    probe = Probe.connect()
    # nothing there yet: it keeps trying in the background (tests/rank/test_probe_retry.py), training
    # goes on, and nothing is added to the script's output
    probe.record(0, step_ms=1.0)
    assert probe.enabled and probe._sock is None
    probe.close()
    assert not probe.enabled
    assert capsys.readouterr().err == ""
    assert socket  # the module under test uses real sockets


def test_tcp_mode_binds_where_told_and_requires_the_token():
    async def main():
        sink = Sink()
        hub = Hub("secret", sink)
        addr = await hub.start_tcp("127.0.0.1", 0)
        scheme, (host, port) = protocol.parse_addr(addr)
        assert scheme == "tcp" and host == "127.0.0.1"
        assert hub._server.sockets[0].getsockname()[0] == "127.0.0.1"  # loopback only, as asked
        reader, writer = await asyncio.open_connection(host, port)
        writer.write(protocol.encode(hello(token="guess")))
        await writer.drain()
        assert await asyncio.wait_for(reader.read(), 5) == b""
        reader, writer = await asyncio.open_connection(host, port)
        writer.write(protocol.encode(hello(rank=0)))
        await writer.drain()
        await until(lambda: hub.connected_ranks == [0])
        assert len(sink.refused) == 1 and "wrong token" in sink.refused[0]
        writer.close()
        await hub.close()

    asyncio.run(main())


def test_a_start_up_of_300_ranks_connecting_at_once_is_all_admitted_and_the_bound_comes_back():
    """Every rank connects before any says hello (the worst start-up): the pre-hello bound is the
    ranks still missing, not 64, so none is closed; once all are in, idle ones get 64 again."""
    from ddptop.run.hub import MAX_UNAUTHENTICATED

    world = 300

    async def main():
        sink = Sink()
        hub = Hub("secret", sink, world_size=world)
        addr = await hub.start_tcp("127.0.0.1", 0)
        port = int(addr.rsplit(":", 1)[1])
        conns = [await asyncio.open_connection("127.0.0.1", port) for _ in range(world)]
        await until(lambda: len(hub._waiting) == world)
        for rank, (_, writer) in enumerate(conns):
            writer.write(protocol.encode(protocol.Hello(rank=rank, local_rank=0, world_size=world, host="h",
                                                        pid=1, token="secret")))
        await until(lambda: len(hub.connected_ranks) == world)
        assert sink.refused == [] and hub.waiting_bound == MAX_UNAUTHENTICATED
        idle = [await asyncio.open_connection("127.0.0.1", port) for _ in range(MAX_UNAUTHENTICATED + 5)]
        await until(lambda: len(sink.refused) == 5)  # a flood after the start-up: the oldest idle go
        assert len(hub.connected_ranks) == world
        for _, w in conns + idle:
            w.close()
        await hub.close()

    asyncio.run(main())
