"""The hub: an asyncio server the ranks' probes connect to (Unix socket, or TCP
for multi-node), authenticated with the run token.

It decodes frames and hands messages to a sink; it owns no state and no UI.
A bad frame is counted and dropped; a peer without the token is refused.
"""

from __future__ import annotations

import asyncio
import hmac
import os
import time
from typing import Protocol

from ddptop import protocol

HELLO_TIMEOUT_S = 30.0
READ_CHUNK = 1 << 16


class HubSink(Protocol):
    def hub_message(self, msg: protocol.Message, now: float) -> None: ...
    def hub_dropped(self, reason: str) -> None: ...
    def hub_refused(self, reason: str) -> None: ...
    def hub_disconnected(self, rank: int) -> None: ...


class Hub:
    def __init__(self, token: str, sink: HubSink) -> None:
        self._token = token
        self._sink = sink
        self._server: asyncio.AbstractServer | None = None
        self._writers: dict[int, asyncio.StreamWriter] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._sticky: list[protocol.Command] = []  # replayed to ranks that connect later
        self.address = ""

    async def start_unix(self, path: str) -> str:
        """Listen on `path`; its directory must already be private (0700)."""
        self._server = await asyncio.start_unix_server(self._serve, path=path)
        os.chmod(path, 0o600)
        self.address = f"unix:{path}"
        return self.address

    async def start_tcp(self, host: str, port: int = 0) -> str:
        self._server = await asyncio.start_server(self._serve, host=host, port=port)
        sock = self._server.sockets[0]
        bound_port = sock.getsockname()[1]
        self.address = f"tcp:{host}:{bound_port}"
        return self.address

    @property
    def connected_ranks(self) -> list[int]:
        return sorted(self._writers)

    async def broadcast(self, command: protocol.Command) -> int:
        """Send a command to every authenticated rank, and to any that connects
        later; returns how many got it now."""
        self._sticky.append(command)
        data = protocol.encode(command)
        sent = 0
        for writer in list(self._writers.values()):
            try:
                writer.write(data)
                await writer.drain()
                sent += 1
            except (ConnectionError, OSError):
                pass
        return sent

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for writer in list(self._writers.values()):
            writer.close()
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        self._writers.clear()

    # --- one connection ---------------------------------------------------------------
    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        if task is not None:
            self._tasks.add(task)
        rank: int | None = None
        try:
            rank = await self._authenticate(reader, writer)
            if rank is None:
                return
            await self._read_frames(reader, rank)
        except (ConnectionError, OSError, asyncio.CancelledError):
            pass  # a peer gone, or the hub closing: either way this connection is over
        finally:
            if rank is not None and self._writers.get(rank) is writer:
                del self._writers[rank]
                self._sink.hub_disconnected(rank)
            writer.close()
            if task is not None:
                self._tasks.discard(task)

    async def _authenticate(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> int | None:
        try:
            line = await asyncio.wait_for(reader.readline(), HELLO_TIMEOUT_S)
        except (asyncio.TimeoutError, ValueError, asyncio.LimitOverrunError):
            self._sink.hub_refused("no hello")
            return None
        try:
            msg = protocol.decode(line)
        except protocol.ProtocolError as exc:
            self._sink.hub_refused(f"bad first frame ({exc.reason})")
            return None
        if not isinstance(msg, protocol.Hello):
            self._sink.hub_refused("first frame is not a hello")
            return None
        if not hmac.compare_digest(msg.token.encode(), self._token.encode()):
            self._sink.hub_refused(f"wrong token from rank {msg.rank} pid {msg.pid}")
            return None
        self._writers[msg.rank] = writer
        self._sink.hub_message(msg, time.time())
        for command in self._sticky:
            writer.write(protocol.encode(command))
        return msg.rank

    async def _read_frames(self, reader: asyncio.StreamReader, rank: int) -> None:
        buf = b""
        discarding = False  # inside an oversized frame: skip to its newline
        while True:
            chunk = await reader.read(READ_CHUNK)
            if not chunk:
                return
            buf += chunk
            while True:
                end = buf.find(b"\n")
                if end < 0:
                    break
                line, buf = buf[:end], buf[end + 1 :]
                if discarding:
                    discarding = False
                    continue
                if line.strip():
                    self._frame(line, rank)
            if len(buf) > protocol.MAX_FRAME:
                if not discarding:
                    self._sink.hub_dropped("oversized")
                discarding = True
                buf = b""

    def _frame(self, line: bytes, rank: int) -> None:
        try:
            msg = protocol.decode(line)
        except protocol.ProtocolError as exc:
            self._sink.hub_dropped(exc.reason)
            return
        if not isinstance(msg, (protocol.Steps, protocol.Bye, protocol.Info, protocol.CaptureReport)):
            self._sink.hub_dropped(f"unexpected-{msg.kind}")
        elif msg.rank != rank:
            self._sink.hub_dropped("rank-mismatch")
        else:
            self._sink.hub_message(msg, time.time())
