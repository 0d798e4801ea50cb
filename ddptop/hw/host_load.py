"""The host's CPU as the ranks meet it, read from /proc by the monitor (never in a rank):
tasks runnable and the cores, steal time (/proc/stat), and per rank its process CPU time and
run-queue delay (/proc/<pid>/schedstat: ns on a CPU, ns runnable but waiting for one, slices).
What cannot be read (not Linux, a gone pid) is left out of the reading."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field

CLOCK_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


@dataclass(frozen=True)
class HostSample:
    """One reading: cumulative counters, so two readings give rates over their interval."""

    t: float  # the monitor's clock, s
    cores: int  # the cores this process may run on
    runnable: int  # tasks runnable now, host-wide (/proc/stat procs_running, the monitor itself included)
    steal_s: float  # the host's CPU time stolen by the hypervisor, all cores, s (cumulative)
    busy_s: float  # all CPU time, s (cumulative), the denominator of steal's share
    wait_ns: dict[int, int] = field(default_factory=dict)  # rank -> run-queue delay, ns (cumulative)
    cpu_s: dict[int, float] = field(default_factory=dict)  # rank -> process CPU time, s (cumulative)


def cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def read_host(rank_pids: Mapping[int, int], t: float, proc: str = "/proc") -> HostSample | None:
    """The host now; None where /proc/stat cannot be read (not Linux)."""
    try:
        with open(f"{proc}/stat") as f:
            stat = f.read().splitlines()
    except OSError:
        return None
    cpu = [float(x) for x in stat[0].split()[1:]] if stat and stat[0].startswith("cpu ") else []
    running = next((int(line.split()[1]) for line in stat if line.startswith("procs_running ")), 0)
    wait: dict[int, int] = {}
    cpu_s: dict[int, float] = {}
    for rank, pid in rank_pids.items():
        try:
            with open(f"{proc}/{pid}/schedstat") as f:
                wait[rank] = int(f.read().split()[1])
            with open(f"{proc}/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()  # after the command's name, which may hold spaces
            cpu_s[rank] = (int(fields[11]) + int(fields[12])) / CLOCK_TICK  # utime + stime
        except (OSError, IndexError, ValueError):
            continue
    return HostSample(t=t, cores=cores(), runnable=running,
                      steal_s=cpu[7] / CLOCK_TICK if len(cpu) > 7 else 0.0,
                      busy_s=sum(cpu) / CLOCK_TICK, wait_ns=wait, cpu_s=cpu_s)
