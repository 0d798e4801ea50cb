"""The rank's connection to the hub: a hello, batched step records, and the commands (stop,
capture) that come back. `ddptop.probe` is its public import path for training scripts; the
instrument (ddptop.rank.instrument) owns one per measured rank.

Imports only the standard library and `ddptop.wire.protocol`; torch is read from
`sys.modules` when the script already imported it, never imported here.
"""

from __future__ import annotations

import atexit
import collections
import os
import select
import socket
import sys
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol

from ddptop.wire import protocol

FLUSH_S = 0.2  # how stale the hub's view may get; one send per interval, not per step
MAX_BATCH = 1000  # records per frame, well under protocol.MAX_FRAME
# A hub that cannot be reached yet (a busy listen queue, a reconnect storm): the rank tries
# again with these waits, the last one for as long as the run lasts, keeping what it measured
RETRY_S = (0.05, 0.1, 0.2, 0.5, 1.0, 2.0)
MAX_HELD = 20_000  # records kept while not yet connected (the oldest go first)
MAX_EARLY = 256  # facts, notes and other frames kept while not yet connected

_attached: Any = None  # the Instrument measuring this process (set by ddptop.rank.attach)


def attached() -> Any:
    """The attached Instrument of this process, or None."""
    return _attached


def set_attached(instrument: Any) -> None:
    global _attached
    _attached = instrument


def _torch_facts() -> dict[str, str]:
    torch = sys.modules.get("torch")
    if torch is None:
        return {}
    facts = {"torch": str(getattr(torch, "__version__", ""))}
    try:
        if torch.cuda.is_available():
            version = torch.cuda.nccl.version()
            facts["nccl"] = ".".join(map(str, version)) if isinstance(version, tuple) else str(version)
    except Exception:  # noqa: BLE001 - a probe never breaks training
        pass
    return facts


def _node() -> int:
    raw = os.environ.get(protocol.ENV_NODE, "0")
    return int(raw) if raw.isdigit() else 0


def _open(addr: str) -> socket.socket:
    scheme, where = protocol.parse_addr(addr)
    if scheme == "unix":
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    else:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.settimeout(10)
    sock.connect(where)
    sock.settimeout(None)
    return sock


