"""A run's state as plain JSON data for viewers: RunState and what hangs off it (ranks,
histograms, hellos, stalls, captures, GPU samples, topology, NCCL report, advice) to
dicts of plain fields and back. Pure: no I/O; depends on the model modules only.

The schema is explicit and closed: the classes in `_CLASSES`, each field encoded by its
annotated type (the fields typed `Any` in the classes are pinned in `_PINNED`). Decoding
checks every value against that schema and can only build those classes from plain
values, so a snapshot cannot run code; a value that does not fit raises
ViewerProtocolError naming the field, never anything else. `SCHEMA` is a digest of
the whole schema: the viewer handshake compares it, so a viewer and a supervisor of
different ddptop versions refuse each other instead of misreading fields.
"""

from __future__ import annotations

import array
import base64
import binascii
import collections
import dataclasses
import hashlib
import itertools
import math
import sys
import types
import typing
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from ddptop.analysis.advisor import Advice
from ddptop.analysis.capture import Capture
from ddptop.analysis.nccl import (
    CollectiveStat,
    Communicator,
    NcclReport,
    RankInfo,
    Transport,
    TreeNode,
)
from ddptop.hw.gpu import GpuProcess, GpuSample, GpuStat, TopologyMatrix, TopoReading
from ddptop.model.state import LOG_LINES, RECENT, Histogram, RankState, RunState, Stall
from ddptop.wire.protocol import Hello

MAX_RANKS = 1 << 16  # RunState builds a RankState per rank of world_size: bound it first
MAX_RECORD_KEYS = 64


class ViewerProtocolError(ValueError):
    """A line, frame or snapshot that does not follow the viewer protocol; `reason` is short.
    (Defined here, the lowest of the two wire modules; ddptop.wire.viewer_protocol exports it.)"""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def _bad(path: str, what: str) -> typing.NoReturn:
    raise ViewerProtocolError(f"bad snapshot: {path}: {what}")


Enc = Callable[[Any], Any]
Dec = Callable[[Any, str], Any]  # (plain value, field path for the error) -> object


def _same(value: Any) -> Any:
    return value


@dataclass(frozen=True)
class _Ring:
    """A deque of `item` holding at most `maxlen` (pinned where the annotation cannot say)."""

    item: Any
    maxlen: int


@dataclass(frozen=True)
class _Records:
    """RankState.recent: step records (str -> int | float), sent as columns (see records_to_wire)."""

    maxlen: int


# Fields typed Any (or too loosely) in their classes, and what they hold.
_PINNED: dict[tuple[type, str], Any] = {
    (RankState, "recent"): _Records(RECENT),
    (RunState, "logs"): dict[int, _Ring(str, LOG_LINES)],
    (RunState, "gpu"): GpuSample | None,
    (RunState, "gpu_history"): _Ring(GpuSample, RunState.__dataclass_fields__["gpu_history"]
                                     .default_factory().maxlen),  # type: ignore[misc]
    (RunState, "history"): _Ring(tuple[float, float], RunState.__dataclass_fields__["history"]
                                 .default_factory().maxlen),  # type: ignore[misc]
    (RunState, "nccl"): NcclReport | None,
    (RunState, "topology"): TopologyMatrix | None,
    (RunState, "advice"): Advice | None,
    (RunState, "captures"): dict[int, Capture],
}
# What a viewer has no use for and should not hold: a rank's hub token.
_BLANK: dict[tuple[type, str], Any] = {(Hello, "token"): ""}

_CLASSES = (RunState, RankState, Hello, Stall, Capture, GpuSample, GpuStat, GpuProcess, TopologyMatrix,
            TopoReading, NcclReport, Communicator, RankInfo, Transport, TreeNode, CollectiveStat, Advice)


# ---------------------------------------------------------------------------- scalars


def _dec_int(x: Any, path: str) -> int:
    if type(x) is not int:
        _bad(path, f"expected an integer, got {type(x).__name__}")
    return x


def _dec_float(x: Any, path: str) -> float:
    if type(x) is not float and type(x) is not int:  # JSON keeps 3 and 3.0 apart: so do we
        _bad(path, f"expected a number, got {type(x).__name__}")
    return x


