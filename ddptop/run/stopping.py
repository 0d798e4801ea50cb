"""A run's stop, as torchrun's own: the ranks are asked to stop at an agreed step, and unless
that stop has ended the run within its moment, the signal reaches them through torchrun (which
forwards it to each rank's process group, as under plain torchrun). Then the ranks have the
grace torchrun gives them (30 s, `--stop-grace`) to run their handlers, shown while they do;
those still running after it are SIGKILLed, and the run's notes say which, where they were and
which files they had open for writing. A second Ctrl-C sends SIGTERM to the ranks, as
torchrun's second one does; a third, SIGKILL. No UI, no torch.

A stop that comes while torchrun is still starting (no rank spawned yet) ends torchrun with
SIGTERM instead: torchrun swallows a SIGINT for its first ~1.5 s (imports; plain torchrun too,
2026-11-28) and then runs the script as if nothing had been asked. And where torchrun is
still running after the grace with no rank left that ddptop can name (a script that never
imports torch never says hello), its whole tree is ended: a stop always ends the run.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
import sys
import time
from pathlib import Path

import psutil

from ddptop.model.state import RunState
from ddptop.run.rank_procs import RankProcesses
from ddptop.run.stacks import collect_stacks
from ddptop.run.untrusted import read_text

AGREED_MAX_S = 2.0  # the agreed step's moment, at most: a Ctrl-C is the ranks' at once, as under torchrun
STARTING_GRACE_S = 2.0  # torchrun's own ending, where it ends without its ranks' handlers
OWN_STOP_MAX_S = 15.0  # the same for a stop ddptop makes itself (a full disk): no one waits on a key
POLL_S = 0.2
SHOW_EVERY_S = 5.0  # how often the log says who is still in their handlers
_FRAME = re.compile(r'^\s*File "(?P<file>[^"]+)", line (?P<line>\d+) in (?P<func>\S+)')


class Stopper:
    def __init__(self, state: RunState, procs: RankProcesses, grace_s: float) -> None:
        self.state, self.procs, self.grace_s = state, procs, grace_s
        self.signalled_at: float | None = None  # monotonic time the ranks were signalled
        self.sent = 0  # signals sent to the ranks (through torchrun first)
        self.progress = ""  # who is still running their handlers, for a status line
        self._now = asyncio.Event()  # a second Ctrl-C: the agreed step's moment is over

    async def run(self, agreed_s: float, patient: bool = False) -> None:
        """After the agreed step's moment (`agreed_s`, at most AGREED_MAX_S; when `patient`,
        until the ranks have left, at most OWN_STOP_MAX_S), SIGINT to torchrun unless every rank
        has ended; then the grace, and SIGKILL for the ranks still running."""
        launcher = self.procs.launcher
        if launcher is None:
            return
        ends = time.monotonic() + (OWN_STOP_MAX_S if patient else min(agreed_s, AGREED_MAX_S))
        while launcher.running and not self._now.is_set() and (left := ends - time.monotonic()) > 0:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._now.wait(), min(left, POLL_S))
        if not launcher.running:
            return  # the agreed stop came first: every rank has ended
        if self.sent == 0 and len(launcher.tree()) <= 1:  # torchrun alone: no rank spawned yet
            self.signalled_at, self.sent = time.monotonic(), 1
            self._log("stop before any rank started: torchrun ended (SIGTERM); a SIGINT is lost while it starts")
            await launcher.stop(grace_s=STARTING_GRACE_S)
            return
        if self.sent == 0:
            self._send_first()
        await self._grace()
        # torchrun sees its killed ranks within its monitor interval; one that missed the signal,
        # running ranks that never said hello (nothing to kill by name), would run on
        ends = time.monotonic() + STARTING_GRACE_S
        while launcher.running and time.monotonic() < ends:
            await asyncio.sleep(POLL_S)
        if launcher.running:
            self._log("torchrun still running after the grace: its processes ended (SIGTERM, then SIGKILL)")
            await launcher.stop(grace_s=STARTING_GRACE_S)

    def _send_first(self) -> None:
        launcher = self.procs.launcher
        assert launcher is not None
        self.signalled_at, self.sent = time.monotonic(), 1
        launcher.send(signal.SIGINT)
        self._log(f"SIGINT to the ranks (through torchrun); they have {self.grace_s:g} s (--stop-grace) "
                  f"to finish, as under torchrun; a second Ctrl-C sends SIGTERM")

    def escalate(self) -> str:
        """A second Ctrl-C: SIGTERM to the ranks still running, as torchrun's second Ctrl-C does
        (after the first's SIGINT, if the agreed step's moment had not ended yet); a third:
        SIGKILL. Returns what it did ('': nothing was left to stop), also a note of the run's."""
        self._now.set()
        if self.sent == 0 and self.procs.launcher is not None and self.procs.launcher.running:
            self._send_first()
        live = self._live()
        if not live:
            return ""
        self.sent += 1
        sig = signal.SIGTERM if self.sent == 2 else signal.SIGKILL
        for pid in live.values():
            _signal_group(pid, sig)
        said = (f"{'second' if self.sent == 2 else 'another'} Ctrl-C: {signal.Signals(sig).name} to "
                f"{_ranks(live)}" + (", as torchrun's second Ctrl-C does" if sig == signal.SIGTERM else ""))
        self._log(said)
        self.state.notes.append(said)
        return said

    async def _grace(self) -> None:
        """Until torchrun exits or the grace ends; then the ranks still running are killed."""
        launcher = self.procs.launcher
        assert launcher is not None and self.signalled_at is not None
        ends = self.signalled_at + self.grace_s
        shown = time.monotonic()
        writing: dict[int, list[str]] = {}
        while launcher.running and time.monotonic() < ends:
            await asyncio.sleep(POLL_S)
            live = self._live()
            writing = {rank: self._writing(pid) or writing.get(rank, []) for rank, pid in live.items()}
            waited = time.monotonic() - self.signalled_at
            self.progress = f"stopping: {_ranks(live)} still running {waited:.0f} s of {self.grace_s:g} s" if live else ""
            if live and time.monotonic() - shown >= SHOW_EVERY_S:
                shown = time.monotonic()
                self._log(f"{self.progress} (their handlers: " + ", ".join(
                    f"rank {r} writing {', '.join(w)}" if w else f"rank {r}" for r, w in sorted(writing.items())
                    if r in live) + ")")
        if launcher.running:
            await self._kill_leftovers(writing)
        self.progress = ""

    async def _kill_leftovers(self, writing: dict[int, list[str]]) -> None:
        live = self._live()
        if not live:
            return
        stacks_dir = self.procs.run_dir / "stacks"  # where the ranks' faulthandler writes
        signalable = {r for r, rs in self.state.ranks.items() if rs.info.get("stacks")}
        stacks = await collect_stacks(stacks_dir, live, self.procs.process_status(), signalable)
        for rank, pid in sorted(live.items()):
            files = self._writing(pid) or writing.get(rank, [])
            _signal_group(pid, signal.SIGKILL)
            where = handler_frame(stacks.get(rank, ""))
            self.state.notes.append(
                f"rank {rank} was killed (SIGKILL) after the {self.grace_s:g} s grace (--stop-grace), still running"
                + (f" {where}" if where else " its handler")
                + (f"; it had open for writing: {', '.join(files)}" if files else "; no file open for writing"))
        self._log(f"{_ranks(live)} still running after the {self.grace_s:g} s grace: SIGKILL")

    def _writing(self, pid: int) -> list[str]:
        """What `pid` has open for writing, but the run's own files (a rank's stdout and stderr
        under torchrun, its stacks)."""
        return [f for f in open_for_writing(pid) if not Path(f).is_relative_to(self.procs.run_dir)]

    def _live(self) -> dict[int, int]:
        """rank -> pid of the ranks of this node still running."""
        out = {}
        for rank, pid in self.procs.rank_pids().items():
            with contextlib.suppress(psutil.Error):
                if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                    out[rank] = pid
        return out

    def _log(self, line: str) -> None:
        self.state.add_log(-1, f"[ddptop] {line}")


