"""The snapshot schema, compiled once at import: an encoder and a checking decoder for each
class a RunState holds (`_CLASSES`), each field by its annotated type (fields typed `Any` are
pinned in `_PINNED`), and `SCHEMA`, a digest of the whole. Pure: no I/O."""

from __future__ import annotations

import collections
import dataclasses
import hashlib
import types
import typing
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from ddptop.analysis.advice import Advice
from ddptop.analysis.capture import Capture
from ddptop.analysis.nccl import (
    CollectiveStat,
    Communicator,
    NcclReport,
    RankInfo,
    Transport,
    TreeNode,
)
from ddptop.hw.samples import GpuProcess, GpuSample, GpuStat
from ddptop.hw.topology import TopologyMatrix, TopoReading
from ddptop.model.config import ConfigError, RunConfig, validate
from ddptop.model.cost import ArmCost, Estimate, RunCost
from ddptop.model.state import LOG_LINES, RECENT, Histogram, RankState, RunState, Stall
from ddptop.model.straggler import Finding, Verdict
from ddptop.viewer_wire.decode_checks import SCALARS, Dec, bad, int_keys, scalar_types
from ddptop.viewer_wire.step_records import records_from_wire, records_to_wire
from ddptop.wire.protocol import Hello

MAX_RANKS = 1 << 16  # RunState builds a RankState per rank of world_size: bound it first

Enc = Callable[[Any], Any]
ObjEnc = Callable[..., dict[str, Any]]  # a class's encoder: (obj, instead=None) -> its fields


def _same(value: Any) -> Any:
    return value


@dataclass(frozen=True)
class _Ring:
    """A deque of `item` holding at most `maxlen` (pinned where the annotation cannot say)."""

    item: Any
    maxlen: int


@dataclass(frozen=True)
class _Plain:
    """A JSON object or null, kept as it came (a TypedDict whose values are free JSON): json.loads
    made nothing but plain data."""


@dataclass(frozen=True)
class _Records:
    """RankState.recent: step records (str -> int | float), sent as columns (see records_to_wire)."""

    maxlen: int


def _ring_maxlen(cls: Any, name: str) -> int:
    """The maxlen of the deque a dataclass field's default factory makes."""
    factory = {f.name: f for f in dataclasses.fields(cls)}[name].default_factory
    if not callable(factory):
        raise TypeError(f"{cls.__name__}.{name} has no default factory")
    return factory().maxlen


# Fields typed Any (or too loosely) in their classes, and what they hold.
_PINNED: dict[tuple[type, str], Any] = {
    (RankState, "recent"): _Records(RECENT),
    (RunState, "logs"): types.GenericAlias(dict, (int, _Ring(str, LOG_LINES))),  # dict[int, _Ring(...)]
    (RunState, "gpu"): GpuSample | None,
    (RunState, "gpu_history"): _Ring(GpuSample, _ring_maxlen(RunState, "gpu_history")),
    (RunState, "history"): _Ring(tuple[float, float], _ring_maxlen(RunState, "history")),
    (RunState, "proc_history"): _Ring(dict[int, tuple[float, int]], _ring_maxlen(RunState, "proc_history")),
    (RunState, "nccl"): NcclReport | None,
    (RunState, "topology"): TopologyMatrix | None,
    (RunState, "advice"): Advice | None,
    (RunState, "captures"): dict[int, Capture],
    (RunState, "nsys"): _Plain(),  # a TypedDict (model.plain_data.NsysReport) of free JSON
}
# What a viewer has no use for and should not hold: a rank's hub token.
_BLANK: dict[tuple[type, str], Any] = {(Hello, "token"): ""}

_CLASSES = (RunState, RunConfig, RankState, Hello, Stall, Verdict, Finding, Capture, GpuSample, GpuStat, GpuProcess, TopologyMatrix,
            TopoReading, NcclReport, Communicator, RankInfo, Transport, TreeNode, CollectiveStat, Advice,
            RunCost, ArmCost, Estimate)


def _many(tp: Any, path: str) -> Callable[[Iterable[Any], str], list[Any]]:
    """Decoder of many values of one type: for scalars one C-speed type check of them all
    (a full snapshot holds ~10^5 log lines and histogram bins)."""
    if tp is Any:
        return lambda xs, p: list(xs)
    admitted = scalar_types(tp)
    if admitted is not None:
        def check(xs: Iterable[Any], p: str) -> list[Any]:
            values = list(xs)
            odd = set(map(type, values)) - admitted
            if odd:
                bad(p, f"expected {tp!r}, got {', '.join(sorted(t.__name__ for t in odd))}")
            return values

        return check
    _, dec = _codec(tp, path)
    return lambda xs, p: [dec(v, p) for v in xs]


_DESCRIBED: dict[type, str] = {}  # class -> its schema line (what SCHEMA digests)


