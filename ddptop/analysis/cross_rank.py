"""Who waits for whom in one capture window: every rank's collectives matched across ranks
and aligned on their common end (an NCCL collective ends on every rank within a few us of the
others; a gloo one within a millisecond or so), so each rank's collective time splits into
*waiting for peers* (its start until the latest peer's start) and *transfer* (the rest), and
the rank that started last is named, per collective and over the window. Aligning each
collective on its own end needs no common clock: ranks on different hosts compare as well.

Pure: takes each rank's activities (ddptop.analysis.trace_analysis), returns JSON-ready data."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from statistics import median
from typing import Any

from ddptop.analysis.trace_analysis import Activity
from ddptop.model.figures.stats import percent

LATE_US = 50.0  # a collective whose ranks start within this of each other has no late rank
NEARLY_EMPTY = 0.1  # a rank with fewer activities than this share of the busiest rank's
SHOWN = 64  # collectives listed one by one (the window's totals count them all)
BACKEND_OPS = ("gloo:", "mpi:", "ucc:", "xccl:")  # a CPU trace's collective, as its backend runs it


@dataclass(frozen=True)
class Collective:
    key: str  # what must agree across ranks: process group / collective, or the op's name
    start: float  # us, this rank's clock
    end: float

    @property
    def dur(self) -> float:
        return self.end - self.start


def collectives(acts: Sequence[Activity], source: str) -> list[Collective]:
    """One rank's collectives in start order. On a GPU, the communication kernels (those
    named by their args when any are); on a CPU trace, the backend's own ops (`gloo:*`),
    else what names a collective (record_param_comms), else the `c10d::*` calls."""
    comm = [a for a in acts if a.kind == "comm"]
    if source == "gpu":
        named = [a for a in comm if a.group]
        picked = named or comm
    else:
        picked = ([a for a in comm if a.name.startswith(BACKEND_OPS)]
                  or [a for a in comm if a.comm_by == "args"] or comm)
    return [Collective(a.group or a.name, a.start, a.end) for a in sorted(picked, key=lambda a: a.start)]


def match(per_rank: Mapping[int, Sequence[Collective]]) -> tuple[list[dict[int, Collective]], int]:
    """The collectives every rank has, matched in order per key (every rank issues a group's
    collectives in the same order); where a rank's window holds more of them (it started
    recording earlier), the shift whose durations' ends agree best. Also how many were left
    unmatched on any rank."""
    ranks = sorted(per_rank)
    by_key: dict[int, dict[str, list[Collective]]] = {r: defaultdict(list) for r in ranks}
    for r in ranks:
        for c in per_rank[r]:
            by_key[r][c.key].append(c)
    keys = set.intersection(*(set(by_key[r]) for r in ranks)) if ranks else set()
    matched: list[dict[int, Collective]] = []
    unmatched = sum(len(per_rank[r]) for r in ranks)
    for key in keys:
        lists = {r: by_key[r][key] for r in ranks}
        n = min(len(v) for v in lists.values())
        ref = lists[min(ranks, key=lambda r: len(lists[r]))]
        shifts = {r: _best_shift(ref, v, n) for r, v in lists.items()}
        for i in range(n):
            matched.append({r: lists[r][i + shifts[r]] for r in ranks})
        unmatched -= n * len(ranks)
    matched.sort(key=lambda m: min(c.end for c in m.values()))
    return matched, unmatched


def _best_shift(ref: Sequence[Collective], other: Sequence[Collective], n: int) -> int:
    """Offset into `other` of its first match with ref[0..n): the one whose end gaps vary least."""
    if len(other) == n:
        return 0

    def spread(k: int) -> float:
        gaps = [other[i + k].end - ref[i].end for i in range(n)]
        mid = median(gaps)
        return sum(abs(g - mid) for g in gaps)

    return min(range(len(other) - n + 1), key=spread)


def cross_rank(per_rank: Mapping[int, Sequence[Collective]], activity_counts: Mapping[int, int],
               source: str = "gpu") -> dict[str, Any]:
    """The capture's cross-rank view: per rank, waiting vs transfer (ms); per collective, the
    late rank and by how much; over the window, the rank that held the others up most and
    the verdict in one line; notes on ranks whose trace is nearly empty."""
    out: dict[str, Any] = {"aligned_on": "the ends of the NCCL kernels" if source == "gpu"
                           else "the ends of the backend's collective ops (gloo:*)"}
    notes = _empty_notes(activity_counts, per_rank)
    if notes:
        out["notes"] = notes
    if len(per_rank) < 2:
        out["verdict"] = "one rank: nobody to wait for"
        return out
    matched, unmatched = match(per_rank)
    out.update({"collectives": len(matched), "unmatched": unmatched})
    if not matched:
        out["verdict"] = "no collective found on every rank: cannot say who waits for whom"
        return out
    ranks = sorted(per_rank)
    wait = dict.fromkeys(ranks, 0.0)
    total = dict.fromkeys(ranks, 0.0)
    held = dict.fromkeys(ranks, 0.0)
    times_late = dict.fromkeys(ranks, 0)
    rows: list[dict[str, Any]] = []
    for m in matched:
        transfer = min(c.dur for c in m.values())  # the last to start waited for nobody
        for r, c in m.items():
            wait[r] += c.dur - transfer
            total[r] += c.dur
        late_us = max(c.dur for c in m.values()) - transfer
        late = min(m, key=lambda r: (m[r].dur, r)) if late_us >= LATE_US else None
        if late is not None:
            held[late] += late_us
            times_late[late] += 1
        rows.append({"key": next(iter(m.values())).key, "late_rank": late, "late_ms": _ms(late_us),
                     "transfer_ms": _ms(transfer), "start_offsets_ms": {str(r): _ms(c.dur - transfer)
                                                                       for r, c in m.items()}})
    out["ranks"] = {str(r): {"comm_ms": _ms(total[r]), "wait_ms": _ms(wait[r]),
                             "transfer_ms": _ms(total[r] - wait[r]), "wait_pct": percent(wait[r], total[r]),
                             "late_in": times_late[r], "held_others_ms": _ms(held[r])} for r in ranks}
    out["end_spread_us"] = _end_spread(matched)
    out["per_collective"] = rows[:SHOWN]
    worst = max(ranks, key=lambda r: (held[r], -r))
    if held[worst] > 0:
        biggest = max(row["late_ms"] for row in rows if row["late_rank"] == worst)
        out.update({"late_rank": worst, "late_ms": _ms(held[worst]), "late_max_ms": biggest})
        out["verdict"] = (f"rank {worst} is late: its peers wait {held[worst] / 1000:.1f} ms for it "
                          f"({times_late[worst]} of {len(matched)} collectives, up to {biggest:.1f} ms)")
    else:
        out["late_rank"] = None
        out["verdict"] = f"no rank late: every collective's ranks start within {LATE_US:.0f} us"
    return out


def _empty_notes(counts: Mapping[int, int], per_rank: Mapping[int, Sequence[Collective]]) -> list[str]:
    most = max(counts.values(), default=0)
    out = []
    for r in sorted(counts):
        if most and counts[r] < NEARLY_EMPTY * most:
            out.append(f"rank {r}'s trace is nearly empty: {counts[r]} GPU/CPU activities against "
                       f"{most} on the busiest rank ({len(per_rank.get(r, ()))} collectives)")
    return out


def _end_spread(matched: Sequence[Mapping[int, Collective]]) -> float:
    """How well the ends agree once each rank's clock offset (the median end gap to the first
    rank) is taken out: the largest remaining gap, us (NCCL: a few us; more means the
    match or the alignment is doubtful)."""
    ranks = sorted(matched[0])
    worst = 0.0
    for r in ranks[1:]:
        gaps = [m[r].end - m[ranks[0]].end for m in matched]
        mid = median(gaps)
        worst = max(worst, max(abs(g - mid) for g in gaps))
    return round(worst, 1)


def _ms(us: float) -> float:
    return round(us / 1000.0, 3)


def describe(view: dict[str, Any], collectives_shown: int = 8) -> list[str]:
    """The cross-rank view in plain lines (`ddptop trace` and the captures tab show these)."""
    lines = [f"who waits: {view['verdict']}"]
    if view.get("collectives"):
        lines[0] += (f"  (aligned on {view['aligned_on']}; {view['collectives']} collectives"
                     + (f", {view['unmatched']} unmatched" if view.get("unmatched") else "")
                     + f"; ends agree within {view['end_spread_us']:.0f} us)")
    for r, row in sorted((view.get("ranks") or {}).items(), key=lambda kv: int(kv[0])):
        pct = "" if row["wait_pct"] is None else f" ({row['wait_pct']:.0f}%)"
        line = (f"  r{r} collectives {row['comm_ms']:.1f} ms: waiting for peers {row['wait_ms']:.1f}{pct}, "
                f"transfer {row['transfer_ms']:.1f}")
        if row["late_in"]:
            line += f"; late in {row['late_in']}, peers waited {row['held_others_ms']:.1f} ms"
        lines.append(line)
    rows = view.get("per_collective") or []
    late = [row for row in rows if row["late_rank"] is not None][:collectives_shown]
    if late:
        lines.append("  late per collective: " + ", ".join(f"r{row['late_rank']} {row['late_ms']:.1f}" for row in late)
                     + (" ..." if len(late) < sum(1 for row in rows if row["late_rank"] is not None) else "")
                     + " ms")
    lines.extend(f"  {note}" for note in view.get("notes") or [])
    return lines
