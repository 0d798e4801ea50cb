"""The viewer wire format between a supervisor and its viewers (TUIs attached to a
run): JSON command lines up, framed JSON snapshots down. Pure: no I/O.

Viewer -> supervisor, one JSON object per line:
    {"v": 2, "schema": S, "kind": "hello", "token": T, "owner": bool}   first, or refused
                                                          (optional "viewer": K, its kind, for the run's log)
    {"v": 2, "kind": "stop", "reason": R}
    {"v": 2, "kind": "capture", "count": N, "id": I}      answered by "captured" with the same id
    {"v": 2, "kind": "detach"}                            answered by "detached"
    {"v": 2, "kind": "crashed", "reason": R}              the owner viewer fails (not a quit): its run
                                                          goes on, detached (no answer)
    {"v": 2, "kind": "restart", "reason": R, "id": I}     answered by "restarting" with the same id:
                                                          granted (error "": the run stops, this viewer
                                                          starts the next) or not (one at a time)
Supervisor -> viewer, a JSON header line, then `size` bytes of payload when size > 0:
    {"v": 2, "schema": S, "kind": "welcome", "run_id": R, "owner": bool, "detached": bool}
    {"kind": "refused", "reason": R}                      then the connection closes
    {"v": 2, "kind": "state", "size": N, "final": bool}   + the RunState (state_codec.state_to_dict):
                                                          whole, or what changed since this viewer's last
    {"v": 2, "kind": "captured", "id": I, "size": N, "error": E}   + the Capture (size 0 on error)
    {"v": 2, "kind": "detached"}
    {"v": 2, "kind": "restarting", "id": I, "error": E}

Payloads are JSON of plain fields, in the explicit schema of ddptop.viewer_wire.state_codec: nothing
in a frame names a class or a function, so no frame can run code on either side. The
hello and the welcome carry the protocol version and the schema's digest; a side that
sees another refuses with one line, so a run started by one ddptop version is never
misread by another. `refused` carries no version, so that any viewer, older or newer,
can read why it was turned away.
"""

from __future__ import annotations

import json
from typing import Any

from ddptop.analysis.capture import Capture
from ddptop.model.state import RunState
from ddptop.viewer_wire.state_codec import (
    SCHEMA,
    Marks,
    ViewerProtocolError,
    capture_from_dict,
    capture_to_dict,
    state_from_dict,
    state_to_dict,
)

__all__ = ["VERSION", "SCHEMA", "ViewerProtocolError", "encode", "decode", "frame", "mismatch",
           "dump_state", "load_state", "dump_capture", "load_capture"]

VERSION = 2  # 1: pickled snapshots (ddptop before the JSON schema)
MAX_LINE = 1 << 16  # a command or a header; payloads are counted separately
MAX_PAYLOAD = 1 << 30
COMMANDS = ("stop", "capture", "detach", "restart", "crashed")
HANDSHAKE = ("hello", "welcome")  # the lines that carry the version and the schema


def encode(kind: str, **fields: Any) -> bytes:
    """One JSON line (a command, or a header without payload)."""
    head: dict[str, Any] = {"kind": kind} if kind == "refused" else {"v": VERSION, "kind": kind}
    if kind in HANDSHAKE:
        head["schema"] = SCHEMA
    return _json({**head, **fields}) + b"\n"


def decode(line: bytes) -> dict[str, Any]:
    """One line back into a dict with at least `kind`; ViewerProtocolError otherwise.
    Versions are compared at the handshake (see `mismatch`), not here: a `refused` line of
    any version must still be read."""
    if len(line) > MAX_LINE:
        raise ViewerProtocolError("oversized")
    try:
        msg = json.loads(line)
    except (ValueError, RecursionError):  # UnicodeDecodeError is a ValueError
        raise ViewerProtocolError("not-json") from None
    if not isinstance(msg, dict) or not isinstance(msg.get("kind"), str):
        raise ViewerProtocolError("no-kind")
    return msg


def mismatch(msg: dict[str, Any]) -> str:
    """'' when a hello or a welcome speaks this protocol, else why not (one line)."""
    if msg.get("v") == VERSION and msg.get("schema") == SCHEMA:
        return ""
    theirs = f"{str(msg.get('v', 1))[:8]}/{str(msg.get('schema', '-'))[:16]}"  # no schema: protocol 1
    return (f"viewer protocol {theirs} is not this ddptop's {VERSION}/{SCHEMA}: "
            "use the same ddptop version for the run and its viewers")


def frame(kind: str, payload: bytes = b"", **fields: Any) -> bytes:
    """A header line and its payload, as one buffer (written in one call, so frames
    to one viewer never interleave)."""
    return encode(kind, size=len(payload), **fields) + payload


def _json(obj: Any) -> bytes:
    # ASCII: a log line's stray surrogates travel escaped instead of failing to encode
    return json.dumps(obj, separators=(",", ":")).encode()


def _load_json(payload: bytes) -> Any:
    try:
        return json.loads(payload)
    except (ValueError, RecursionError):
        raise ViewerProtocolError("bad payload: not JSON") from None


def dump_state(state: RunState, since: Marks | None = None) -> bytes:
    """A snapshot's payload: the whole state, or what changed after `since` (see state_to_dict)."""
    return _json(state_to_dict(state, since))


def load_state(payload: bytes, base: RunState | None = None) -> RunState:
    return state_from_dict(_load_json(payload), base)


def dump_capture(cap: Capture) -> bytes:
    return _json(capture_to_dict(cap))


def load_capture(payload: bytes) -> Capture:
    return capture_from_dict(_load_json(payload))