class Probe:
    """One rank's link to the hub. All methods are cheap and never raise into
    the training loop: if the hub goes away, the probe goes quiet."""

    def __init__(self, sock: socket.socket | None, rank: int = 0, owned: bool = False) -> None:
        self._sock = sock
        self.rank = rank
        self._pending: collections.deque[dict[str, Any]] = collections.deque(maxlen=MAX_HELD)
        self._connecting = False  # the first connect failed; a thread keeps trying (_retry)
        self._early: list[protocol.Message] = []  # frames sent before the connection exists
        self._lock = threading.Lock()  # serialises socket writes (flush thread vs close)
        self._closed = threading.Event()
        self._step = 0
        self._last_tick = time.monotonic()
        self.stop_at: int | None = None
        self.commands: collections.deque[protocol.Command] = collections.deque()
        self.on_command: Callable[[protocol.Command], None] | None = None
        self._crashed = False
        self.forked = False  # this is a forked child's copy: it stays quiet (forget())
        if sock is not None:
            self._thread = threading.Thread(target=self._run, name="ddptop-probe", daemon=True)
            self._thread.start()
        if sock is not None and not owned:  # the instrument says goodbye for the probe it owns
            self._chain_excepthook()
            # a script that never calls close() still says goodbye; "exited" is not a claim
            # that training completed, "crashed" follows an uncaught exception
            atexit.register(lambda: self.close("crashed" if self._crashed else "exited"))

    @property
    def enabled(self) -> bool:
        return self._sock is not None or self._connecting

    @classmethod
    def connect(cls, *, device: str = "", backend: str = "", model: str = "") -> Probe:
        """The probe for a training script: the instrument's when ddptop measures this rank
        (one connection, one count of steps), else a connection of its own; a disabled probe
        when not run under ddptop."""
        instrument = attached()
        if instrument is not None:
            return AttachedProbe(instrument, device=device, backend=backend, model=model)  # type: ignore[return-value]
        return cls.open(device=device, backend=backend, model=model)

    @classmethod
    def open(cls, *, device: str = "", backend: str = "", model: str = "", owned: bool = False) -> Probe:
        """Connect to the hub named by DDPTOP_ADDR; a disabled probe when absent."""
        addr = os.environ.get(protocol.ENV_ADDR)
        rank = int(os.environ.get("RANK", "0"))
        if not addr:
            return cls(None, rank)
        hello = protocol.Hello(
            rank=rank,
            local_rank=int(os.environ.get("LOCAL_RANK", "0")),
            world_size=int(os.environ.get("WORLD_SIZE", "1")),
            host=socket.gethostname(),
            pid=os.getpid(),
            token=os.environ.get(protocol.ENV_TOKEN, ""),
            device=device,
            backend=backend,
            model=model,
            node=_node(),
            **_torch_facts(),
        )
        try:
            sock = _open(addr)
            sock.sendall(protocol.encode(hello))
        except ValueError as exc:
            print(f"ddptop probe: cannot reach hub at {addr}: {exc}; not reporting", file=sys.stderr)
            return cls(None, rank)
        except OSError:  # not yet: keep trying in the background, keep what is measured meanwhile
            probe = cls(None, rank, owned=owned)
            probe._connecting = True
            threading.Thread(target=probe._retry, args=(addr, hello), name="ddptop-connect", daemon=True).start()
            return probe
        return cls(sock, rank, owned=owned)

    def _retry(self, addr: str, hello: protocol.Hello) -> None:
        """Connect with backoff until it works or the probe is closed; then send the hello,
        what was said meanwhile, and report as if connected from the start."""
        for attempt in range(1 << 30):
            if self._closed.wait(RETRY_S[min(attempt, len(RETRY_S) - 1)]):
                return
            try:
                sock = _open(addr)
                sock.sendall(protocol.encode(hello))
            except (OSError, ValueError):
                continue
            with self._lock:
                try:
                    for msg in self._early:
                        sock.sendall(protocol.encode(msg))
                except (OSError, TypeError, ValueError):
                    pass
                self._early = []
                self._sock, self._connecting = sock, False
            self._thread = threading.Thread(target=self._run, name="ddptop-probe", daemon=True)
            self._thread.start()
            return

    # --- called from the training loop -------------------------------------------------
    def record(self, step: int, **values: float) -> None:
        """Queue one step's record (fields from protocol.STEP_FIELDS)."""
        self.record_step(step, values)

    def record_step(self, step: int, values: dict[str, Any], comm_spans: list[list[float]] | None = None) -> None:
        """`record`, with the all-reduce buckets' [hand-over, completion] in ms from the
        step's start (the instrument's, a few times a second)."""
        if self._sock is not None or self._connecting:
            plain: dict[str, Any] = _plain(values)  # a tensor the script handed over is read here
            plain["step"] = step
            plain["t"] = time.time()
            if comm_spans:
                plain["comm_spans"] = comm_spans
            self._pending.append(plain)

    def tick(self, samples: int = 0, **values: float) -> bool:
        """For scripts that do not time phases: records the time since the last
        tick as this step's time. Returns True when ddptop asks the run to stop."""
        now = time.monotonic()
        step = self._step
        self.record(step, step_ms=(now - self._last_tick) * 1000.0, samples=samples, **values)
        self._last_tick = now
        self._step += 1
        return self.should_stop(step)

    def should_stop(self, step: int) -> bool:
        """True once `step` (just finished) is at or past the agreed stop step."""
        return self.stop_at is not None and step >= self.stop_at

    def info(self, facts: dict[str, Any], notes: list[str]) -> None:
        """Facts learnt since the hello (backend, model, batch size) and notes for the user."""
        self._send(protocol.Info(self.rank, dict(facts), list(notes)))

    def report_capture(self, capture_id: int, status: str, files: list[str] | None = None,
                       error: str = "", warmup: int = 0) -> None:
        """Tell ddptop how a capture window went on this rank."""
        self.flush()
        self._send(protocol.CaptureReport(self.rank, capture_id, status, files or [], error[:2000], warmup))

    def close(self, reason: str = "completed", ddp_timing: dict[str, float] | None = None) -> None:
        self._connecting = False
        if self._sock is None or self._closed.is_set():
            self._closed.set()  # a connect still being tried stops
            return
        self._closed.set()  # the thread sees it within FLUSH_S; no need to wait for it
        self.flush()
        self._send(protocol.Bye(rank=self.rank, reason=reason, ddp_timing=ddp_timing or {}))
        try:
            self._sock.close()
        except OSError:
            pass
        self._sock = None

    def forget(self) -> None:
        """In a child forked from the rank: the socket is the parent's (its frames would mix
        with the parent's), the queue holds the parent's steps. Drop both, say nothing."""
        self.forked = True
        self._connecting = False
        self._sock = None
        self._pending.clear()
        self._closed.set()

    def _chain_excepthook(self) -> None:
        previous = sys.excepthook

        def hook(*exc_info: Any) -> None:
            # say so at once: the process's teardown is what makes its peers fail next; a SIGINT
            # (KeyboardInterrupt) stopped it, as Ctrl-C does under torchrun
            interrupted = isinstance(exc_info[0], type) and issubclass(exc_info[0], KeyboardInterrupt)
            self._crashed = not interrupted
            self.close("stopped" if interrupted else "crashed")
            previous(*exc_info)

        sys.excepthook = hook

    # --- background thread --------------------------------------------------------------
    def _run(self) -> None:
        buf = b""
        while not self._closed.is_set():
            sock = self._sock  # close() may drop it from the training thread at any time
            if sock is None:
                return
            try:
                ready, _, _ = select.select([sock], [], [], FLUSH_S)
            except (OSError, ValueError):
                return
            if ready:
                try:
                    chunk = sock.recv(65536)
                except (OSError, ValueError):
                    chunk = b""
                if not chunk:  # hub closed: keep training, stop reporting
                    return
                buf += chunk
                while b"\n" in buf:
                    line, buf = buf.split(b"\n", 1)
                    self._handle(line)
            self.flush()

    def _handle(self, line: bytes) -> None:
        try:
            msg = protocol.decode(line)
        except protocol.ProtocolError:
            return
        if not isinstance(msg, protocol.Command):
            return
        stop = protocol.StopCommand.read(msg)
        if stop is not None:
            self.stop_at = stop.at_step
        self.commands.append(msg)
        if self.on_command is not None:
            try:
                self.on_command(msg)
            except Exception as exc:  # noqa: BLE001
                print(f"ddptop probe: command handler failed: {exc}", file=sys.stderr)

    @property
    def connected(self) -> bool:
        """Talking to the hub now (not before the first connect, nor after close/forget)."""
        return self._sock is not None

    def flush(self) -> None:
        """Every queued record to the hub now (nothing when not connected: they wait, bounded)."""
        if self._sock is None:
            return  # not connected (yet): the records wait, bounded
        while self._pending:
            batch: list[dict[str, Any]] = []
            while self._pending and len(batch) < MAX_BATCH:
                batch.append(self._pending.popleft())
            self._send(protocol.Steps(rank=self.rank, records=batch))

    def _send(self, msg: protocol.Message) -> None:
        sock = self._sock
        if sock is None:
            if self._connecting:
                with self._lock:
                    if self._sock is None and len(self._early) < MAX_EARLY:
                        self._early.append(msg)
                        return
                self._send(msg)  # connected meanwhile
            return
        with self._lock:
            try:
                sock.sendall(protocol.encode(msg))
            except OSError:
                self._pending.clear()
            except (TypeError, ValueError) as exc:  # unencodable: dropped, never raised into training
                print(f"ddptop probe: a message could not be encoded, dropped: {exc}", file=sys.stderr)


