"""The wire format between ranks (probe) and the hub: newline-delimited JSON frames.

Imported by both sides, so it must stay pure: no torch, no asyncio, no UI.
Every frame is one JSON object with `v` (protocol version) and `kind`.
A frame that does not decode raises `ProtocolError`; the hub counts and drops it.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field, fields
from typing import Any, TypeAlias

VERSION = 1
MAX_FRAME = 1 << 20  # bytes; a longer line is dropped, never buffered without bound

# Environment a rank reads to find the hub.
ENV_ADDR = "DDPTOP_ADDR"  # "unix:/path/hub.sock" or "tcp:host:port"
ENV_TOKEN = "DDPTOP_TOKEN"
ENV_RUN_ID = "DDPTOP_RUN_ID"
ENV_CONFIG = "DDPTOP_CONFIG"  # path of the run's config.json (our trainer reads it)
ENV_NODE = "DDPTOP_NODE"  # the ddptop node (--node-rank) that launched the rank
ENV_PACKAGE_ROOT = "DDPTOP_PACKAGE_ROOT"  # where ddptop is: the ranks' boot appends it to sys.path, last
ENV_USER_PYTHONPATH = "DDPTOP_USER_PYTHONPATH"  # a supervisor's: the PYTHONPATH its user had, for the ranks
ENV_BOOT = "DDPTOP_BOOT"  # set by ddptop for the ranks: the rank-side layer attaches ("0": it stays out)
ENV_FR_BUFFER_SIZE = "DDPTOP_FR_BUFFER_SIZE"  # the flight recorder's size, under the name the rank's torch reads
ENV_FR_DUMP_FILE = "DDPTOP_FR_DUMP_FILE"  # ...and where it dumps
ENV_NCCL_PROFILER_PLUGIN = "NCCL_PROFILER_PLUGIN"  # NCCL's own: the profiler plugin it loads
NCCL_PLUGIN_LIBRARY = "ddptop_nccl_profiler.so"  # the file name ddptop builds its NCCL plugin as
ENV_NCCL_PLUGIN_WHY = "DDPTOP_NCCL_PLUGIN_WHY"  # why the ranks run without ddptop's NCCL profiler plugin
ENV_RANK_PID = "DDPTOP_RANK_PID"  # set by an attached rank: its children (workers, subprocesses) stay out
NSYS_WINDOW_RANGE = "ddptop_window"  # the NVTX range around an nsys window's own steps (its warmup step outside)

# Numeric fields a step record may carry; anything else is ignored.
STEP_FIELDS = (
    "step_ms",
    "data_ms",
    "forward_ms",
    "backward_ms",
    "optimizer_ms",
    "comm_ms",
    "exposed_comm_ms",
    "hook_ms",  # a comm hook's whole span (cast, collectives, decompress) where comm_ms is NCCL's own
    "comm_bytes",
    "buckets",
    "samples",
    "tokens",  # what the script says it processed this step (Probe.tick(tokens=...)), if it does
    "loss",
    "compressing",  # 1 when gradients travel compressed this step (PowerSGD: after warm-up)
    "profiled",  # 1 inside a capture window and the step after it: left out of throughput
    # memory, sampled by the rank side every few steps (MiB): torch's CUDA caching allocator
    # (allocated, reserved, peak allocated) on a GPU, the process's resident set everywhere
    "mem_allocated_mb", "mem_reserved_mb", "mem_peak_mb", "rss_mb",
    "eval_ms",  # no-grad forwards (validation) and the time between two: apart from the four phases
    "host_gap_ms",  # host time from the forward's return to backward (inside forward_ms): a loader there
    "span_steps", "span_ms",  # steps since the previous record, their host time: the pace (rank.phase_every)
)
Fact: TypeAlias = str | int | float | bool  # one of a rank's facts (Info.facts, RankState.info)
PHASES = ("data", "forward", "backward", "optimizer")
# A record may also carry `comm_spans`: the all-reduce buckets' [hand-over, completion], ms
# from the step's start, at most MAX_SPANS of them (the rank side sends them a few times a
# second, for the live step timeline). Decoded into Steps.spans, never into the record.
MAX_SPANS = 64
MAX_SPAN_MS = 1e7


class ProtocolError(ValueError):
    """A frame that is not valid; `reason` is a short category for counting."""

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason


@dataclass(frozen=True)
class Hello:
    """First frame of every rank connection; carries the run token."""

    rank: int
    local_rank: int
    world_size: int
    host: str
    pid: int
    token: str
    device: str = "cpu"
    backend: str = ""
    model: str = ""
    torch: str = ""
    nccl: str = ""
    # ddptop's --node-rank, not torchrun's GROUP_RANK: c10d numbers the nodes its own way,
    # and the user knows the machines by the number they typed
    node: int = 0
    kind: str = field(default="hello", init=False)


@dataclass(frozen=True)
class Steps:
    """A batch of step records from one rank. Each record is a dict with `step`
    (int, 0-based), `t` (the rank's wall clock at step end) and STEP_FIELDS. `spans`: the
    bucket spans some of them carried (`comm_spans`), by step."""

    rank: int
    records: list[dict[str, float]]
    spans: dict[int, tuple[tuple[float, float], ...]] = field(default_factory=dict)
    kind: str = field(default="steps", init=False)


@dataclass(frozen=True)
class Bye:
    """A rank's last frame: it finished (`completed`) or stopped on a command."""

    rank: int
    reason: str = "completed"
    # DDP's own timing from its logger (`_get_ddp_logging_data()`, ms; it samples some
    # iterations only): a cross-check of ddptop's comm figures
    ddp_timing: dict[str, float] = field(default_factory=dict)
    kind: str = field(default="bye", init=False)


@dataclass(frozen=True)
class Info:
    """Facts a rank learns after its hello (backend once the process group exists, the
    DDP module's class and size, the batch size read off the first forward) and notes on
    what cannot be measured. Later facts of the same name replace earlier ones."""

    rank: int
    facts: dict[str, Fact] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    kind: str = field(default="info", init=False)


@dataclass(frozen=True)
class Command:
    """Hub to ranks. `stop`: leave the loop after finishing step `at_step` (all ranks
    stop at the same boundary, so no rank waits in an all-reduce for a gone peer)."""

    name: str
    at_step: int = -1
    args: dict[str, Any] = field(default_factory=dict)
    kind: str = field(default="command", init=False)


@dataclass(frozen=True)
class StopCommand:
    """The `stop` command, typed: every rank leaves its loop after finishing step `at_step`."""

    at_step: int

    def to_command(self) -> Command:
        return Command("stop", at_step=self.at_step)

    @classmethod
    def read(cls, cmd: Command) -> StopCommand | None:
        """The stop a command says (one without a step: at once), or None for another command."""
        return cls(cmd.at_step if cmd.at_step >= 0 else 0) if cmd.name == "stop" else None


@dataclass(frozen=True)
class CaptureCommand:
    """The `capture` command, typed: profile `count` steps from `at_step` into `out_dir`
    (torch.profiler or nsys), as capture `capture_id`. On the wire, its fields but the step
    travel in `Command.args` (`id`, `count`, `dir`, `profiler`, `memory`)."""

    capture_id: int
    at_step: int
    count: int
    out_dir: str
    profiler: str = "torch"
    memory: bool = False  # torch.profiler's profile_memory

    def to_command(self) -> Command:
        args = {"id": self.capture_id, "count": self.count, "dir": self.out_dir, "profiler": self.profiler, "memory": self.memory}
        return Command("capture", at_step=self.at_step, args=args)

    @classmethod
    def read(cls, cmd: Command) -> CaptureCommand | None:
        """The window a command asks for, or None for another command."""
        if cmd.name != "capture":
            return None
        a = cmd.args
        return cls(int(a.get("id", 0)), cmd.at_step, int(a.get("count", 1)), str(a.get("dir", "captures")),
                   str(a.get("profiler", "torch")), memory=bool(a.get("memory", False)))


@dataclass(frozen=True)
class CaptureReport:
    """Rank to hub: how a capture window went on this rank (recording, written, failed)."""

    rank: int
    capture_id: int
    status: str
    files: list[str] = field(default_factory=list)
    error: str = ""
    warmup: int = 0  # recording: steps the profiler ran before the window (its start-up left out)
    kind: str = field(default="capture", init=False)


Message = Hello | Steps | Bye | Info | Command | CaptureReport
CAPTURE_STATUSES = ("recording", "written", "failed")
COMMANDS = ("stop", "capture")


def encode(msg: Message) -> bytes:
    """One frame, one JSON line of the fields as they are (JSON's own values, no dataclass
    below): asdict's deep copy took 1.0 ms a frame of 36 step records (2026-11-28)."""
    data = {f.name: getattr(msg, f.name) for f in fields(msg)}
    data["v"] = VERSION
    return (json.dumps(data, separators=(",", ":")) + "\n").encode()


MAX_INT = 1 << 31  # ranks, pids, world sizes, ids: far below this


def _int(data: dict[str, Any], key: str, minimum: int = 0) -> int:
    value = data.get(key)
    if type(value) is not int or value < minimum or value >= MAX_INT:
        raise ProtocolError("bad-field", key)
    return value


def _str(data: dict[str, Any], key: str, default: str | None = None, limit: int = 256) -> str:
    value = data.get(key, default)
    if not isinstance(value, str) or len(value) > limit:
        raise ProtocolError("bad-field", key)
    return value


# What a token holder's numbers may be (README: "numbers out of range are refused"): finite,
# not below 0 (but a loss), and no more than any real step could hold. One number out of
# range refuses its frame, counted (bad-record), so no figure of the run is built on it.
MAX_STEP = 10**12  # a step index
MAX_T = 1e11  # the rank's wall clock, s since 1970 (year 5138)
MAX_MS = 7 * 86_400_000.0  # a week, for any one step or phase
JITTER_MS = 1.0  # two streams' clocks: a phase a hair below 0 reads 0, below this is refused
_TIMES = ("step_ms", "data_ms", "forward_ms", "backward_ms", "optimizer_ms", "comm_ms",
          "exposed_comm_ms", "hook_ms", "eval_ms", "host_gap_ms", "span_ms")
_BOUNDS: dict[str, tuple[float, float]] = {
    **dict.fromkeys(_TIMES, (-JITTER_MS, MAX_MS)),
    "comm_bytes": (0.0, 1e15), "buckets": (0.0, 1e6), "samples": (0.0, 1e9), "tokens": (0.0, 1e12), "span_steps": (0.0, 1e6),
    "loss": (-3.4e38, 3.4e38),  # a float32's range: any sign, but finite
    "compressing": (0.0, 1.0), "profiled": (0.0, 1.0),
    **dict.fromkeys(("mem_allocated_mb", "mem_reserved_mb", "mem_peak_mb", "rss_mb"), (0.0, 1e9)),
}
assert set(_BOUNDS) == set(STEP_FIELDS)


def _record(raw: Any) -> dict[str, float]:
    # hot path (every step of every rank): one pass over the record's own keys
    if type(raw) is not dict:
        raise ProtocolError("bad-record")
    step = raw.get("step")
    if type(step) is not int or not 0 <= step <= MAX_STEP:
        raise ProtocolError("bad-record", "step")
    rec: dict[str, float] = {"step": step}
    for key, value in raw.items():
        kind = type(value)
        bounds = _BOUNDS.get(key)
        if bounds is not None:
            # NaN and the infinities fail the comparison; an int of 400 digits compares exactly
            if (kind is not int and kind is not float) or not bounds[0] <= value <= bounds[1]:
                raise ProtocolError("bad-record", key)
            rec[key] = value if value >= 0 or key == "loss" else 0.0
        elif key == "t":
            if (kind is not float and kind is not int) or not 0.0 <= value <= MAX_T:
                raise ProtocolError("bad-record", "t")
            rec["t"] = float(value)
    return rec


def _spans(raw: dict[str, Any]) -> tuple[tuple[float, float], ...]:
    spans = raw["comm_spans"]
    if type(spans) is not list or len(spans) > MAX_SPANS:
        raise ProtocolError("bad-record", "comm_spans")
    out = []
    for pair in spans:
        if type(pair) is not list or len(pair) != 2:
            raise ProtocolError("bad-record", "comm_spans")
        a, b = pair
        if (type(a) not in (int, float) or type(b) not in (int, float)
                or not 0.0 <= a <= b <= MAX_SPAN_MS):  # NaN fails every comparison
            raise ProtocolError("bad-record", "comm_spans")
        out.append((float(a), float(b)))
    return tuple(out)


def _steps(data: dict[str, Any]) -> Steps:
    records = data.get("records")
    if not isinstance(records, list):
        raise ProtocolError("bad-field", "records")
    decoded = [_record(r) for r in records]
    spans = {int(rec["step"]): _spans(raw) for raw, rec in zip(records, decoded) if "comm_spans" in raw}
    return Steps(rank=_int(data, "rank"), records=decoded, spans=spans)


def _facts(raw: Any) -> dict[str, Fact]:
    if not isinstance(raw, dict) or len(raw) > 32:
        raise ProtocolError("bad-field", "facts")
    for key, value in raw.items():
        ok = type(value) in (bool, int, float, str)
        if type(value) is int:
            ok = abs(value) < 1 << 63
        elif type(value) is float:
            ok = math.isfinite(value)
        elif type(value) is str:
            ok = len(value) <= 512
        if not (isinstance(key, str) and 0 < len(key) <= 64 and ok):
            raise ProtocolError("bad-field", "facts")
    return raw


def _notes(raw: Any) -> list[str]:
    if not isinstance(raw, list) or len(raw) > 16 or not all(isinstance(n, str) and len(n) <= 512 for n in raw):
        raise ProtocolError("bad-field", "notes")
    return raw


def decode(line: bytes | str) -> Message:
    """Parse one frame. Raises ProtocolError (never anything else) on bad input."""
    try:
        return _decode(line)
    except ProtocolError:
        raise
    except (OverflowError, ValueError, TypeError, RecursionError) as exc:  # 10**400 is valid JSON
        raise ProtocolError("bad-number", type(exc).__name__) from None


def _decode(line: bytes | str) -> Message:
    if len(line) > MAX_FRAME:
        raise ProtocolError("oversized")
    try:
        data = json.loads(line)
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:
        raise ProtocolError("not-json", type(exc).__name__) from None
    if not isinstance(data, dict):
        raise ProtocolError("not-object")
    if data.get("v") != VERSION:
        raise ProtocolError("version", repr(data.get("v"))[:20])
    kind = data.get("kind")
    if kind == "hello":
        return Hello(
            rank=_int(data, "rank"),
            local_rank=_int(data, "local_rank"),
            world_size=_int(data, "world_size", 1),
            host=_str(data, "host"),
            pid=_int(data, "pid"),
            token=_str(data, "token"),
            device=_str(data, "device", ""),
            backend=_str(data, "backend", ""),
            model=_str(data, "model", ""),
            torch=_str(data, "torch", ""),
            nccl=_str(data, "nccl", ""),
            node=_int(data, "node") if "node" in data else 0,
        )
    if kind == "steps":
        return _steps(data)
    if kind == "bye":
        timing = data.get("ddp_timing", {})
        if not isinstance(timing, dict) or len(timing) > 16 or not all(
                isinstance(k, str) and len(k) < 64 and type(v) in (int, float) and math.isfinite(v)
                for k, v in timing.items()):
            raise ProtocolError("bad-field", "ddp_timing")
        return Bye(rank=_int(data, "rank"), reason=_str(data, "reason", "completed", 64), ddp_timing=timing)
    if kind == "info":
        return Info(rank=_int(data, "rank"), facts=_facts(data.get("facts", {})), notes=_notes(data.get("notes", [])))
    if kind == "capture":
        status = _str(data, "status")
        files = data.get("files", [])
        if status not in CAPTURE_STATUSES or not isinstance(files, list) or len(files) > 64:
            raise ProtocolError("bad-field", "capture")
        if not all(isinstance(f, str) and len(f) < 4096 for f in files):
            raise ProtocolError("bad-field", "files")
        warmup = data.get("warmup", 0)
        if isinstance(warmup, bool) or not isinstance(warmup, int) or not 0 <= warmup <= 1000:
            raise ProtocolError("bad-field", "warmup")
        return CaptureReport(rank=_int(data, "rank"), capture_id=_int(data, "capture_id"), status=status,
                             files=files, error=_str(data, "error", "", 2000), warmup=warmup)
    if kind == "command":
        name = _str(data, "name")
        if name not in COMMANDS:
            raise ProtocolError("unknown-command", name[:32])
        at_step = data.get("at_step", -1)
        args = data.get("args", {})
        if type(at_step) is not int or not isinstance(args, dict):
            raise ProtocolError("bad-field", "command")
        return Command(name=name, at_step=at_step, args=args)
    raise ProtocolError("unknown-kind", str(kind)[:32])


def parse_addr(addr: str) -> tuple[str, str | tuple[str, int]]:
    """`unix:/path` -> ("unix", path); `tcp:host:port` -> ("tcp", (host, port))."""
    scheme, _, rest = addr.partition(":")
    if scheme == "unix" and rest:
        return "unix", rest
    if scheme == "tcp":
        host, _, port = rest.rpartition(":")
        if host and port.isdigit():
            return "tcp", (host, int(port))
    raise ValueError(f"bad ddptop address {addr!r} (want unix:/path or tcp:host:port)")