def _dec_str(x: Any, path: str) -> str:
    if type(x) is not str:
        _bad(path, f"expected a string, got {type(x).__name__}")
    return x


def _dec_bool(x: Any, path: str) -> bool:
    if type(x) is not bool:
        _bad(path, f"expected true/false, got {type(x).__name__}")
    return x


def _dec_none(x: Any, path: str) -> None:
    if x is not None:
        _bad(path, "expected null")


def _dec_json(x: Any, path: str) -> Any:
    return x  # free-form plain data (config, facts, summaries): json.loads made nothing else


_SCALARS: dict[Any, Dec] = {int: _dec_int, float: _dec_float, str: _dec_str, bool: _dec_bool,
                            type(None): _dec_none, Any: _dec_json}


_TYPES: dict[Any, frozenset[type]] = {int: frozenset({int}), float: frozenset({int, float}),
                                      str: frozenset({str}), bool: frozenset({bool}),
                                      type(None): frozenset({type(None)})}


def _scalar_types(tp: Any) -> frozenset[type] | None:
    """The Python types a scalar (or scalar | None) annotation admits; None for others."""
    if tp in _TYPES:
        return _TYPES[tp]
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        parts = [_scalar_types(a) for a in typing.get_args(tp)]
        return frozenset().union(*parts) if all(parts) else None  # type: ignore[arg-type]
    return None


def _many(tp: Any, path: str) -> Callable[[Iterable[Any], str], list[Any]]:
    """Decoder of many values of one type: for scalars one C-speed type check of them all
    (a full snapshot holds ~10^5 log lines and histogram bins)."""
    if tp is Any:
        return lambda xs, p: list(xs)
    admitted = _scalar_types(tp)
    if admitted is not None:
        def check(xs: Iterable[Any], p: str) -> list[Any]:
            values = list(xs)
            odd = set(map(type, values)) - admitted
            if odd:
                _bad(p, f"expected {tp!r}, got {', '.join(sorted(t.__name__ for t in odd))}")
            return values

        return check
    _, dec = _codec(tp, path)
    return lambda xs, p: [dec(v, p) for v in xs]


def _int_keys(keys: list[str], path: str) -> list[int]:
    """JSON object keys written from ints ("3", "-1") back to ints; anything else is refused."""
    try:
        ints = list(map(int, keys))
    except ValueError:
        ints = []
    if list(map(str, ints)) != keys:
        _bad(path, "keys are not all integers")
    return ints


# ---------------------------------------------------------------------------- step records


_NAN = math.nan
_SWAP = sys.byteorder == "big"  # floats travel little-endian


def records_to_wire(records: Iterable[dict[str, float]]) -> dict[str, Any]:
    """Step records as columns: a key's values are a JSON list when all are integers (null:
    absent), else base64 of little-endian float64 (NaN: absent). Writing and reading a float
    as JSON text costs ~1 us, and a 64-rank window holds 200k of them; the binary column is
    ten times cheaper both ways. Records are finite numbers (the rank protocol checks), so NaN
    is free to mean "absent"; an int in a column that also holds floats comes back as the
    equal float."""
    recs = list(records)
    layouts = set(map(tuple, recs))  # the records' keys, in order
    keys = list(dict.fromkeys(itertools.chain.from_iterable(layouts)))
    if len(layouts) == 1:  # every record has the same keys: columns at C speed
        columns: Iterable[Any] = zip(*map(dict.values, recs), strict=True)
    else:
        columns = (list(map(dict.get, recs, itertools.repeat(key))) for key in keys)
    cols: list[Any] = []
    for key, values in zip(keys, columns):
        kinds = set(map(type, values))
        if kinds <= {int, type(None)}:
            cols.append(list(values))
            continue
        if type(None) in kinds:
            values = list(map(dict.get, recs, itertools.repeat(key), itertools.repeat(_NAN)))
        if not kinds <= {int, float, type(None)}:
            values = [v if type(v) is int or type(v) is float else _NAN for v in values]
        column = array.array("d", values)
        if _SWAP:
            column.byteswap()
        cols.append(base64.b64encode(column.tobytes()).decode("ascii"))
    return {"n": len(recs), "keys": keys, "cols": cols}


