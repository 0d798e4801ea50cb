"""RemoteSession: the viewer side of a supervised run. A `ddptop.run.handle.DetachableRun`:
what the TUI and the Workbench use on an in-process Session (`state`, `run()`,
`request_stop()`, `request_capture()`), plus `owner`, `detached` and `detach()`, but the
run lives in a supervisor process reached through the live directory's socket. No UI, no torch.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import subprocess
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import psutil

from ddptop.analysis.capture import Capture
from ddptop.model.config import RunConfig
from ddptop.model.options import CaptureOptions
from ddptop.model.run_ids import new_run_id
from ddptop.model.state import RunState
from ddptop.remote.live import (
    LiveRun,
    ensure_live_dir,
    poll_ready,
    socket_inside,
    start_supervisor,
    supervisor_alive,
    supervisor_spec,
)
from ddptop.viewer_wire import viewer_protocol as vp

if TYPE_CHECKING:
    from ddptop.run.workbench import SessionFactory

START_TIMEOUT_S = 30.0  # a supervisor takes viewers well within a second; allow a loaded box
REPLY_TIMEOUT_S = 30.0
NOT_ANSWERING_S = 2.0  # no welcome by then: the views say the supervisor is not answering
EXIT_WAIT_S = 15.0  # after the final state: the supervisor removes its entry and exits


class ViewerError(RuntimeError):
    """The supervisor could not be started or reached, or refused this viewer."""


class RemoteSession:
    """One run held by a supervisor. Either `spawn()`ed (this viewer starts the
    supervisor in `run()`, and owns the run unless it is detached) or `attach()`ed
    to a live run from the registry."""

    def __init__(self, config: RunConfig, runs_dir: Path, run_id: str, live: Path,
                 user_cmd: list[str] | None = None, entry: LiveRun | None = None,
                 detached: bool = False, owner: bool = False, capture: CaptureOptions | None = None) -> None:
        self.config = config
        self.capture = capture or CaptureOptions()  # what the supervisor's session captures (--capture)
        self.user_cmd = user_cmd
        self.run_id = run_id
        self.run_dir = Path(runs_dir) / run_id
        self.live = live
        self.entry = entry  # known once the supervisor listens
        self.owner = owner  # this viewer's connection decides the run's life (until detached)
        self._detached = detached
        self.state = RunState(run_id=run_id, config=config.script_view() if user_cmd else config,
                              world_size=config.world_size, warmup=config.warmup)
        self.proc: subprocess.Popen[bytes] | None = None  # the supervisor, when we started it
        self._writer: asyncio.StreamWriter | None = None
        self._stop_reason = ""  # asked before the connection was up: sent on connect
        self._replies: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self._ids = itertools.count(1)
        self._restarting = False  # granted the run's restart: it is stopping
        self._final = False
        self._done = False

    @classmethod
    def spawn(cls, config: RunConfig, runs_dir: Path, user_cmd: list[str] | None = None,
              detached: bool = False, live: Path | None = None,
              capture: CaptureOptions | None = None) -> RemoteSession:
        """A run this viewer will start (in `run()`) and own, unless `detached`."""
        live = ensure_live_dir(live)
        return cls(config, runs_dir, new_run_id(config.preset), live, user_cmd,
                   detached=detached, owner=not detached, capture=capture)

    @classmethod
    def attach(cls, entry: LiveRun, live: Path | None = None) -> RemoteSession:
        """A viewer of the live run `entry` (from `ddptop.remote.live.find_run`)."""
        live = ensure_live_dir(live)
        config = RunConfig.from_dict(entry.config)
        session = cls(config, Path(entry.runs_dir), entry.run_id, live, entry.user_cmd, entry=entry,
                      detached=entry.detached)
        session.run_dir = Path(entry.run_dir)
        return session

    # --- what the Workbench and the TUI read ------------------------------------------
    @property
    def done(self) -> bool:
        return self._done

    @property
    def detached(self) -> bool:
        return self._detached

    @property
    def pid(self) -> int | None:
        """The supervisor's pid (None until it is known)."""
        if self.entry is not None:
            return self.entry.pid
        return self.proc.pid if self.proc is not None else None

    def processes(self) -> list[psutil.Process]:
        """The supervisor and everything under it (torchrun, ranks, workers)."""
        try:
            root = psutil.Process(self.pid) if self.pid else None
            return [root, *root.children(recursive=True)] if root else []
        except psutil.Error:
            return []

    # --- lifecycle --------------------------------------------------------------------
    async def run(self) -> RunState:
        """Start (or find) the supervisor, follow its snapshots until the run ends, and
        return the final state. Cancelling it closes the connection: an owned run then
        stops cleanly, a detached one goes on."""
        try:
            try:
                if self.entry is None:
                    await self._start()
                await self._connect()
                await self._follow()
            except ViewerError as exc:  # the run never got going, or cannot be read: say so where views look
                self.state.finish("failed", time.time(), error=str(exc))
                raise
            if not self._final:
                self._lost()
            await self._wait_exit()
            return self.state
        finally:
            self._close()
            self._done = True

    async def _start(self) -> None:
        spec = supervisor_spec(self.config, self.run_dir.parent, self.run_id, self.live, self._detached,
                               self.user_cmd, self.capture)
        self.proc = start_supervisor(spec, self.live)
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            got = poll_ready(self.proc, self.live, self.run_id)
            if isinstance(got, LiveRun):
                self.entry = got
                return
            if isinstance(got, str):
                raise ViewerError(got)
            if time.monotonic() > deadline:
                self.proc.kill()
                raise ViewerError(f"the supervisor did not start within {START_TIMEOUT_S:.0f}s")
            await asyncio.sleep(0.05)

    async def _connect(self) -> None:
        assert self.entry is not None
        ensure_live_dir(self.live)  # only our own private directory's socket is trusted
        if not socket_inside(self.live, self.entry.socket):
            raise ViewerError(f"run {self.run_id}'s socket {self.entry.socket!r} is not in the live directory "
                              f"{self.live}: not trusted")
        try:
            reader, writer = await asyncio.open_unix_connection(self.entry.socket, limit=vp.MAX_LINE)
        except OSError as exc:
            raise ViewerError(f"cannot reach run {self.run_id} ({exc.strerror or exc})") from None
        writer.write(vp.encode("hello", token=self.entry.token, owner=self.owner))
        try:
            line = await self._welcome_line(reader)
            header = vp.decode(line) if line else {"kind": "refused", "reason": "it closed the connection"}
            if header["kind"] == "refused":
                raise ViewerError(f"run {self.run_id} refused this viewer: {str(header.get('reason'))[:300]}")
            if header["kind"] != "welcome":
                raise ViewerError(f"run {self.run_id} answered the hello with {header['kind'][:40]!r}")
            if vp.mismatch(header):
                raise ViewerError(f"cannot follow run {self.run_id}: its {vp.mismatch(header)}")
        except (asyncio.TimeoutError, ConnectionError, OSError, ValueError) as exc:
            # ValueError: a line over the limit, or vp.ViewerProtocolError
            writer.close()
            reason = getattr(exc, "reason", "") or type(exc).__name__
            raise ViewerError(f"run {self.run_id} did not welcome this viewer ({reason})") from None
        except ViewerError:
            writer.close()
            raise
        self.owner = bool(header.get("owner"))
        self._detached = bool(header.get("detached"))
        self._reader, self._writer = reader, writer
        if self._stop_reason:
            self._send("stop", reason=self._stop_reason)

    async def _welcome_line(self, reader: asyncio.StreamReader) -> bytes:
        """The supervisor's answer to the hello. A stopped or stuck supervisor still accepts
        connections (the kernel does): until it answers, the views say so, not 'waiting for ranks'."""
        read = asyncio.ensure_future(reader.readline())
        try:
            return await asyncio.wait_for(asyncio.shield(read), NOT_ANSWERING_S)
        except asyncio.TimeoutError:
            self.state.error = f"the supervisor (pid {self.pid}) is not answering"
        line = await asyncio.wait_for(read, REPLY_TIMEOUT_S - NOT_ANSWERING_S)
        self.state.error = ""
        return line

    async def _follow(self) -> None:
        reader = self._reader
        while not self._final:
            try:
                line = await reader.readline()
            except (ConnectionError, OSError, ValueError):
                return
            if not line:
                return  # the supervisor is gone
            try:
                header = vp.decode(line)
                size = header.get("size") or 0
                if type(size) is not int or not 0 <= size <= vp.MAX_PAYLOAD:
                    raise vp.ViewerProtocolError(f"bad payload size {str(size)[:20]}")
                try:
                    payload = await reader.readexactly(size) if size else b""
                except (asyncio.IncompleteReadError, ConnectionError, OSError):
                    return
                if header["kind"] == "state":
                    self._apply(vp.load_state(payload, base=self.state))
                    self._final = bool(header.get("final"))
                    continue
            except vp.ViewerProtocolError as exc:
                raise ViewerError(f"cannot follow run {self.run_id}: {exc.reason}") from None
            kind = header["kind"]
            if kind in ("captured", "detached", "restarting"):
                key = header.get("id") if kind != "detached" else -1  # one detach at a time
                future = self._replies.pop(key, None) if isinstance(key, int) else None
                if future is not None and not future.done():
                    future.set_result({**header, "payload": payload})

    def _apply(self, state: RunState) -> None:
        # In place, so anyone holding `session.state` (views, tests, scripts) sees the
        # new picture, as with an in-process Session.
        self.state.__dict__.update(state.__dict__)

    def _lost(self) -> None:
        """The supervisor went away without a final state (killed): say so."""
        if not self.state.finished:
            self.state.finish("failed", time.time(), error="the supervisor exited without a final "
                                                          f"state (see {self.run_dir}/supervisor.log)")

    async def _wait_exit(self) -> None:
        """The final state comes just before the supervisor exits: wait for it to be gone
        (reaping it when it is our child), so 'ended' means no process is left."""
        deadline = time.monotonic() + EXIT_WAIT_S
        while time.monotonic() < deadline:
            if self.proc is not None:
                if self.proc.poll() is not None:
                    return
            elif self.pid is None or not supervisor_alive(self.pid):
                return
            await asyncio.sleep(0.1)

    def _close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None
        for future in self._replies.values():
            if not future.done():
                future.set_exception(ViewerError("disconnected from the run"))
        self._replies.clear()

    def _send(self, kind: str, **fields: Any) -> None:
        if self._writer is None or self._writer.is_closing():
            raise ViewerError(f"not connected to run {self.run_id}")
        self._writer.write(vp.encode(kind, **fields))

    async def _ask(self, key: int, kind: str, **fields: Any) -> dict[str, Any]:
        future: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._replies[key] = future
        self._send(kind, **fields)
        try:
            return await asyncio.wait_for(future, REPLY_TIMEOUT_S)
        finally:
            self._replies.pop(key, None)

    # --- intents ----------------------------------------------------------------------
    def request_stop(self, reason: str = "stopped by user") -> None:
        """Ask the supervisor to stop the run at an agreed step; returns at once."""
        if self._restarting:
            return  # granted a restart, which stops the run: the supervisor said so in its log
        self._stop_reason = self._stop_reason or reason
        if self._writer is not None:
            with contextlib.suppress(ViewerError, ConnectionError, OSError):
                self._send("stop", reason=reason)

    async def claim_restart(self, reason: str) -> str:
        """Ask the supervisor for the run's one restart (see ddptop.run.handle.SharedRun):
        '' when granted, and then the run is stopping; else why not."""
        ident = next(self._ids)
        reply = await self._ask(ident, "restart", reason=reason, id=ident)
        error = str(reply.get("error") or "")
        self._restarting = not error
        return error

    async def request_capture(self, count: int = 3) -> Capture:
        """Profile the next `count` steps on every rank (the supervisor picks the step)."""
        ident = next(self._ids)
        reply = await self._ask(ident, "capture", count=count, id=ident)
        if reply.get("error"):
            raise ViewerError(f"capture refused: {reply['error']}")
        try:
            cap = vp.load_capture(reply["payload"])
        except vp.ViewerProtocolError as exc:
            raise ViewerError(f"capture unreadable: {exc.reason}") from None
        self.state.captures.setdefault(cap.capture_id, cap)  # before the next snapshot brings it
        return cap

    def viewer_failed(self, reason: str) -> None:
        """This viewer is ending through a fault of its own (not a quit): the supervisor keeps
        an owned run going, detached, instead of stopping it as it does when the owner's
        connection just drops. Sent without waiting: the app is already going down."""
        if self.owner and not self._detached and self._writer is not None:
            with contextlib.suppress(ViewerError, ConnectionError, OSError):
                self._send("crashed", reason=reason[:300])
                self._detached = True

    async def detach(self) -> None:
        """The run no longer belongs to this viewer's terminal: it survives the viewer."""
        await self._ask(-1, "detach")
        self._detached = True


def supervised(detached: bool = False, capture: CaptureOptions | None = None) -> SessionFactory:
    """A Workbench's factory that runs each run in a supervisor process of its own (owned by
    the front end unless `detached`)."""
    def factory(config: RunConfig, runs_dir: Path, user_cmd: list[str] | None) -> RemoteSession:
        return RemoteSession.spawn(config, runs_dir, user_cmd, detached=detached, capture=capture)

    return factory
