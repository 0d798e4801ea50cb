"""The supervisor: one Session (launcher, hub, state, recorder) run headless in a
process of its own, plus a viewer server on a private Unix socket and a registry
entry, so that a run can outlive the terminal that started it. No UI, no torch.

    python -m ddptop.remote.supervisor SPEC_JSON      (started by ddptop; see live.start_supervisor)

Ownership: a run started from a TUI belongs to that TUI (its owner viewer); when
the owner's connection drops without a `detach`, the run is stopped cleanly at an
agreed step. A detached run never stops because a viewer goes away.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import os
import re
import secrets
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ddptop.model.config import RunConfig
from ddptop.model.options import CaptureOptions
from ddptop.remote.live import LiveRun, ensure_live_dir, new_socket_path, remove_entry, write_entry
from ddptop.run.hub import peer_credentials
from ddptop.run.session import Session
from ddptop.run.signals import on_signals
from ddptop.viewer_wire import state_codec
from ddptop.viewer_wire import viewer_protocol as vp

SNAPSHOT_S = 0.5  # state to every viewer, about twice a second...
SNAPSHOT_SHARE = 0.25  # ...or less often, so snapshots take at most this share of our time
REGISTRY_S = 1.0  # status in the registry entry, for `ddptop ls`
HELLO_TIMEOUT_S = 10.0
OWNER_WAIT_S = 30.0  # an owned run whose owner never connects (it died while starting) stops
MAX_BUFFERED = 64 << 20  # a viewer this far behind skips snapshots until it catches up
FINAL_DRAIN_S = 5.0
EXIT_CODES = {"completed": 0, "failed": 1, "stopped": 130}


VIEWER_KIND = re.compile(r"\bfrom an? ([a-z]{1,16}) viewer\b")  # the TUI's "<reason>, from a web viewer"


@dataclass(eq=False)  # hashed by identity: kept in a set
class _Viewer:
    writer: asyncio.StreamWriter
    owner: bool
    marks: state_codec.Marks | None = None  # what its last snapshot held (None: new, or missed one)
    kind: str = ""  # what the viewer says it is ("terminal", "web"), if it says
    creds: tuple[int, int, int] | None = None  # (pid, uid, gid) from the kernel

    def who(self, reason: str = "") -> str:
        """The viewer, for the run's log: its kind (as it says, in its hello or its reason),
        whether it owns the run, and the uid and pid the kernel gives for its connection."""
        match = VIEWER_KIND.search(reason)
        kind = self.kind or (match.group(1) if match else "")
        words = [f"a {kind} viewer" if kind else "a viewer"]
        if self.owner:
            words.append("the run's owner")
        if self.creds is not None:
            pid, uid, _ = self.creds
            words += [f"uid {uid}", f"pid {pid}"]
        else:
            words.append("uid unknown")
        return ", ".join(words)

    def send(self, data: bytes) -> bool:
        """Queue `data` unless this viewer is too far behind (it gets a later snapshot)."""
        transport = self.writer.transport
        if transport.is_closing() or transport.get_write_buffer_size() > MAX_BUFFERED:
            return False
        self.writer.write(data)
        return True


class Supervisor:
    def __init__(self, session: Session, live: Path, detached: bool, user_cmd: list[str] | None = None) -> None:
        self.session = session
        self.live = live
        self.detached = detached
        self.user_cmd = user_cmd
        self.token = secrets.token_hex(16)
        self.socket_path = new_socket_path(live)
        self.started_at = time.time()
        self.viewers: set[_Viewer] = set()
        self.refused = 0
        self._owner_seen = asyncio.Event()
        self._server: asyncio.AbstractServer | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._snapshot_s = 0.0  # how long the last snapshot took to build
        self._restart_by = ""  # who the run's one restart was granted to ('' : none yet)

    # --- registry ---------------------------------------------------------------------
    def entry(self) -> LiveRun:
        s = self.session
        state = s.state
        return LiveRun(
            run_id=s.run_id, pid=os.getpid(), socket=str(self.socket_path), token=self.token,
            run_dir=str(s.run_dir), runs_dir=str(s.run_dir.parent), preset=s.config.preset,
            world_size=state.world_size, detached=self.detached, started_at=self.started_at,
            status=state.status, step=state.current_step, steps_per_s=state.live_steps_per_s(),
            updated_at=time.time(), viewers=len(self.viewers), config=s.config.to_dict(),
            user_cmd=self.user_cmd,
        )

    def _write_entry(self) -> None:
        try:
            write_entry(self.live, self.entry())
        except OSError as exc:  # `ddptop ls` goes stale; the run itself is fine
            self.session.state.add_log(-1, f"[ddptop] registry entry not written: {exc}")

    # --- lifecycle --------------------------------------------------------------------
    async def run(self) -> int:
        stop = self.session.request_stop
        # No terminal is ours (own session), but a stray SIGHUP must not kill a detached run.
        with on_signals({signal.SIGTERM: lambda name: stop(f"signal {name}"),
                         signal.SIGINT: lambda name: stop(f"signal {name}"), signal.SIGHUP: lambda _: None}):
            return await self._serve_run()

    async def _serve_run(self) -> int:
        self._server = await asyncio.start_unix_server(self._serve, path=str(self.socket_path),
                                                       limit=vp.MAX_LINE)
        os.chmod(self.socket_path, 0o600)
        runner = asyncio.create_task(self.session.run())
        self._write_entry()  # from here on viewers can come: the spawner waits for this file
        loops = [asyncio.create_task(self._log_to_run_dir(runner)),
                 asyncio.create_task(self._publish_loop())]
        if not self.detached:
            loops.append(asyncio.create_task(self._owner_watchdog()))
        try:
            state = await runner
        finally:
            for task in loops:
                task.cancel()
            await self._close(final=True)
            remove_entry(self.live, self.session.run_id, str(self.socket_path))
        return EXIT_CODES.get(state.status, 1)

    async def _close(self, final: bool) -> None:
        if self._server is not None:
            self._server.close()
        if final and self.viewers:
            self._broadcast(final=True)
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(asyncio.gather(*(self._drain(v) for v in list(self.viewers))),
                                       FINAL_DRAIN_S)
        for viewer in list(self.viewers):
            viewer.writer.close()
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)

    @staticmethod
    async def _drain(viewer: _Viewer) -> None:
        with contextlib.suppress(ConnectionError, OSError):
            await viewer.writer.drain()

    async def _publish_loop(self) -> None:
        registry_at = 0.0
        while True:
            # At 64 ranks a snapshot costs ~10 ms to build (a first one ~100): send fewer, not stall the hub.
            await asyncio.sleep(max(SNAPSHOT_S, self._snapshot_s / SNAPSHOT_SHARE))
            if self.viewers:
                self._broadcast(final=False)
            if time.monotonic() - registry_at >= REGISTRY_S:
                registry_at = time.monotonic()
                self._write_entry()

    def _broadcast(self, final: bool) -> None:
        """One snapshot for every viewer (none at all without viewers). Logs are most of a
        snapshot's bytes (2000 lines per rank) and step records most of its numbers, and few
        change between two ticks: a viewer gets only what changed since its last snapshot
        (state_codec.state_to_dict); one that missed a snapshot gets everything."""
        t0 = time.perf_counter()
        now = state_codec.marks(self.session.state)
        frames: dict[state_codec.Marks | None, bytes] = {}  # viewers in step share one
        for viewer in list(self.viewers):
            since = None if final else viewer.marks
            if since not in frames:
                frames[since] = self._frame(final, since)
            viewer.marks = now if viewer.send(frames[since]) else None
        self._snapshot_s = time.perf_counter() - t0

    def _frame(self, final: bool, since: state_codec.Marks | None = None) -> bytes:
        return vp.frame("state", vp.dump_state(self.session.state, since), final=final)

    async def _owner_watchdog(self) -> None:
        try:
            await asyncio.wait_for(self._owner_seen.wait(), OWNER_WAIT_S)
        except asyncio.TimeoutError:
            if not self.detached:
                self.session.request_stop("its owner never connected")

    async def _log_to_run_dir(self, runner: asyncio.Task[Any]) -> None:
        """Move our output from the live directory into the run directory once it exists,
        so the record of a run is complete in one place."""
        early = self.live / f"{self.session.run_id}.log"
        while self.session.recorder is None and not runner.done():
            await asyncio.sleep(0.05)
        if self.session.recorder is None:
            return  # the run could not start; the early log stays for whoever started us
        target = self.session.run_dir / "supervisor.log"
        try:
            with open(target, "ab") as out:
                with contextlib.suppress(OSError):
                    out.write(early.read_bytes())
                sys.stdout.flush()
                sys.stderr.flush()
                os.dup2(out.fileno(), 1)
                os.dup2(out.fileno(), 2)
            early.unlink(missing_ok=True)
        except OSError as exc:
            self.session.state.add_log(-1, f"[ddptop] supervisor log stays in {early}: {exc}")

    # --- one viewer -------------------------------------------------------------------
    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        if task is not None:
            self._tasks.add(task)
        viewer: _Viewer | None = None
        try:
            viewer = await self._welcome(reader, writer)
            if viewer is None:
                return
            while True:
                line = await reader.readline()
                if not line:
                    return
                try:
                    msg = vp.decode(line)
                except vp.ViewerProtocolError as exc:
                    self.session.state.drop(f"viewer-{exc.reason}")
                    continue
                await self._command(viewer, msg)
        except (ConnectionError, OSError, ValueError, asyncio.LimitOverrunError, asyncio.CancelledError):
            pass  # a viewer gone or misbehaving, or the supervisor closing
        finally:
            if viewer is not None:
                self.viewers.discard(viewer)
                self._write_entry()
                if viewer.owner and not self.detached and not self.session.done:
                    # not a crash (a crashing viewer says so first): its terminal or process is gone
                    self._audit(viewer, "stop", "its owner viewer disconnected")
                    self.session.request_stop("its owner viewer disconnected")
            writer.close()
            if task is not None:
                self._tasks.discard(task)

    async def _welcome(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> _Viewer | None:
        reason = ""
        msg: dict[str, Any] = {}
        try:
            msg = vp.decode(await asyncio.wait_for(reader.readline(), HELLO_TIMEOUT_S))
        except asyncio.TimeoutError:
            reason = "no hello"
        except vp.ViewerProtocolError as exc:
            reason = f"bad hello ({exc.reason})"
        except ValueError:  # a first line longer than any hello (the stream's limit)
            reason = "bad hello (oversized)"
        if not reason and msg.get("kind") != "hello":
            reason = "first line is not a hello"
        elif not reason and vp.mismatch(msg):
            reason = vp.mismatch(msg)
        elif not reason and not hmac.compare_digest(str(msg.get("token", "")).encode(), self.token.encode()):
            reason = "wrong token"
        if reason:
            self.refused += 1
            self.session.state.refused += 1
            self.session.state.add_log(-1, f"[ddptop] refused a viewer: {reason}")
            print(f"ddptop supervisor {os.getpid()}: refused a viewer: {reason}", flush=True)
            with contextlib.suppress(ConnectionError, OSError):
                writer.write(vp.encode("refused", reason=reason))
                await writer.drain()
            return None
        # Only the first owner of a run that is still owned: any later claim is a plain viewer.
        owner = bool(msg.get("owner")) and not self.detached and not self._owner_seen.is_set()
        if owner:
            self._owner_seen.set()
        kind = msg.get("viewer")
        kind = kind if isinstance(kind, str) and re.fullmatch(r"[a-z]{1,16}", kind) else ""
        viewer = _Viewer(writer, owner, kind=kind, creds=peer_credentials(writer))
        writer.write(vp.encode("welcome", run_id=self.session.run_id, owner=owner,
                               detached=self.detached))
        # The history so far, at once: a viewer never waits a tick for its first picture.
        marks = state_codec.marks(self.session.state)
        viewer.marks = marks if viewer.send(self._frame(self.session.done)) else None
        self.viewers.add(viewer)
        self._write_entry()
        return viewer

    def _audit(self, viewer: _Viewer, what: str, reason: str = "") -> str:
        """Say in the run's log (its views, and supervisor.log in the run directory) who asked
        for `what`: a stop (a restart or a settings change stops this run first), a detach, a
        capture. Returns who."""
        who = viewer.who(reason)
        line = f"[ddptop] {what} asked by {who}" + (f": {reason}" if reason else "")
        self.session.state.add_log(-1, line)
        print(f"ddptop supervisor {os.getpid()}: {line.removeprefix('[ddptop] ')}", flush=True)
        return who

    async def _command(self, viewer: _Viewer, msg: dict[str, Any]) -> None:
        kind = msg["kind"]
        if kind == "stop":
            # "settings changed, from a web viewer" is a restart: this run stops, its viewer starts the next
            reason = str(msg.get("reason") or "stopped from a viewer")[:300]
            self._audit(viewer, "stop", reason)
            self.session.request_stop(reason)
        elif kind == "detach":
            if not self.detached:
                self._audit(viewer, "detach")
                self.detached = True
                self.session.state.add_log(-1, "[ddptop] detached: the run no longer belongs to a terminal")
                self._write_entry()
            viewer.send(vp.encode("detached"))
        elif kind == "crashed":
            # the owner's own fault, not a quit: the run it watched goes on (a plain drop stops it)
            if viewer.owner and not self.detached:
                reason = str(msg.get("reason") or "no reason given")[:300]
                self._audit(viewer, "detach", f"its owner viewer crashed ({reason}); the run goes on, "
                                              f"detached: ddptop attach {self.session.run_id}")
                self.detached = True
                self._write_entry()
        elif kind == "capture":
            self._audit(viewer, f"capture of {str(msg.get('count'))[:12]} step(s)")
            await self._capture(viewer, msg)
        elif kind == "restart":
            self._restart(viewer, msg)
        else:
            self.session.state.drop(f"viewer-unknown-{kind}"[:40])

    def _restart(self, viewer: _Viewer, msg: dict[str, Any]) -> None:
        """One restart per run: the first viewer to ask stops it and starts the next run; any
        other, while that is under way, is told so and starts nothing (two viewers applying
        settings at once would start two runs fighting for the same GPUs)."""
        reason = str(msg.get("reason") or "restarted from a viewer")[:300]
        if self._restart_by:
            error = f"a restart is already under way, from {self._restart_by}"
            self._audit(viewer, "restart (refused: one is under way)", reason)
        elif self.session.done:
            error = "the run has ended"
        else:
            error = ""
            self._restart_by = self._audit(viewer, "restart", reason)
            self.session.request_stop(reason)
        viewer.send(vp.encode("restarting", id=msg.get("id"), error=error))

    async def _capture(self, viewer: _Viewer, msg: dict[str, Any]) -> None:
        count = msg.get("count")
        if not isinstance(count, int) or not 1 <= count <= 1000:
            viewer.send(vp.frame("captured", id=msg.get("id"), error=f"bad step count {count!r}"))
            return
        if self.session.done:
            viewer.send(vp.frame("captured", id=msg.get("id"), error="the run has ended"))
            return
        cap = await self.session.request_capture(count)
        viewer.send(vp.frame("captured", vp.dump_capture(cap), id=msg.get("id"), error=""))


def session_from_spec(spec: dict[str, Any]) -> Session:
    capture = spec.get("capture") or {}
    return Session(
        RunConfig.from_dict(spec["config"]), Path(spec["runs_dir"]), user_cmd=spec.get("user_cmd"),
        run_id=spec["run_id"],
        capture=CaptureOptions(windows=[tuple(w) for w in capture.get("windows", [])],
                               profiler=capture.get("profiler", "torch"), nsys=capture.get("nsys")),
    )


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print("usage: python -m ddptop.remote.supervisor SPEC_JSON (started by ddptop, not by hand)", file=sys.stderr)
        return 2
    spec = json.loads(argv[0])
    live = ensure_live_dir(Path(spec["live_dir"]))
    session = session_from_spec(spec)
    supervisor = Supervisor(session, live, detached=bool(spec.get("detached")), user_cmd=spec.get("user_cmd"))
    print(f"ddptop supervisor {os.getpid()}: run {session.run_id}, viewers on {supervisor.socket_path}", flush=True)
    code = asyncio.run(supervisor.run())
    print(f"ddptop supervisor {os.getpid()}: run {session.run_id} {session.state.status}, exit {code}", flush=True)
    return code


if __name__ == "__main__":
    sys.exit(main())
