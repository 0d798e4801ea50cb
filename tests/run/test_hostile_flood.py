"""Issue 49, case 6: floods never leave ranks unmonitored. 2,000 idle connections of one
same-user process, reconnecting as fast as they are closed, against a real run's hub: both
ranks are monitored. A token holder's hello in the name of a rank that has ended is refused
(it then vanished, and the finished rank read lost: the run failed)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest
from recording_sink import Sink
from test_hub import connect, hello, start, until
from waiting import poll

from ddptop.model.config import RunConfig
from ddptop.model.state import RunState
from ddptop.run.collector import Collector
from ddptop.run.hub import Hub
from ddptop.wire import protocol
from ddptop.wire.protocol import ENV_ADDR

SCRIPTS = Path(__file__).parents[1] / "scripts"

FLOODER = """
import resource, socket, sys, time
path, n = sys.argv[1], int(sys.argv[2])
tcp = path.startswith("tcp:")
where = (path.split(":")[1], int(path.split(":")[2])) if tcp else path
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, 4 * n), hard))
def conn():
    while True:
        s = socket.socket(socket.AF_INET if tcp else socket.AF_UNIX)
        s.settimeout(1.0)
        try:
            s.connect(where)
            s.setblocking(False)
            return s
        except OSError:
            s.close()
            time.sleep(0.01)
import selectors
sel = selectors.DefaultSelector()
for _ in range(n):
    sel.register(conn(), selectors.EVENT_READ)
print("flooding", flush=True)
while True:
    for key, _ in sel.select(1.0):
        s = key.fileobj
        try:
            data = s.recv(4096)
        except OSError:
            data = b""
        if not data:  # closed by the hub: straight back in, idle again
            sel.unregister(s)
            s.close()
            sel.register(conn(), selectors.EVENT_READ)