class Measuring(Protocol):
    """What AttachedProbe uses of the instrument that measures this process
    (ddptop.rank.instrument.Instrument, which imports this module: hence a protocol)."""

    rank: int
    probe: Probe

    def send_facts(self, facts: dict[str, Any], from_script: bool = False) -> None: ...
    def user_values(self, values: dict[str, Any]) -> bool: ...
    def should_stop(self) -> bool: ...
    def finish(self, reason: str | None = None) -> None: ...


class AttachedProbe:
    """What Probe.connect() gives a script that ddptop's instrument already measures: its
    values join the instrument's steps; tick() says when ddptop asks the run to stop."""

    def __init__(self, instrument: Measuring, device: str = "", backend: str = "", model: str = "") -> None:
        self._inst = instrument
        self.rank = instrument.rank
        self._step = 0
        facts = {k: v for k, v in (("device", device), ("backend", backend), ("model", model)) if v}
        if facts:
            instrument.send_facts(facts, from_script=True)

    @property
    def enabled(self) -> bool:
        return True

    @property
    def stop_at(self) -> int | None:
        return self._inst.probe.stop_at

    @property
    def commands(self) -> collections.deque[protocol.Command]:
        return self._inst.probe.commands

    def tick(self, samples: int = 0, **values: Any) -> bool:
        extra = dict(values, **({"samples": samples} if samples else {}))
        if not self._inst.user_values(extra):
            # no optimizer step seen (a loop without torch.optim): the tick is the step
            return self._inst.probe.tick(samples=samples, **_plain(values))
        return self._inst.should_stop()

    def record(self, step: int, **values: Any) -> None:
        if not self._inst.user_values(values):
            self._inst.probe.record(step, **_plain(values))

    def should_stop(self, step: int) -> bool:
        return self._inst.should_stop() or self._inst.probe.should_stop(step)

    def report_capture(self, capture_id: int, status: str, files: list[str] | None = None, error: str = "") -> None:
        self._inst.probe.report_capture(capture_id, status, files, error)

    def close(self, reason: str = "completed", ddp_timing: dict[str, float] | None = None) -> None:  # noqa: ARG002
        """Training is over: the instrument sends the last steps and says goodbye now (else
        it does at exit)."""
        self._inst.finish(reason)


def _plain(values: dict[str, Any]) -> dict[str, float]:
    """Numbers for the wire: a tensor's value is read (the script asked for it)."""
    out = {}
    for key, value in values.items():
        try:
            out[key] = float(value.item() if hasattr(value, "item") else value)
        except (TypeError, ValueError, RuntimeError):
            pass
    return out
