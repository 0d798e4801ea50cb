"""What a trace's events may be before they are summarised: complete events with a numeric,
finite, non-negative duration, once each, and GPU activities that end within reach of the rest
of the trace. What is dropped is counted and said in one line, never silently. Pure.

A GPU activity is bounded by the trace itself, never by the host's step ranges: a kernel runs
after the host range that launched it (a `ProfilerStep#6` of 20 us on the CPU launches 25 ms of
kernels; CUDA graphs replay whole steps from one host call), so a host step cannot bound a
kernel's duration (issue 45). The bound is the span of the trace's event starts (a start cannot
be stretched by a bogus duration): an activity that ends more than that span again, and more
than FLOOR_US, after the last start anywhere in the trace ran for longer than anything recorded
around it could allow (the hostile 1e12-us kernel).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

STEP_NAMES = ("ddptop_step_", "ProfilerStep#")
GPU_CATS = frozenset({"kernel", "gpu_memcpy", "gpu_memset", "memcpy", "memset"})
SLACK = 1.0  # an activity may end up to the trace's whole span after its last start...
FLOOR_US = 10e6  # ...and up to 10 s in any case (one long kernel in a short trace)
REASONS = {"not_number": "duration not a number", "not_finite": "duration NaN or infinite",
           "negative": "negative duration", "duplicate": "exact duplicate",
           "implausible": "ends far beyond the rest of the trace"}


def _dur(e: dict[str, Any]) -> tuple[float | None, str]:
    dur, ts = e.get("dur"), e.get("ts")
    for v in (dur, ts):
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            return None, "not_number"
        if not math.isfinite(v):
            return None, "not_finite"
    assert isinstance(dur, (int, float))
    return (float(dur), "") if dur >= 0 else (None, "negative")


def _key(e: dict[str, Any]) -> tuple[Any, ...]:
    raw = e.get("args")
    args: dict[str, Any] = raw if isinstance(raw, dict) else {}
    return (e.get("ph"), e.get("cat"), e.get("name"), e.get("pid"), e.get("tid"), e.get("ts"), e.get("dur"),
            args.get("correlation"), args.get("External id"), args.get("stream"), len(args))


class Cleaner:
    """The checks one event at a time (a trace streamed from disk): `keep` says whether an event
    is worth summarising; `limit` is then the longest a GPU activity may be (None without step
    markers), `dropped` what was left out. Duplicates are remembered by their key's hash (8 bytes
    an event, not the event)."""

    def __init__(self) -> None:
        self.counts = dict.fromkeys(REASONS, 0)
        self._seen: set[int] = set()
        self._first = math.inf  # the earliest and latest start of any complete event
        self._last = -math.inf

    def keep(self, e: Any) -> bool:
        if not isinstance(e, dict):
            self.counts["not_number"] += 1
            return False
        complete = e.get("ph") == "X"
        if complete:
            _, why = _dur(e)
            if why:
                self.counts[why] += 1
                return False
        elif e.get("ph") == "M":  # metadata (thread names, sort indexes): torch repeats some, harmlessly
            return True
        try:
            key = hash(_key(e))
            if key in self._seen:
                self.counts["duplicate"] += 1
                return False
            self._seen.add(key)
        except TypeError:  # unhashable values: kept, not deduplicated
            pass
        if complete:
            self._first = min(self._first, e["ts"])
            self._last = max(self._last, e["ts"])
        return True

    def limit(self) -> float | None:
        """The latest a GPU activity may end (us, the trace's clock); None with no events."""
        if self._last < self._first:
            return None
        return self._last + max(SLACK * (self._last - self._first), FLOOR_US)

    def dropped(self) -> dict[str, int]:
        return {k: v for k, v in self.counts.items() if v}


def implausible(e: dict[str, Any], limit: float) -> bool:
    """A GPU activity that ends after `limit` (Cleaner.limit)."""
    return e.get("ph") == "X" and str(e.get("cat", "")).lower() in GPU_CATS and e["ts"] + e["dur"] > limit


def clean(events: Sequence[Any]) -> tuple[list[Any], dict[str, int]]:
    """The events worth summarising and how many of each kind were dropped."""
    cleaner = Cleaner()
    kept = [e for e in events if cleaner.keep(e)]
    limit = cleaner.limit()
    if limit is not None:
        before = len(kept)
        kept = [e for e in kept if not implausible(e, limit)]
        cleaner.counts["implausible"] = before - len(kept)
    return kept, cleaner.dropped()


def dropped_line(counts: dict[str, int]) -> str | None:
    """One line on what was left out ("dropped 3 events: negative duration 1, exact duplicate 2")."""
    if not counts:
        return None
    parts = ", ".join(f"{REASONS[k]} {n}" for k, n in counts.items())
    return f"dropped {sum(counts.values())} events: {parts}"