def records_from_wire(x: Any, path: str, maxlen: int) -> list[dict[str, float]]:
    if type(x) is not dict or x.keys() != {"n", "keys", "cols"}:
        _bad(path, "expected {n, keys, cols}")
    n, keys, cols = x["n"], x["keys"], x["cols"]
    if type(n) is not int or not 0 <= n <= maxlen:
        _bad(path, f"record count {n!r} not in 0..{maxlen}")
    if (type(keys) is not list or type(cols) is not list or len(keys) != len(cols)
            or len(keys) > MAX_RECORD_KEYS or len(set(keys)) != len(keys)
            or not all(type(k) is str and 0 < len(k) <= 64 for k in keys)):
        _bad(path, "bad record keys")
    columns: list[list[Any]] = []
    sparse = []  # keys some records lack
    for key, col in zip(keys, cols, strict=True):
        if type(col) is str:
            try:
                raw = base64.b64decode(col, validate=True)
            except (binascii.Error, ValueError):
                _bad(path, f"column {key!r} is not base64")
            if len(raw) != 8 * n:
                _bad(path, f"column {key!r} holds {len(raw)} bytes for {n} records")
            column = array.array("d")
            column.frombytes(raw)
            if _SWAP:
                column.byteswap()
            values: list[Any] = column.tolist()
            if math.inf in values or -math.inf in values:
                _bad(path, f"column {key!r} holds an infinite value")
            if any(map(math.isnan, values)):
                values = [None if v != v else v for v in values]
        elif type(col) is list and len(col) == n and set(map(type, col)) <= {int, type(None)}:
            values = col
        else:
            _bad(path, f"column {key!r} is neither integers nor base64 floats")
        if None in values:
            sparse.append(key)
        columns.append(values)
    records = [dict(zip(keys, row, strict=True)) for row in zip(*columns, strict=True)] if keys else [
        {} for _ in range(n)]
    for key in sparse:
        for rec in records:
            if rec[key] is None:
                del rec[key]
    return records


# ---------------------------------------------------------------------------- compiling the schema


_DESCRIBED: dict[type, str] = {}  # class -> its schema line (what SCHEMA digests)


def _codec(tp: Any, path: str) -> tuple[Enc, Dec]:
    """Encoder and decoder for one annotated type. The encoder is `_same` where json.dumps
    writes the value as it is (scalars, lists, tuples, dicts keyed by str or int), so the
    common case costs nothing to encode; decoders always check."""
    if tp in _SCALARS:
        return _same, _SCALARS[tp]
    if isinstance(tp, _Records):
        maxlen = tp.maxlen
        return records_to_wire, lambda x, p: collections.deque(records_from_wire(x, p, maxlen), maxlen=maxlen)
    if isinstance(tp, _Ring):
        return _ring(tp, path)
    if tp is Histogram:
        return _histogram_to_wire, _histogram_from_wire
    if dataclasses.is_dataclass(tp):
        return _dataclass(tp)
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        return _optional(tp, args, path)
    if origin is tuple:
        return _tuple(args, path)
    if origin is list:
        enc, _ = _codec(args[0], path)
        many = _many(args[0], path)

        def dec_list(x: Any, p: str) -> list[Any]:
            if type(x) is not list:
                _bad(p, "expected a list")
            return many(x, p)

        return (_same if enc is _same else lambda x: [enc(v) for v in x]), dec_list
    if origin in (dict, collections.Counter):
        return _dict(origin, args, path)
    raise TypeError(f"{path}: no wire form for {tp!r}")  # a schema bug: found at import


def _optional(tp: Any, args: tuple[Any, ...], path: str) -> tuple[Enc, Dec]:
    inner = [a for a in args if a is not type(None)]
    if len(inner) != 1 or len(args) != 2:
        raise TypeError(f"{path}: only X | None unions have a wire form, not {tp!r}")
    enc, dec = _codec(inner[0], path)
    return ((_same if enc is _same else lambda x: None if x is None else enc(x)),
            lambda x, p: None if x is None else dec(x, p))


