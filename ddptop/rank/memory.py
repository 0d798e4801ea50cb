"""A rank's memory, sampled every few steps for the rank detail and the creep alert: torch's
CUDA caching allocator (allocated, reserved, peak allocated) on a GPU, and the process's
resident set everywhere. Host-side reads only (the allocator's counters, /proc): no sync."""

from __future__ import annotations

import os
from typing import Any

from ddptop.rank.clock import AtMostEvery

MEMORY_EVERY = 10  # steps between samples...
MEMORY_MIN_S = 0.5  # ...and seconds: a GPU sample costs ~190 us on an H100 (docs/GPU.md)
MIB = float(1 << 20)


class MemorySampler:
    """A sample on every MEMORY_EVERY-th step, at most once in MEMORY_MIN_S seconds (fast
    steps would otherwise pay for it: 190 us every 10 steps of 5 ms is 0.4%)."""

    def __init__(self) -> None:
        self._often = AtMostEvery(MEMORY_MIN_S)
        self._last: int | None = None

    def due(self, step: int) -> bool:
        """At least MEMORY_EVERY steps since the last sample (counted, not a multiple of it: with one
        step in K timed, ddptop.rank.phase_every, the timed steps need not fall on multiples)."""
        if self._last is not None and step - self._last < MEMORY_EVERY or not self._often.ready():
            return False
        self._last = step
        return True


def rss_mb() -> float | None:
    """This process's resident set (Linux /proc; None elsewhere)."""
    try:
        with open("/proc/self/statm", "rb") as f:
            pages = int(f.read().split()[1])
        return pages * os.sysconf("SC_PAGE_SIZE") / MIB
    except (OSError, ValueError, IndexError):
        return None


def memory_sample(torch: Any, cuda: bool) -> dict[str, float]:
    out: dict[str, float] = {}
    rss = rss_mb()
    if rss is not None:
        out["rss_mb"] = round(rss, 1)
    if cuda:
        # one read of the allocator's counters (memory_allocated() and its siblings each
        # read all of them: three calls cost ~300 us on an H100, docs/GPU.md)
        stats = torch.cuda.memory_stats(torch.cuda.current_device())
        for key, stat in (("mem_allocated_mb", "allocated_bytes.all.current"),
                          ("mem_reserved_mb", "reserved_bytes.all.current"),
                          ("mem_peak_mb", "allocated_bytes.all.peak")):
            out[key] = round(stats.get(stat, 0) / MIB, 1)
    return out
