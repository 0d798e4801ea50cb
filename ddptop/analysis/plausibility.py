"""What a trace's events may be before they are summarised: complete events with a numeric,
finite, non-negative duration, once each, no longer than the window's steps. What is dropped
is counted and said in one line, never silently. Pure."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from ddptop.analysis.intervals import merge

STEP_NAMES = ("ddptop_step_", "ProfilerStep#")
GPU_CATS = frozenset({"kernel", "gpu_memcpy", "gpu_memset", "memcpy", "memset"})
SLACK = 1.5  # an activity may outlast the steps' span a little (queued work drains after the last step)
REASONS = {"not_number": "duration not a number", "not_finite": "duration NaN or infinite",
           "negative": "negative duration", "duplicate": "exact duplicate", "implausible": "longer than the steps"}


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


def clean(events: Sequence[Any]) -> tuple[list[Any], dict[str, int]]:
    """The events worth summarising and how many of each kind were dropped."""
    counts = dict.fromkeys(REASONS, 0)
    seen: set[tuple[Any, ...]] = set()
    kept: list[Any] = []
    for e in events:
        if not isinstance(e, dict):
            counts["not_number"] += 1
            continue
        if e.get("ph") == "X":
            _, why = _dur(e)
            if why:
                counts[why] += 1
                continue
        if e.get("ph") == "M":  # metadata (thread names, sort indexes): torch repeats some, harmlessly
            kept.append(e)
            continue
        try:
            key = _key(e)
            if key in seen:
                counts["duplicate"] += 1
                continue
            seen.add(key)
        except TypeError:  # unhashable values: kept, not deduplicated
            pass
        kept.append(e)
    steps = merge((e["ts"], e["ts"] + e["dur"]) for e in kept
                  if e.get("ph") == "X" and str(e.get("name", "")).startswith(STEP_NAMES))
    if steps:
        limit = SLACK * (steps[-1][1] - steps[0][0])
        before = len(kept)
        kept = [e for e in kept if not (e.get("ph") == "X" and str(e.get("cat", "")).lower() in GPU_CATS
                                        and e["dur"] > limit)]
        counts["implausible"] = before - len(kept)
    return kept, {k: v for k, v in counts.items() if v}


def dropped_line(counts: dict[str, int]) -> str | None:
    """One line on what was left out ("dropped 3 events: negative duration 1, exact duplicate 2")."""
    if not counts:
        return None
    parts = ", ".join(f"{REASONS[k]} {n}" for k, n in counts.items())
    return f"dropped {sum(counts.values())} events: {parts}"
