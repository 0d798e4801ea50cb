"""A rank's memory over its recent steps, and the one rule for "memory keeps rising" (a leak
that ends in an out-of-memory error many steps later). Pure."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

# What the rank side reports, most telling first: the allocator's live tensors, its cache,
# its peak, and the process's resident set (the only one on a CPU run).
MEMORY_FIELDS = ("mem_allocated_mb", "mem_reserved_mb", "mem_peak_mb", "rss_mb")
CREEP_MIN_SAMPLES = 20
CREEP_MIN_MB = 64.0  # smaller rises are allocator noise
CREEP_MIN_SHARE = 0.05


@dataclass(frozen=True)
class Creep:
    field: str
    rise_mb: float
    over_steps: int
    from_mb: float

    def describe(self) -> str:
        what = {"mem_allocated_mb": "allocated GPU memory", "mem_reserved_mb": "reserved GPU memory",
                "mem_peak_mb": "peak GPU memory", "rss_mb": "resident memory"}[self.field]
        return (f"{what} keeps rising: +{self.rise_mb:.0f} MiB ({self.rise_mb / self.from_mb:.0%}) "
                f"over the last {self.over_steps} steps")


def latest(records: Iterable[Mapping[str, float]]) -> dict[str, float]:
    """The newest value of each memory field among the records (they are sampled, not sent
    with every step)."""
    out: dict[str, float] = {}
    for rec in records:
        out.update({k: rec[k] for k in MEMORY_FIELDS if k in rec})
    return out


def creep(records: Sequence[Mapping[str, float]]) -> Creep | None:
    """Memory that rose through the whole window: every value of the window's second half is
    above every value of its first half, by at least CREEP_MIN_MB and CREEP_MIN_SHARE. A
    steady state that goes up and down (the caching allocator) is not creep."""
    for key in ("mem_allocated_mb", "rss_mb"):
        points = [(int(r.get("step", i)), float(r[key])) for i, r in enumerate(records) if key in r]
        if len(points) < CREEP_MIN_SAMPLES:
            continue
        half = len(points) // 2
        first, second = [v for _, v in points[:half]], [v for _, v in points[half:]]
        rise = points[-1][1] - points[0][1]
        base = max(points[0][1], 1.0)
        if min(second) > max(first) and rise >= CREEP_MIN_MB and rise / base >= CREEP_MIN_SHARE:
            return Creep(key, rise, points[-1][0] - points[0][0], base)
    return None
