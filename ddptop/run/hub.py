"""The hub: an asyncio server the ranks' probes connect to (Unix socket, or TCP
for multi-node), authenticated with the run token.

It decodes frames and hands messages to a sink; it owns no state and no UI.
A bad frame is counted and dropped; a peer without the token is refused.
"""

from __future__ import annotations

import asyncio
import hmac
import os
import resource
import socket
import struct
import time
from typing import Protocol

from ddptop.wire import protocol

HELLO_TIMEOUT_S = 10.0  # a connection that has not said hello by then is closed
# Connections still waiting for their hello: beyond this many, or beyond the ranks of the world
# not yet admitted if more, the oldest goes. A start-up (1,024 ranks connecting in the same
# second) never exceeds it: each missing rank has at most one connection in flight (a rank that
# lost its connection is missing again). A flood does, and loses its oldest idle connections
# first, never a rank that says hello at once; once every rank is in, the bound is this again.
MAX_UNAUTHENTICATED = 64
# Of those, from one process (Unix socket: the kernel's SO_PEERCRED pid): a rank has one
# connection in flight; a flood of one process's reconnecting connections closes its own oldest.
MAX_WAITING_PER_PID = 4
UNIX_BACKLOG = 4096
READ_FIRST_S = 0.005  # over the bound: what has arrived is read before the idlest goes
READ_CHUNK = 1 << 16
ACCEPT_ERRORS_EVERY_S = 60.0  # out of file descriptors for long: the count, at most this often


class HubSink(Protocol):
    def hub_message(self, msg: protocol.Message, now: float) -> None: ...
    def hub_dropped(self, reason: str) -> None: ...
    def hub_refused(self, reason: str) -> None: ...
    def hub_disconnected(self, rank: int) -> None: ...
    def hub_admit(self, hello: protocol.Hello) -> str | None: ...  # why not, or None to admit


