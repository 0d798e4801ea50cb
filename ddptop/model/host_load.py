"""The host's CPU as the ranks meet it, over the monitor's readings (ddptop.hw.host_load
reads /proc; nothing runs in the ranks): how many tasks are runnable on how many cores, steal time,
and per rank its CPU time and run-queue delay (/proc/<pid>/schedstat's second field: time it
was runnable but waited for a core). The straggler rule asks it whether a rank's excess comes
with contention for the CPU (a busy host is not a straggler).

Pure: no I/O, no UI.
"""

from __future__ import annotations

import collections
from collections.abc import Callable
from dataclasses import dataclass

from ddptop.hw.host_load import HostSample
from ddptop.model.figures.stats import median_nonempty

KEEP_S = 30.0  # seconds of samples kept
SPAN_S = 3.0  # a check looks at least this far back (a sample a second)
EXPLAINS = 0.5  # contended: the rank waited for a core, beyond the others, this share of its excess
STOLEN = 0.1  # ...or the hypervisor stole this share of the CPU
BUSY = 0.1  # a busy host: the ranks wait for a core this share of the time, on average


@dataclass(frozen=True)
class Contention:
    """The host over the last few seconds: what a straggler check weighs an excess against."""

    seconds: float
    cores: int
    runnable: float  # mean of the readings
    steal: float  # share of CPU time stolen
    wait_share: dict[int, float]  # rank -> run-queue delay per second of wall time
    cpu_share: dict[int, float]  # rank -> CPU seconds per second of wall time

    def explains(self, rank: int, excess_ms: float, step_ms: float) -> str:
        """Why `rank`'s excess per step is the host's, not the rank's ("" when it is not): it
        waited for a core, beyond what the other ranks wait, for at least EXPLAINS of that
        excess per step, or the hypervisor stole a tenth of the CPU. (On a busy host every rank
        waits; a rank that sleeps or waits on I/O is not runnable, so its excess stays its own.)"""
        if rank not in self.wait_share or excess_ms <= 0:
            return ""
        wait_ms = self.wait_share[rank] * step_ms
        others = sorted(v * step_ms for r, v in self.wait_share.items() if r != rank)
        beyond = wait_ms - (median_nonempty(others) if others else 0.0)
        if beyond < EXPLAINS * excess_ms and self.steal < STOLEN:
            return ""
        return self.words()

    @property
    def busy(self) -> bool:
        """The ranks waited for a core a tenth of the time on average, or the hypervisor stole
        a tenth of the CPU: what the rule can see is then worse than the ranks' own noise."""
        waits = list(self.wait_share.values())
        return (sum(waits) / len(waits) >= BUSY if waits else False) or self.steal >= STOLEN

    def words(self) -> str:
        steal = f", {100 * self.steal:.0f}% stolen" if self.steal >= 0.05 else ""
        return f"host CPU contended: {self.runnable:.0f} runnable on {self.cores} cores{steal}"


class HostHistory:
    """The last KEEP_S seconds of readings (bounded)."""

    def __init__(self) -> None:
        self.samples: collections.deque[HostSample] = collections.deque(maxlen=int(KEEP_S) * 4)

    def add(self, sample: HostSample) -> None:
        self.samples.append(sample)
        while self.samples and sample.t - self.samples[0].t > KEEP_S:
            self.samples.popleft()

    def over(self, seconds: float) -> Contention | None:
        """The host over the last `seconds` (at least SPAN_S); None with fewer than 2 readings."""
        if len(self.samples) < 2:
            return None
        last = self.samples[-1]
        since = last.t - max(seconds, SPAN_S)
        first = next((s for s in self.samples if s.t >= since), self.samples[0])
        if first is last:
            first = self.samples[-2]
        wall = last.t - first.t
        if wall <= 0:
            return None
        used = [s for s in self.samples if s.t >= first.t]
        busy = last.busy_s - first.busy_s
        return Contention(
            seconds=wall, cores=last.cores,
            runnable=sum(s.runnable for s in used) / len(used),
            steal=(last.steal_s - first.steal_s) / busy if busy > 0 else 0.0,
            wait_share=_rates(used, lambda s: {r: ns / 1e9 for r, ns in s.wait_ns.items()}),
            cpu_share=_rates(used, lambda s: s.cpu_s),
        )


def _rates(used: list[HostSample], counter: Callable[[HostSample], dict[int, float]]) -> dict[int, float]:
    """rank -> its counter's growth per second, from its first to its last reading among
    `used` (a rank that ended before the others is still counted)."""
    seen: dict[int, tuple[float, float, float, float]] = {}  # rank -> (t first, value first, t last, value last)
    for sample in used:
        for rank, value in counter(sample).items():
            t0, v0, _, _ = seen.get(rank, (sample.t, value, sample.t, value))
            seen[rank] = (t0, v0, sample.t, value)
    return {r: (v1 - v0) / (t1 - t0) for r, (t0, v0, t1, v1) in sorted(seen.items()) if t1 > t0}
