"""The viewer wire format between a supervisor and its viewers (TUIs attached to
a run): versioned NDJSON commands up, framed snapshots down. Pure: no I/O.

Viewer -> supervisor, one JSON object per line:
    {"v": 1, "kind": "hello", "token": T, "owner": bool}   first, or the connection is refused
    {"kind": "stop", "reason": R}
    {"kind": "capture", "count": N, "id": I}                answered by "captured" with the same id
    {"kind": "detach"}                                      answered by "detached"
Supervisor -> viewer, a JSON header line, then `size` bytes of payload when size > 0:
    {"v": 1, "kind": "welcome", "run_id": R, "owner": bool, "detached": bool}
    {"kind": "refused", "reason": R}                        then the connection closes
    {"kind": "state", "size": N, "final": bool, "logs": L}  + the whole RunState, pickled; with
                                                            L "changed" its logs hold only the ranks
                                                            whose log changed since the last one
    {"kind": "captured", "id": I, "size": N, "error": E}    + the Capture, pickled (size 0 on error)
    {"kind": "detached"}

Why pickle for the state: RunState is a tree of dataclasses, deques, counters and
histograms (Hello, GpuSample, NcclReport, TopologyMatrix, Advice, Capture, Stall...)
that the views read as objects; a pickle carries it whole, so a viewer shows exactly
what an in-process session would, history included, without a second schema to keep
in step with every field. It is acceptable only because of who can speak on this
socket: it lives in a 0700 directory of the same uid (checked by the viewer before
connecting), so only that user's own supervisor can send to a viewer, and the
supervisor never unpickles anything (viewers send JSON only). The loader still
resolves nothing but ddptop classes and a few containers, as a second fence.
"""

from __future__ import annotations

import collections
import importlib
import io
import json
import pickle
from typing import Any

VERSION = 1
MAX_LINE = 1 << 16  # a command or a header; payloads are counted separately
MAX_PAYLOAD = 1 << 30
COMMANDS = ("stop", "capture", "detach")

_SAFE_GLOBALS = {
    ("collections", "deque"): collections.deque,
    ("collections", "Counter"): collections.Counter,
    ("collections", "OrderedDict"): collections.OrderedDict,
    ("collections", "defaultdict"): collections.defaultdict,
    ("builtins", "set"): set,
    ("builtins", "frozenset"): frozenset,
    ("builtins", "complex"): complex,
}


class ViewerProtocolError(ValueError):
    """A line or frame that does not follow this protocol; `reason` is short."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def encode(kind: str, **fields: Any) -> bytes:
    """One JSON line (a command, or a header without payload)."""
    return json.dumps({"v": VERSION, "kind": kind, **fields}, separators=(",", ":")).encode() + b"\n"


def decode(line: bytes) -> dict[str, Any]:
    """One line back into a dict with at least `kind`; ViewerProtocolError otherwise."""
    if len(line) > MAX_LINE:
        raise ViewerProtocolError("oversized")
    try:
        msg = json.loads(line)
    except (ValueError, UnicodeDecodeError):
        raise ViewerProtocolError("not-json") from None
    if not isinstance(msg, dict) or not isinstance(msg.get("kind"), str):
        raise ViewerProtocolError("no-kind")
    if msg.get("v", VERSION) != VERSION:
        raise ViewerProtocolError(f"version {msg.get('v')} (this ddptop speaks {VERSION})")
    return msg


def frame(kind: str, payload: bytes = b"", **fields: Any) -> bytes:
    """A header line and its payload, as one buffer (written in one call, so frames
    to one viewer never interleave)."""
    return encode(kind, size=len(payload), **fields) + payload


def dump(obj: Any) -> bytes:
    return pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)


class _Loader(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in _SAFE_GLOBALS:
            return _SAFE_GLOBALS[(module, name)]
        if module == "ddptop" or module.startswith("ddptop."):
            obj = getattr(importlib.import_module(module), name, None)
            if isinstance(obj, type):  # classes only: no function can be called on load
                return obj
        raise pickle.UnpicklingError(f"refusing to load {module}.{name}")


def load(payload: bytes) -> Any:
    try:
        return _Loader(io.BytesIO(payload)).load()
    except (pickle.UnpicklingError, EOFError, AttributeError, ImportError, TypeError, ValueError) as exc:
        raise ViewerProtocolError(f"bad payload: {exc}") from None