def _tuple(args: tuple[Any, ...], path: str) -> tuple[Enc, Dec]:
    if len(args) == 2 and args[1] is Ellipsis:
        enc, _ = _codec(args[0], path)
        many = _many(args[0], path)

        def dec_var(x: Any, p: str) -> tuple[Any, ...]:
            if type(x) is not list:
                _bad(p, "expected a list")
            return tuple(many(x, p))

        return (_same if enc is _same else lambda x: [enc(v) for v in x]), dec_var
    codecs = [_codec(a, path) for a in args]

    def dec_fixed(x: Any, p: str) -> tuple[Any, ...]:
        if type(x) is not list or len(x) != len(codecs):
            _bad(p, f"expected a list of {len(codecs)}")
        return tuple(d(v, p) for (_, d), v in zip(codecs, x, strict=True))

    if all(e is _same for e, _ in codecs):
        return _same, dec_fixed
    return lambda x: [e(v) for (e, _), v in zip(codecs, x, strict=True)], dec_fixed


def _dict(origin: Any, args: tuple[Any, ...], path: str) -> tuple[Enc, Dec]:
    key_tp, value_tp = (args[0], int) if origin is collections.Counter else args
    enc, dec = _codec(value_tp, path)
    many = _many(value_tp, path)
    make = collections.Counter if origin is collections.Counter else dict
    if key_tp is str or key_tp is int:  # JSON object; json.dumps writes int keys as "3"
        def dec_obj(x: Any, p: str) -> dict[Any, Any]:
            if type(x) is not dict:
                _bad(p, "expected an object")
            keys = _int_keys(list(x), p) if key_tp is int else x.keys()
            return make(dict(zip(keys, many(x.values(), p), strict=True)))

        return (_same if enc is _same else lambda x: {k: enc(v) for k, v in x.items()}), dec_obj
    kenc, kdec = _codec(key_tp, path)  # other keys (rank pairs): a list of [key, value]

    def dec_pairs(x: Any, p: str) -> dict[Any, Any]:
        if type(x) is not list or not all(type(kv) is list and len(kv) == 2 for kv in x):
            _bad(p, "expected a list of [key, value]")
        return make({kdec(k, p): dec(v, p) for k, v in x})

    return lambda x: [[kenc(k), enc(v)] for k, v in x.items()], dec_pairs


def _ring(tp: _Ring, path: str) -> tuple[Enc, Dec]:
    enc, _ = _codec(tp.item, path)
    many = _many(tp.item, path)
    maxlen = tp.maxlen

    def dec_ring(x: Any, p: str) -> collections.deque[Any]:
        if type(x) is not list or len(x) > maxlen:
            _bad(p, f"expected a list of at most {maxlen}")
        return collections.deque(many(x, p), maxlen=maxlen)

    return (list if enc is _same else lambda x: [enc(v) for v in x]), dec_ring


def _histogram_to_wire(h: Histogram) -> dict[str, Any]:
    return {"n": h.n, "bins": list(h.counts), "counts": list(h.counts.values())}


def _histogram_from_wire(x: Any, path: str) -> Histogram:
    if type(x) is not dict or x.keys() != {"n", "bins", "counts"}:
        _bad(path, "expected {n, bins, counts}")
    bins, counts = x["bins"], x["counts"]
    if (type(bins) is not list or type(counts) is not list or len(bins) != len(counts)
            or not set(map(type, bins)) | set(map(type, counts)) <= {int}):
        _bad(path, "bins and counts are two lists of integers")
    if counts and min(counts) < 1 or type(x["n"]) is not int or x["n"] != sum(counts):
        _bad(path, "bin counts are positive and sum to n")
    h = Histogram()
    h.counts.update(dict(zip(bins, counts, strict=True)))
    if len(h.counts) != len(bins):
        _bad(path, "a bin twice")
    h.n = x["n"]
    return h


_DATACLASS: dict[type, tuple[Enc, Dec]] = {}
_FIELD_ENC: dict[tuple[type, str], Enc] = {}  # fields that need encoding: their encoder