"""


def flood(path: str, n: int) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-c", FLOODER, path, str(n)], stdout=subprocess.PIPE, text=True,
                            start_new_session=True)


@pytest.mark.parametrize("transport", ["unix", "tcp"])
def test_under_a_flood_of_one_process_a_rank_whose_hello_came_is_admitted(tmp_path: Path, transport: str) -> None:
    """Unix: at most 4 connections without a hello per peer pid. TCP (multi-node, token-less
    flood): no pid to go by; the idle ones go first, never a connection whose hello has come."""

    async def main() -> None:
        if transport == "unix":
            hub, sink, addr = await start(tmp_path)
            target = protocol.parse_addr(addr)[1]
        else:
            sink = Sink()
            hub = Hub("secret", sink, world_size=2)
            addr = target = await hub.start_tcp("127.0.0.1", 0)
        flooder = flood(target, 2000)
        try:
            await until(lambda: len(sink.refused) > 500, timeout=30)  # the flood is on
            ranks = []
            for rank in (0, 1):
                if transport == "unix":
                    _, writer = await connect(addr)
                else:
                    _, writer = await asyncio.open_connection("127.0.0.1", int(addr.rsplit(":", 1)[1]))
                writer.write(protocol.encode(hello(rank)))
                ranks.append(writer)
            with contextlib.suppress(AssertionError):
                await until(lambda: hub.connected_ranks == [0, 1], timeout=10)
            assert hub.connected_ranks == [0, 1], (len(sink.refused), sorted(set(sink.refused))[:5])
            for w in ranks:
                w.close()
        finally:
            os.killpg(flooder.pid, signal.SIGKILL)
            flooder.wait()
            await hub.close()

    asyncio.run(main())


@pytest.mark.parametrize("transport", ["unix", "tcp"])
def test_a_rank_that_connected_just_before_a_burst_of_idle_connections_is_admitted(tmp_path: Path,
                                                                                   transport: str) -> None:
    """The worst order: the rank's connection, then 70 idle ones, all waiting in the listen queue
    while the hub's loop is busy; then accepted in one go. The oldest-goes rule closed the rank's."""

    async def main() -> None:
        if transport == "unix":
            hub, sink, addr = await start(tmp_path)
            where: object = protocol.parse_addr(addr)[1]
            family = socket.AF_UNIX
        else:
            sink = Sink()
            hub = Hub("secret", sink, world_size=2)
            addr = await hub.start_tcp("127.0.0.1", 0)
            where, family = ("127.0.0.1", int(addr.rsplit(":", 1)[1])), socket.AF_INET
        socks: list[socket.socket] = []
        flooders: list[subprocess.Popen[str]] = []

        def connect_all() -> None:
            rank = socket.socket(family)
            rank.connect(where)
            rank.sendall(protocol.encode(hello(0)))
            socks.append(rank)
            if transport == "unix":  # another process, as a flood is: 70 idle connections
                flooders.append(flood(str(where), 70))
                assert flooders[0].stdout is not None
                flooders[0].stdout.readline()  # "flooding": all 70 connected
                return
            for _ in range(70):  # TCP: no pid to tell them apart; from here
                s = socket.socket(family)
                s.settimeout(0.5)
                with contextlib.suppress(OSError):
                    s.connect(where)
                socks.append(s)

        helper = threading.Thread(target=connect_all)
        helper.start()
        helper.join(30)  # the hub's loop busy meanwhile (on purpose): all wait in the listen queue
        try:
            await until(lambda: hub.connected_ranks == [0], timeout=10)
        finally:
            for s in socks:
                s.close()
            for f in flooders:
                os.killpg(f.pid, signal.SIGKILL)
                f.wait()
            await hub.close()

    asyncio.run(main())


@pytest.mark.e2e
def test_a_same_user_flood_of_2000_reconnecting_connections_leaves_no_rank_unmonitored(tmp_path: Path) -> None:
    proc = subprocess.Popen([sys.executable, "-m", "ddptop", "--headless", "--json", "--runs-dir", str(tmp_path / "runs"),
                             "--nproc", "2", "--", sys.executable, str(SCRIPTS / "plain_ddp.py"), "--steps", "40"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    flooder = None
    try:
        def torchrun() -> psutil.Process | None:
            kids = [c for c in psutil.Process(proc.pid).children() if "torch.distributed.run" in " ".join(c.cmdline())]
            return kids[0] if kids else None

        runner = poll(torchrun, 30, every=0.05, alive=lambda: proc.poll() is None)
        assert runner is not None, "torchrun did not start"
        addr = poll(lambda: runner.environ().get(ENV_ADDR), 10, every=0.05)
        flooder = flood(protocol.parse_addr(addr)[1], 2000)  # before the ranks, which import torch first
        out, err = proc.communicate(timeout=180)
    finally:
        if flooder is not None:
            os.killpg(flooder.pid, signal.SIGKILL)
            flooder.wait()
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    summary = json.loads(out.strip().splitlines()[-1])
    assert summary["status"] == "completed", err[-3000:]
    assert "not monitored" not in (summary.get("error") or ""), summary.get("error")
    assert summary["refused_connections"] > 100  # the flood was on while the ranks connected
    assert [r["rank"] for r in summary["ranks"]] == [0, 1]
    assert all(r["steps"] >= 40 for r in summary["ranks"]), summary["ranks"]


def test_a_hello_in_the_name_of_a_rank_that_has_ended_is_refused() -> None:
    state = RunState("r", RunConfig(), world_size=2)
    procs = type("Procs", (), {"admit": staticmethod(lambda h: None)})()
    collector = Collector(state, procs)  # type: ignore[arg-type]
    now = time.time()
    for rank in (0, 1):
        assert collector.hub_admit(hello(rank)) is None
        collector.hub_message(hello(rank), now)
        collector.hub_message(protocol.Bye(rank=rank, reason="completed"), now)
    why = collector.hub_admit(hello(1))
    assert why == "a hello for rank 1, which has ended (done)"
    state.ranks[0].status = state.ranks[0].status.__class__("lost")  # a dropped connection may come back
    assert collector.hub_admit(hello(0)) is None
