"""A run's state as plain JSON data for viewers: RunState and what hangs off it (ranks,
histograms, hellos, stalls, captures, GPU samples, topology, NCCL report, advice) to
dicts of plain fields and back, whole or as a delta from what a viewer holds. Pure: no I/O;
depends only on the data classes of model/, analysis/ and hw/ (and wire/protocol's Hello).

The schema is explicit and closed (ddptop.viewer_wire.schema): each class field encoded by its
annotated type. Decoding checks every value against that schema and can only build those
classes from plain values, so a snapshot cannot run code; a value that does not fit raises
ViewerProtocolError naming the field, never anything else. `SCHEMA` is a digest of
the whole schema: the viewer handshake compares it, so a viewer and a supervisor of
different ddptop versions refuse each other instead of misreading fields.
"""

from __future__ import annotations

import collections
import itertools
from dataclasses import dataclass
from typing import Any

from ddptop.analysis.capture import Capture
from ddptop.model.state import RECENT, RankState, RunState
from ddptop.viewer_wire.decode_checks import ViewerProtocolError, bad
from ddptop.viewer_wire.schema import SCHEMA, codec_of, field_encoder
from ddptop.viewer_wire.step_records import records_from_wire, records_to_wire

__all__ = ["SCHEMA", "Marks", "ViewerProtocolError", "capture_from_dict", "capture_to_dict", "marks",
           "records_from_wire", "records_to_wire", "state_from_dict", "state_to_dict"]

_RUN_ENC, _RUN_DEC = codec_of(RunState)
_RANK_ENC, _ = codec_of(RankState)
_CAPTURE_ENC, _CAPTURE_DEC = codec_of(Capture)
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


_RINGS = ("history", "gpu_history", "proc_history")  # RunState rings that only ever get entries appended


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
        instead[name] = field_encoder(RunState, name)(_after(getattr(state, name), since.rings.get(name)))
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
            bad("snapshot", "expected {delta, state}")
        state = _RUN_DEC(data["state"], "RunState")
        if data["delta"]:
            if base is None:
                bad("snapshot", "a delta with nothing before it")
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
            bad(f"RankState.recent of rank {r}", f"records {first}.. do not follow the {have} this viewer has")
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