def open_for_writing(pid: int) -> list[str]:
    """The regular files `pid` has open for writing (psutil's open_files, where it can)."""
    try:
        files = psutil.Process(pid).open_files()
    except (psutil.Error, OSError):
        return []
    return sorted({f.path for f in files if getattr(f, "mode", "r") != "r"})


def handler_frame(stacks_file: str) -> str:
    """Where a rank was, from its stack dump (faulthandler's or py-spy's): the innermost frame
    of the script's own code in its main thread ("in save (train.py:42)"), else its innermost
    frame; '' when there is no dump."""
    text = read_text(stacks_file, 16 << 20)  # a regular file only: never a FIFO put in its place
    if text is None:
        return ""
    blocks = [b for b in re.split(r"\n\s*\n", text) if _FRAME.search(b) or "thread" in b.lower()]
    # faulthandler appends a dump to the file at each signal; the thread that took it (the main
    # one) is its "Current thread"
    current = [b for b in blocks if b.lstrip().startswith("Current thread")]
    block = current[-1] if current else (blocks[-1] if blocks else "")
    frames = [(m["file"], m["line"], m["func"]) for m in map(_FRAME.match, block.splitlines()) if m]
    own = [f for f in frames if not _library(f[0])]
    if not (own or frames):
        return ""
    file, line, func = (own or frames)[0]
    return f"in {func} ({os.path.basename(file)}:{line})"


def _library(path: str) -> bool:
    """Python's own, an installed package's, or ddptop's: not the script's code."""
    here = str(Path(__file__).resolve().parents[1])
    return ("site-packages" in path or "dist-packages" in path or path.startswith(here)
            or path.startswith((sys.base_prefix, sys.prefix)) and "/lib/python" in path)


def _signal_group(pid: int, sig: int) -> None:
    """torchrun starts each rank in a session of its own: its group is its pid (its DataLoader
    workers with it), as torchrun signals it."""
    try:
        os.killpg(pid, sig)
    except OSError:
        with contextlib.suppress(OSError):
            os.kill(pid, sig)


def _ranks(live: dict[int, int]) -> str:
    ranks = sorted(live)
    return f"rank {ranks[0]}" if len(ranks) == 1 else "ranks " + ", ".join(map(str, ranks))