def _codec(tp: Any, path: str) -> tuple[Enc, Dec]:
    """Encoder and decoder for one annotated type. The encoder is `_same` where json.dumps
    writes the value as it is (scalars, lists, tuples, dicts keyed by str or int), so the
    common case costs nothing to encode; decoders always check."""
    if tp in SCALARS:
        return _same, SCALARS[tp]
    if isinstance(tp, _Records):
        maxlen = tp.maxlen
        return records_to_wire, lambda x, p: collections.deque(records_from_wire(x, p, maxlen), maxlen=maxlen)
    if isinstance(tp, _Ring):
        return _ring(tp, path)
    if isinstance(tp, _Plain):
        return _same, _plain_from_wire
    if tp is RunConfig:  # checked field by field, then as a run's config is (validate)
        return _config_codec()
    admitted = scalar_types(tp)
    if admitted is not None:  # a union of scalars: a rank's facts (str | int | float | bool), int | None...
        return _same, _scalars(tp, admitted)
    if tp is Histogram:
        return _histogram_to_wire, _histogram_from_wire
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
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
                bad(p, "expected a list")
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
                bad(p, "expected a list")
            return tuple(many(x, p))

        return (_same if enc is _same else lambda x: [enc(v) for v in x]), dec_var
    codecs = [_codec(a, path) for a in args]

    def dec_fixed(x: Any, p: str) -> tuple[Any, ...]:
        if type(x) is not list or len(x) != len(codecs):
            bad(p, f"expected a list of {len(codecs)}")
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
                bad(p, "expected an object")
            keys = int_keys(list(x), p) if key_tp is int else x.keys()
            return make(dict(zip(keys, many(x.values(), p), strict=True)))

        return (_same if enc is _same else lambda x: {k: enc(v) for k, v in x.items()}), dec_obj
    kenc, kdec = _codec(key_tp, path)  # other keys (rank pairs): a list of [key, value]

    def dec_pairs(x: Any, p: str) -> dict[Any, Any]:
        if type(x) is not list or not all(type(kv) is list and len(kv) == 2 for kv in x):
            bad(p, "expected a list of [key, value]")
        return make({kdec(k, p): dec(v, p) for k, v in x})

    return lambda x: [[kenc(k), enc(v)] for k, v in x.items()], dec_pairs


def _ring(tp: _Ring, path: str) -> tuple[Enc, Dec]:
    enc, _ = _codec(tp.item, path)
    many = _many(tp.item, path)
    maxlen = tp.maxlen

    def dec_ring(x: Any, p: str) -> collections.deque[Any]:
        if type(x) is not list or len(x) > maxlen:
            bad(p, f"expected a list of at most {maxlen}")
        return collections.deque(many(x, p), maxlen=maxlen)

    return (list if enc is _same else lambda x: [enc(v) for v in x]), dec_ring


def _plain_from_wire(x: Any, path: str) -> dict[str, Any] | None:
    if x is not None and (type(x) is not dict):
        bad(path, "expected an object or null")
    return x


def _scalars(tp: Any, admitted: frozenset[type]) -> Dec:
    def dec(x: Any, path: str) -> Any:
        if type(x) not in admitted:
            bad(path, f"expected {tp!r}, got {type(x).__name__}")
        return x

    return dec


def _config_codec() -> tuple[Enc, Dec]:
    enc, dec_fields = _dataclass(RunConfig)

    def dec(x: Any, path: str) -> RunConfig:
        try:
            return validate(dec_fields(x, path))
        except ConfigError as e:
            bad(path, str(e))

    return enc, dec


def _histogram_to_wire(h: Histogram) -> dict[str, Any]:
    return {"n": h.n, "bins": list(h.counts), "counts": list(h.counts.values())}


def _histogram_from_wire(x: Any, path: str) -> Histogram:
    if type(x) is not dict or x.keys() != {"n", "bins", "counts"}:
        bad(path, "expected {n, bins, counts}")
    bins, counts = x["bins"], x["counts"]
    if (type(bins) is not list or type(counts) is not list or len(bins) != len(counts)
            or not set(map(type, bins)) | set(map(type, counts)) <= {int}):
        bad(path, "bins and counts are two lists of integers")
    if counts and min(counts) < 1 or type(x["n"]) is not int or x["n"] != sum(counts):
        bad(path, "bin counts are positive and sum to n")
    h = Histogram()
    h.counts.update(dict(zip(bins, counts, strict=True)))
    if len(h.counts) != len(bins):
        bad(path, "a bin twice")
    h.n = x["n"]
    return h


_DATACLASS: dict[type, tuple[ObjEnc, Dec]] = {}
_FIELD_ENC: dict[tuple[type, str], Enc] = {}  # fields that need encoding: their encoder


def _dataclass(cls: type) -> tuple[ObjEnc, Dec]:
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
            enc = _constant(_BLANK[(cls, f.name)])
        (plain.append(f.name) if enc is _same else special.append((f.name, enc)))
        decs.append((f.name, scalar_types(tp), dec, path))  # scalars: checked inline, not called
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
            bad(path, f"expected a {name} object")
        if x.keys() != names:
            odd = sorted(set(x) ^ names)
            bad(path, f"{name} fields differ from this ddptop's: {', '.join(map(str, odd))[:200]}")
        if cls is RunState and not (type(x["world_size"]) is int and 0 <= x["world_size"] <= MAX_RANKS):
            bad("RunState.world_size", f"not in 0..{MAX_RANKS}")  # before __post_init__ fills ranks
        kwargs = {}
        for n, admitted, dec, p in decs:
            value = x[n]
            kwargs[n] = value if admitted is not None and type(value) in admitted else dec(value, p)
        return cls(**kwargs)

    _DATACLASS[cls] = (enc_obj, dec_obj)
    _FIELD_ENC.update({(cls, n): enc for n, enc in special})
    return enc_obj, dec_obj


def _constant(value: Any) -> Enc:
    return lambda _x: value


for _cls in _CLASSES:
    _dataclass(_cls)
# Bump the tags of the hand-written forms when they change; the classes describe themselves.
SCHEMA = hashlib.sha256("\n".join(["records:n,keys,cols(int list|f64le base64)", "histogram:n,bins,counts",
                                    *sorted(_DESCRIBED.values())]).encode()).hexdigest()[:12]


def codec_of(cls: type) -> tuple[ObjEnc, Dec]:
    """The encoder and decoder of a schema class."""
    return _DATACLASS[cls]


def field_encoder(cls: type, name: str) -> Enc:
    """The encoder of one field that json.dumps cannot write as it is."""
    return _FIELD_ENC[cls, name]
