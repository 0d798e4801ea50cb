"""One rank's trace, summarised once for every use: the summary (ddptop.analysis.trace_analysis)
with host- vs device-bound (ddptop.analysis.host_device) and a comm hook's own work
(ddptop.analysis.hook_work), and what the cross-rank view needs
from it (its collectives, ddptop.analysis.cross_rank), so a
capture's traces are parsed one at a time and only the small part is kept. Pure."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from ddptop.analysis.cross_rank import Collective, collectives, cross_rank
from ddptop.analysis.event_store import EventStore
from ddptop.analysis.hook_work import hook_work
from ddptop.analysis.host_device import host_or_device
from ddptop.analysis.plausibility import Cleaner, dropped_line
from ddptop.analysis.trace_analysis import activities, summarize, trace_events


@dataclass(frozen=True)
class RankTrace:
    summary: dict[str, Any]
    collectives: list[Collective]
    activities: int  # how many GPU activities (or CPU ops): a nearly empty trace has few


def rank_trace(trace: Any, top: int = 10) -> RankTrace:
    """ValueError when `trace` is not a Chrome trace."""
    events, meta = trace_events(trace)
    return rank_trace_of(events, meta, top)


def kept_events(events: Iterable[Any]) -> tuple[EventStore, dict[str, int]]:
    """The events worth summarising (ddptop.analysis.plausibility), those some analysis reads
    kept small (ddptop.analysis.event_store), and what was dropped: one pass, so `events` may be
    a stream."""
    cleaner, store = Cleaner(), EventStore()
    for e in events:
        if cleaner.keep(e) and e.get("ph") == "X":
            store.add(e)
    limit = cleaner.limit()
    if limit is not None:
        cleaner.counts["implausible"] = store.drop_ending_after(limit)
    return store, cleaner.dropped()


def rank_trace_of(events: Iterable[Any], meta: dict[str, Any] | None, top: int = 10) -> RankTrace:
    """One rank's trace from its events (a list, or a stream read from disk) and distributedInfo."""
    store, dropped = kept_events(events)
    acts, source = activities(store)
    summary = summarize(store, meta, acts, source, top)
    if dropped:  # bad values are counted and said, never silently left out
        summary["dropped"] = dropped
        summary["dropped_note"] = dropped_line(dropped)
    if source == "gpu":
        summary["bound"] = host_or_device(store, acts)
    hook = hook_work(store, acts, source)
    if hook is not None:  # communication under a comm hook: its collectives plus this
        summary["hook"] = hook
    return RankTrace(summary, collectives(acts, source), len(acts))


def capture_cross_rank(traces: dict[int, RankTrace]) -> dict[str, Any] | None:
    """The cross-rank view of ranks' traces of one window (None for fewer than two)."""
    if len(traces) < 2:
        return None
    source = "gpu" if any(t.summary.get("source") == "gpu" for t in traces.values()) else "cpu"
    return cross_rank({r: t.collectives for r, t in traces.items()},
                      {r: t.activities for r, t in traces.items()}, source)