def _dataclass(cls: type) -> tuple[Enc, Dec]:
    """A class as an object of its init fields; decoding wants exactly those fields."""
    if cls in _DATACLASS:
        return _DATACLASS[cls]
    if cls not in _CLASSES:
        raise TypeError(f"{cls.__name__} is not in the snapshot schema (_CLASSES)")
    hints = typing.get_type_hints(cls)
    fields = [f for f in dataclasses.fields(cls) if f.init]
    plain: list[str] = []
    special: list[tuple[str, Enc]] = []
    decs: list[tuple[str, frozenset[type] | None, Dec, str]] = []
    described = []
    for f in fields:
        tp = _PINNED.get((cls, f.name), hints[f.name])
        path = f"{cls.__name__}.{f.name}"
        enc, dec = _codec(tp, path)
        if (cls, f.name) in _BLANK:
            blank = _BLANK[(cls, f.name)]
            enc = lambda _x, blank=blank: blank  # noqa: E731
        (plain.append(f.name) if enc is _same else special.append((f.name, enc)))
        decs.append((f.name, _scalar_types(tp), dec, path))  # scalars: checked inline, not called
        described.append(f"{f.name}:{tp!r}")
    _DESCRIBED[cls] = f"{cls.__name__}({','.join(described)})"
    names = frozenset(f.name for f in fields)
    name = cls.__name__

    def enc_obj(obj: Any, instead: dict[str, Any] | None = None) -> dict[str, Any]:
        """`instead`: the wire form of some fields, written in place of obj's (a delta's parts)."""
        out = {n: getattr(obj, n) for n in plain}
        for n, enc in special:
            if not instead or n not in instead:
                out[n] = enc(getattr(obj, n))
        if instead:
            out.update(instead)
        return out

    def dec_obj(x: Any, path: str) -> Any:
        if type(x) is not dict:
            _bad(path, f"expected a {name} object")
        if x.keys() != names:
            odd = sorted(set(x) ^ names)
            _bad(path, f"{name} fields differ from this ddptop's: {', '.join(map(str, odd))[:200]}")
        if cls is RunState and not (type(x["world_size"]) is int and 0 <= x["world_size"] <= MAX_RANKS):
            _bad("RunState.world_size", f"not in 0..{MAX_RANKS}")  # before __post_init__ fills ranks
        kwargs = {}
        for n, admitted, dec, p in decs:
            value = x[n]
            kwargs[n] = value if admitted is not None and type(value) in admitted else dec(value, p)
        return cls(**kwargs)

    _DATACLASS[cls] = (enc_obj, dec_obj)
    _FIELD_ENC.update({(cls, n): enc for n, enc in special})
    return enc_obj, dec_obj


for _cls in _CLASSES:
    _dataclass(_cls)
# Bump the tags of the hand-written forms when they change; the classes describe themselves.
SCHEMA = hashlib.sha256("\n".join(["records:n,keys,cols(int list|f64le base64)", "histogram:n,bins,counts",
                                    *sorted(_DESCRIBED.values())]).encode()).hexdigest()[:12]
_RUN_ENC, _RUN_DEC = _DATACLASS[RunState]
_RANK_ENC, _ = _DATACLASS[RankState]
_CAPTURE_ENC, _CAPTURE_DEC = _DATACLASS[Capture]
_FENCE = (KeyError, TypeError, ValueError, AttributeError, IndexError, OverflowError, RecursionError)


# ---------------------------------------------------------------------------- snapshots


@dataclass(frozen=True, eq=False)  # hashed by identity: frames are built once per Marks
class Marks:
    """Where a state stood when a viewer's snapshot was taken, to send that viewer only what
    changed after it: per rank, its log's (length, first line, last line) identities and its
    step count; the newest entry of each ring in `_RINGS` (held, so its identity stays its own)."""

    logs: dict[int, tuple[int, int, int]]
    steps: dict[int, int]
    rings: dict[str, Any]


_RINGS = ("history", "gpu_history")  # RunState rings that only ever get entries appended


def _after(ring: collections.deque[Any], mark: Any) -> list[Any]:
    """The entries appended after `mark` (all of them when it has left the ring)."""
    for i in range(len(ring) - 1, -1, -1):
        if ring[i] is mark:
            return list(itertools.islice(ring, i + 1, None))
    return list(ring)


