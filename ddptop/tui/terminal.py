"""The viewer's ends: noticing that its terminal (or the web server behind its page) is
gone, and answering SIGTERM/SIGINT/SIGHUP even while Textual's loop is blocked.

Textual's own drivers die quietly when the terminal goes: the writer thread ends on the
first EIO, the next 30 writes fill its queue and block the event loop for good, and the
input thread spins on EOF; a loop-based signal handler then never runs. These drivers
swallow output errors, say `TerminalLost` once (EIO, EPIPE, EOF, a hangup on the tty),
and the signal handlers are plain Python ones that also arm a deadline for the process.
No torch, no sockets, no subprocesses.
"""

from __future__ import annotations

import asyncio
import io
import os
import select
import signal
import threading
from collections.abc import Callable
from typing import Any, cast

from textual.driver import Driver
from textual.drivers.linux_driver import LinuxDriver
from textual.drivers.web_driver import WebDriver
from textual.message import Message

EXIT_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
FORCE_EXIT_S = 25.0  # after a first signal: long enough for a clean stop (8 s + the sweep)
SECOND_SIGNAL_S = 3.0  # after a second one: just leave
HANGUP_POLL_MS = 500


class TerminalLost(Message):
    """The terminal (or the web page's server) is gone: nothing more can be shown."""

    def __init__(self, reason: str) -> None:
        super().__init__()
        self.reason = reason


class _Lost:
    """Says `TerminalLost` to the app once, from any thread."""

    _app: Any

    def _init_lost(self) -> None:
        self.lost_reason = ""
        self._lost_lock = threading.Lock()
        self._lost_loop: asyncio.AbstractEventLoop | None = None  # the app's, once it runs

    def _lost(self, reason: str) -> None:
        with self._lost_lock:
            if self.lost_reason:
                return
            self.lost_reason = reason
        loop = self._lost_loop
        if loop is not None and not loop.is_closed():
            try:
                loop.call_soon_threadsafe(self._app.post_message, TerminalLost(reason))
            except RuntimeError:
                pass  # the loop closed meanwhile: the app is gone anyway


class _GuardedOutput:
    """The terminal's file for Textual's writer thread: an error ends the output (and
    says so) instead of the thread, so the queue keeps draining and the loop never blocks."""

    def __init__(self, file: Any, lost: Callable[[str], None]) -> None:
        self._file = file
        self._lost = lost
        self.failed = False

    def _guard(self, call: Callable[[], Any]) -> None:
        if self.failed:
            return
        try:
            call()
        except (OSError, ValueError) as exc:  # EIO, EPIPE; ValueError: closed
            self.failed = True
            self._lost(f"terminal output failed ({getattr(exc, 'strerror', None) or exc})")

    def write(self, text: str) -> None:
        self._guard(lambda: self._file.write(text))

    def flush(self) -> None:
        self._guard(self._file.flush)

    def fileno(self) -> int:
        return int(self._file.fileno())

    def __getattr__(self, name: str) -> Any:
        return getattr(self._file, name)


def _watch_hangup(fds: list[int], stop: threading.Event, lost: Callable[[str], None]) -> None:
    """POLLHUP/POLLERR on the terminal (its pty master closed, a pipe's writer gone)."""
    poller = select.poll()
    for fd in fds:
        poller.register(fd, 0)  # 0: only the events poll always reports
    while not stop.is_set():
        try:
            events = poller.poll(HANGUP_POLL_MS)
        except OSError:
            return
        for fd, mask in events:
            what = "hangup" if mask & select.POLLHUP else "error" if mask & select.POLLERR else "closed"
            lost(f"terminal {what} on fd {fd}")
            return


class TerminalDriver(_Lost, LinuxDriver):
    """LinuxDriver that notices its terminal going away (EIO on output, a hangup or EOF
    on input) and then neither blocks nor spins."""

    def __init__(self, app: Any, **kwargs: Any) -> None:
        super().__init__(app, **kwargs)
        self._init_lost()
        self._guarded = _GuardedOutput(self._file, self._lost)
        self._file = cast(io.TextIOWrapper, self._guarded)  # duck-typed: write, flush, fileno
        self._stop_watch = threading.Event()

    def start_application_mode(self) -> None:
        self._loop = self._lost_loop = asyncio.get_running_loop()
        super().start_application_mode()
        fds = sorted({self.fileno, self._guarded.fileno()})
        threading.Thread(target=_watch_hangup, args=(fds, self._stop_watch, self._lost),
                         name="ddptop-hangup", daemon=True).start()

    def write(self, data: str) -> None:
        if not self.lost_reason:
            super().write(data)

    def stop_application_mode(self) -> None:
        self._stop_watch.set()
        if self.lost_reason:
            self.exit_event.set()  # the input thread ends; nothing to restore on a dead tty
            return
        super().stop_application_mode()

    def close(self) -> None:
        if not self.lost_reason:
            super().close()  # waits for the writer thread: only while it can still write


