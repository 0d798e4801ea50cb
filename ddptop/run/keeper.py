"""The run's last resort when ddptop itself is killed (SIGKILL, OOM): a tiny process that
the launcher tells, as it sees them, every process of the run (pid and start time), and
that ends them all once its input closes, that is once ddptop is gone, however it went.

Needed because what ddptop's own ending does (the sweep) cannot run after a SIGKILL, and
PDEATHSIG only reaches torchrun: a script's own children, a SIGTERM-ignoring one, a
`setsid` daemon would otherwise go to init and live on. It also removes what ddptop
would have (the hub's private socket directory). At a normal end everything it was told
of is already gone, so it has nothing to do. No torch, no ddptop imports: it starts in a
few tens of milliseconds.

    python -m ddptop.run.keeper      (stdin: lines "PID START_TICKS" or "rm PATH"; EOF: end them all)

A process is known by its pid and its start in clock ticks since boot (/proc/PID/stat field
22), never by a wall-clock start time: psutil's create_time() is boot time plus those ticks, and
boot time moves with the wall clock, so a step (NTP, a VM resumed) made every process told of
look like a reused pid, and the run's daemons outlived a SIGKILLed ddptop.
"""

from __future__ import annotations

import os
import shutil
import signal
import sys
import time

import psutil

TERM_WAIT_S = 3.0  # after SIGTERM, before SIGKILL: the ranks' own clean exit


def start_ticks(pid: int) -> int | None:
    """When `pid` started, in clock ticks since boot (/proc/PID/stat field 22); None when it is
    gone. Unlike a wall-clock start time it never moves when the clock is stepped."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
        # after the command name (which may hold spaces and parentheses): field 3 onwards
        return int(data[data.rindex(b")") + 2:].split()[19])
    except (OSError, ValueError, IndexError):
        return None


def parse(line: str) -> tuple[int, int] | None:
    try:
        pid, started = line.split()
        return int(pid), int(started)
    except ValueError:
        return None


def same_process(pid: int, started: int) -> psutil.Process | None:
    """The process `pid` if it is still the one told of (not a reused pid), and not a zombie."""
    try:
        proc = psutil.Process(pid)
        if start_ticks(pid) != started or proc.status() == psutil.STATUS_ZOMBIE:
            return None
        return proc
    except psutil.Error:
        return None


def alive(told: dict[int, int]) -> list[psutil.Process]:
    """What was told of and still runs, with whatever it started since."""
    procs: dict[int, psutil.Process] = {}
    for pid, started in told.items():
        proc = same_process(pid, started)
        if proc is None:
            continue
        procs[pid] = proc
        try:
            for child in proc.children(recursive=True):
                procs.setdefault(child.pid, child)
        except psutil.Error:
            pass
    return [p for p in procs.values() if p.pid != os.getpid()]


def end_all(told: dict[int, int], wait_s: float = TERM_WAIT_S) -> int:
    """SIGTERM everything of the run, SIGKILL what is left after `wait_s`; how many."""
    procs = alive(told)
    for p in procs:
        try:
            p.terminate()
        except psutil.Error:
            pass
    deadline = time.monotonic() + wait_s
    while procs and time.monotonic() < deadline:
        time.sleep(0.1)
        procs = [p for p in procs if _running(p)]
        for p in alive(told):  # started meanwhile (a fork in a signal handler)
            if p.pid not in {q.pid for q in procs}:
                procs.append(p)
    for p in procs + alive(told):
        try:
            p.kill()
        except psutil.Error:
            pass
    return len(procs)


def _running(p: psutil.Process) -> bool:
    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def main() -> int:
    # A terminal's Ctrl-C or hangup is for ddptop, which then ends the run itself.
    for sig in (signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
    told: dict[int, int] = {}
    leftovers: list[str] = []
    for line in sys.stdin:
        if line.startswith("rm "):
            leftovers.append(line[3:].rstrip("\n"))
            continue
        got = parse(line)
        if got is not None:
            told[got[0]] = got[1]
    end_all(told)
    for path in leftovers:
        shutil.rmtree(path, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