class Hub:
    """`world_size`: the ranks torchrun was asked for; a hello outside it is refused."""

    def __init__(self, token: str, sink: HubSink, world_size: int | None = None) -> None:
        self._token = token
        self._sink = sink
        self.world_size = world_size
        # connections still waiting for their hello, oldest first, with their reader and peer pid:
        # a flood of idle connections evicts its own, never a rank whose hello has come
        self._waiting: dict[asyncio.StreamWriter, tuple[asyncio.StreamReader, int | None]] = {}
        self._server: asyncio.AbstractServer | None = None
        self._writers: dict[int, asyncio.StreamWriter] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._sticky: list[protocol.Command] = []  # replayed to ranks that connect later
        self.address = ""
        self.accept_errors = 0  # accept() failures (out of file descriptors), all told
        self._accept_errors_said = 0  # ...up to the last "accepting again" line

    async def start_unix(self, path: str) -> str:
        """Listen on `path`; its directory must already be private (0700)."""
        self._quiet_accept_errors()
        # a long listen queue: a flood that fills a short one keeps a rank's connect waiting in
        # the kernel, before the hub can tell it from the flood (the kernel caps it at somaxconn)
        self._server = await asyncio.start_unix_server(self._serve, path=path, backlog=UNIX_BACKLOG)
        os.chmod(path, 0o600)
        self.address = f"unix:{path}"
        return self.address

    async def start_tcp(self, host: str, port: int = 0) -> str:
        self._quiet_accept_errors()
        raise_fd_limit(2 * self.waiting_bound + 256)
        # a listen queue for the whole world at once: past it, SYNs are dropped and a rank's
        # connect waits a second for the retransmit (the kernel caps it at somaxconn)
        self._server = await asyncio.start_server(self._serve, host=host, port=port, backlog=self.waiting_bound)
        sock = self._server.sockets[0]
        bound_port = sock.getsockname()[1]
        self.address = f"tcp:{host}:{bound_port}"
        return self.address

    def _quiet_accept_errors(self) -> None:
        """Out of file descriptors (EMFILE) while accepting: asyncio retries every second and
        logs a traceback each time (up to a hundred: one per connection waiting); say it once,
        then count: the first connection accepted again says how many accepts failed, and
        while none is, a line a minute says the count so far."""
        loop = asyncio.get_running_loop()
        previous = loop.get_exception_handler()
        said_at = [0.0]

        def handler(loop: asyncio.AbstractEventLoop, context: dict) -> None:
            if "accept" in str(context.get("message", "")):
                self.accept_errors += 1
                now = time.monotonic()
                if self.accept_errors == 1 or now - said_at[0] >= ACCEPT_ERRORS_EVERY_S:
                    said_at[0] = now
                    self._sink.hub_refused(f"cannot accept connections ({context.get('exception')}); "
                                           f"{self.accept_errors} time(s)")
                return
            if previous is not None:
                previous(loop, context)
            else:
                loop.default_exception_handler(context)

        loop.set_exception_handler(handler)

    @property
    def waiting_bound(self) -> int:
        """How many connections may wait for their hello now (see MAX_UNAUTHENTICATED)."""
        missing = self.world_size - len(self._writers) if self.world_size is not None else 0
        return max(MAX_UNAUTHENTICATED, missing)

    @property
    def connected_ranks(self) -> list[int]:
        return sorted(self._writers)

    async def drained(self, timeout: float) -> None:
        """Until every connection has been read to its end (a rank's process gone, its last
        frames in: its task ends there), at most `timeout` seconds (a rank's child holding its
        socket, another node's ranks still running)."""
        if self._tasks:
            await asyncio.wait(set(self._tasks), timeout=timeout)

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
        if self.accept_errors > self._accept_errors_said:
            self._accept_errors_said = self.accept_errors
            self._sink.hub_refused(f"accepting connections again ({self.accept_errors} accept(s) failed "
                                   "so far, out of file descriptors)")
        creds = peer_credentials(writer)
        pid = creds[0] if creds is not None else None
        if pid is not None and sum(1 for _, p in self._waiting.values() if p == pid) >= MAX_WAITING_PER_PID:
            # one process's flood cycles its own connections, never another's
            self._close_idlest(self._idlest(pid), f" from pid {pid}")
        self._waiting[writer] = (reader, pid)
        try:
            if len(self._waiting) > self.waiting_bound:
                # Connections accepted in one batch have had nothing read yet: first let what
                # has arrived be read (a rank's hello), then close the oldest that sent nothing.
                await asyncio.sleep(READ_FIRST_S)
                while len(self._waiting) > self.waiting_bound:
                    self._close_idlest(self._idlest(), "")
            rank = await self._authenticate(reader, writer)
            self._waiting.pop(writer, None)
            if rank is None:
                return
            await self._read_frames(reader, rank)
        except (ConnectionError, OSError, asyncio.CancelledError):
            pass  # a peer gone, or the hub closing: either way this connection is over
        finally:
            self._waiting.pop(writer, None)
            if rank is not None and self._writers.get(rank) is writer:
                del self._writers[rank]
                self._sink.hub_disconnected(rank)
            writer.close()
            if task is not None:
                self._tasks.discard(task)

    def _close_idlest(self, victim: asyncio.StreamWriter, whose: str) -> None:
        self._waiting.pop(victim, None)
        victim.close()
        self._sink.hub_refused(f"too many connections without a hello{whose}: closed the oldest idle one")

    def _idlest(self, pid: int = 0) -> asyncio.StreamWriter:
        """The connection to close for room (of process `pid`, 0: any): the oldest that has not
        sent a whole line (a rank whose hello has arrived is kept, however many connections
        came since); the oldest of them all when every one has."""
        among = [(w, r) for w, (r, p) in self._waiting.items() if not pid or p == pid]
        for writer, reader in among:
            if b"\n" not in getattr(reader, "_buffer", b""):  # what it sent, not read by us yet
                return writer
        return among[0][0]

    async def _authenticate(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> int | None:
        try:
            line: bytes | None = await asyncio.wait_for(reader.readline(), HELLO_TIMEOUT_S)
        except (asyncio.TimeoutError, ValueError, asyncio.LimitOverrunError):
            line = None
        if writer not in self._waiting:
            return None  # closed to make room for newer ones: refused, and counted, then
        if line is None:
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
        world = self.world_size
        if world is not None and (msg.rank >= world or msg.world_size > world):
            self._sink.hub_refused(f"rank {msg.rank} of world {msg.world_size}: this run has {world} rank(s)")
            return None
        if msg.rank in self._writers:
            self._sink.hub_refused(f"a second hello for rank {msg.rank}, which is connected: refused")
            return None
        why = self._sink.hub_admit(msg)
        if why:
            self._sink.hub_refused(why)
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


def raise_fd_limit(need: int) -> None:
    """One socket per rank: 1,024 ranks do not fit the usual soft limit of 1,024 descriptors.
    Raise the soft limit toward `need`, within the hard limit (never lower it)."""
    try:
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        target = need if hard == resource.RLIM_INFINITY else min(need, hard)
        if soft != resource.RLIM_INFINITY and soft < target:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    except (ValueError, OSError):
        pass  # as it was: accept() errors are counted and said (see _quiet_accept_errors)


def peer_credentials(writer: asyncio.StreamWriter) -> tuple[int, int, int] | None:
    """(pid, uid, gid) of the process at the other end of a Unix socket, as the kernel
    tells it (SO_PEERCRED: what that process cannot forge); None where the transport
    does not say."""
    extra = getattr(writer, "get_extra_info", None)
    sock = extra("socket") if extra is not None else None
    option = getattr(socket, "SO_PEERCRED", None)
    if sock is None or option is None or sock.family != socket.AF_UNIX:
        return None
    try:
        pid, uid, gid = struct.unpack("3i", sock.getsockopt(socket.SOL_SOCKET, option, struct.calcsize("3i")))
    except (OSError, struct.error):
        return None
    return pid, uid, gid