class PageDriver(_Lost, WebDriver):
    """WebDriver (textual-serve's pipe to one browser page) that ends the viewer when the
    server stops reading or closes its input, and writes whole packets."""

    def __init__(self, app: Any, **kwargs: Any) -> None:
        super().__init__(app, **kwargs)
        self._init_lost()
        self._write = self._write_all  # type: ignore[assignment]

    def _write_all(self, data: bytes) -> None:
        if self.lost_reason:
            return
        view = memoryview(data)
        try:
            while view:  # a signal may cut a write short: a torn packet would garble the page
                view = view[os.write(self.fileno, view):]
        except OSError as exc:
            self._lost(f"the web server stopped reading ({exc.strerror or exc})")

    def start_application_mode(self) -> None:
        self._loop = self._lost_loop = asyncio.get_running_loop()
        super().start_application_mode()

    def run_input_thread(self) -> None:
        super().run_input_thread()
        if not self.exit_event.is_set():  # not our own exit: the server closed our input
            self._lost("the web server closed the page's input")


def driver_for(default: type[Driver]) -> type[Driver]:
    """Our driver in place of Textual's terminal or web driver; any other as it is."""
    if default is LinuxDriver:
        return TerminalDriver
    if default is WebDriver:
        return PageDriver
    return default


def silence_output() -> None:
    """Point stdout and stderr at /dev/null: a dead terminal fails every later write (the
    last flush at exit included) with EIO."""
    try:
        null = os.open(os.devnull, os.O_WRONLY)
    except OSError:
        return
    for fd in (1, 2):
        try:
            os.dup2(null, fd)
        except OSError:
            pass
    os.close(null)


class ExitSignals:
    """SIGTERM, SIGINT and SIGHUP as plain Python handlers: they run even while the loop
    is stuck (a blocked write), pass the signal to the loop, and arm a deadline after which
    the process exits whatever it is doing (128 + the signal, as a shell reports it)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, callback: Callable[[int], None],
                 signals: tuple[int, ...] = EXIT_SIGNALS, deadline: bool = True) -> None:
        self._loop = loop
        self._callback = callback
        self._signals = signals
        self._deadline = deadline  # False: never end the process (an app inside a test run)
        self._before: dict[int, Any] = {}
        self._timer: threading.Timer | None = None
        self._seen = 0

    def install(self) -> bool:
        """False where signals cannot be taken (not the main thread)."""
        try:
            for sig in self._signals:
                self._loop.remove_signal_handler(sig)  # e.g. the web driver's, which needs the loop
                self._before[sig] = signal.signal(sig, self._handler)
        except (ValueError, RuntimeError):
            self.uninstall()
            return False
        return True

    def __contains__(self, sig: object) -> bool:
        return sig in self._before

    def uninstall(self, keep_deadline: bool = False) -> None:
        for sig, before in self._before.items():
            try:
                signal.signal(sig, before if before is not None else signal.SIG_DFL)
            except (ValueError, TypeError):
                pass
        self._before.clear()
        if not keep_deadline:
            self.disarm()

    def _handler(self, signum: int, frame: object) -> None:
        self._seen += 1
        self.arm(FORCE_EXIT_S if self._seen == 1 else SECOND_SIGNAL_S, 128 + signum)
        try:
            self._loop.call_soon_threadsafe(self._callback, signum)
        except RuntimeError:
            os._exit(128 + signum)  # no loop left to take it

    def arm(self, after_s: float, code: int) -> None:
        """Exit with `code` in `after_s` unless `disarm()`ed first (a sooner deadline wins)."""
        if not self._deadline:
            return
        if self._timer is not None:
            if self._timer.interval <= after_s:
                return
            self._timer.cancel()
        self._timer = threading.Timer(after_s, os._exit, (code,))
        self._timer.daemon = True
        self._timer.start()

    def disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