def _log_mark(lines: collections.deque[str]) -> tuple[int, int, int]:
    # a line appended moves the end (and, once the ring is full, the start) to a new object
    return (len(lines), id(lines[0]), id(lines[-1])) if lines else (0, 0, 0)


def marks(state: RunState) -> Marks:
    return Marks(logs={r: _log_mark(lines) for r, lines in state.logs.items()},
                 steps={r: rs.steps for r, rs in state.ranks.items()},
                 rings={name: ring[-1] if (ring := getattr(state, name)) else None for name in _RINGS})


def state_to_dict(state: RunState, since: Marks | None = None) -> dict[str, Any]:
    """The whole state as plain data, or with `since` (the marks of the snapshot the viewer
    holds) a delta: only the logs of ranks whose log changed, each rank's step records after
    those it had, and the GPU samples and throughput points after its last. These are most
    of a snapshot's bytes and numbers, and a live run adds few of them between two."""
    if since is None:
        return {"delta": False, "state": _RUN_ENC(state)}
    instead: dict[str, Any] = {
        "logs": {r: list(lines) for r, lines in state.logs.items() if since.logs.get(r) != _log_mark(lines)},
        "ranks": {r: _rank_delta(rs, since.steps.get(r)) for r, rs in state.ranks.items()},
    }
    for name in _RINGS:
        instead[name] = _FIELD_ENC[RunState, name](_after(getattr(state, name), since.rings.get(name)))
    return {"delta": True, "state": _RUN_ENC(state, instead)}


def _rank_delta(rs: RankState, had: int | None) -> dict[str, Any]:
    new = rs.steps - had if had is not None else -1
    if 0 <= new < len(rs.recent):  # only the records after `had` (else the whole window)
        return _RANK_ENC(rs, {"recent": records_to_wire(list(rs.recent)[len(rs.recent) - new:])})
    return _RANK_ENC(rs)


def state_from_dict(data: Any, base: RunState | None = None) -> RunState:
    """A state back from `state_to_dict`'s output. A delta completes `base`, the state the
    viewer built from the snapshots before it. Raises ViewerProtocolError, nothing else."""
    try:
        if type(data) is not dict or data.keys() != {"delta", "state"} or type(data["delta"]) is not bool:
            _bad("snapshot", "expected {delta, state}")
        state = _RUN_DEC(data["state"], "RunState")
        if data["delta"]:
            if base is None:
                _bad("snapshot", "a delta with nothing before it")
            _complete(state, base)
        return state
    except ViewerProtocolError:
        raise
    except _FENCE as exc:  # a second fence: what the checks above missed is still a bad snapshot
        raise ViewerProtocolError(f"bad snapshot: {type(exc).__name__}: {str(exc)[:200]}") from None


def _complete(state: RunState, base: RunState) -> None:
    """Put a delta's parts together with what the viewer had."""
    state.logs = {**base.logs, **state.logs}
    for name in _RINGS:
        ring = collections.deque(getattr(base, name), maxlen=getattr(state, name).maxlen)
        ring.extend(getattr(state, name))
        setattr(state, name, ring)
    for r, rs in state.ranks.items():
        carried = rs.recent
        if len(carried) == min(rs.steps, RECENT):
            continue  # the whole window
        old = base.ranks.get(r)
        have = old.steps if old is not None else 0
        first = rs.steps - len(carried)  # the number of the first record carried
        if first != have:
            _bad(f"RankState.recent of rank {r}", f"records {first}.. do not follow the {have} this viewer has")
        window = collections.deque(old.recent if old is not None else (), maxlen=RECENT)
        window.extend(carried)
        rs.recent = window


def capture_to_dict(cap: Capture) -> dict[str, Any]:
    return _CAPTURE_ENC(cap)


def capture_from_dict(data: Any) -> Capture:
    """Raises ViewerProtocolError, nothing else."""
    try:
        return _CAPTURE_DEC(data, "Capture")
    except ViewerProtocolError:
        raise
    except _FENCE as exc:
        raise ViewerProtocolError(f"bad capture: {type(exc).__name__}: {str(exc)[:200]}") from None
