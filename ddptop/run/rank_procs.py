"""RankProcesses: which processes and directories on this node are the run's ranks.

A rank's hello names its pid, but that is a claim: ddptop signals (stacks on a stall)
and samples only pids it has seen in its own torchrun's process tree. torchrun keeps a
directory per local rank (stdout, stderr, error.json); across nodes the hellos say
which rank each local rank is. No UI, no torch.
"""

from __future__ import annotations

import os
from pathlib import Path

import psutil

from ddptop.model.failures import ErrorFile, parse_error_file
from ddptop.model.options import NodeOptions
from ddptop.model.state import RunState
from ddptop.run.launcher import Launcher
from ddptop.run.untrusted import open_regular, read_bytes
from ddptop.wire import protocol

FAILURE_LOG_LINES = 8  # of the failed rank's stderr, in the summary and the final report
ERROR_FILE_MAX = 1 << 16  # bytes of an error.json read (a traceback, not a data dump)


class RankProcesses:
    def __init__(self, state: RunState, node: NodeOptions, run_dir: Path) -> None:
        self.state = state
        self.node = node
        self.run_dir = run_dir  # torchrun's logs are under <run_dir>/logs
        self.launcher: Launcher | None = None  # set once the run is launched
        self._our_pids: set[int] = set()  # rank pids seen to be in torchrun's tree

    def admit(self, hello: protocol.Hello) -> str | None:
        """A rank on this node must be a process of this run's torchrun: its pid is what ddptop
        would signal. Ranks of other nodes are vouched for by the token alone, but only nodes
        the run has: a "node 1" hello in a one-node run would take a real rank's place."""
        if not 0 <= hello.node < self.node.nnodes:
            return f"rank {hello.rank} says it runs on node {hello.node}: this run has {self.node.nnodes} node(s)"
        if hello.node != self.node.node_rank or self.launcher is None:
            return None
        if hello.pid <= 1 or hello.pid == os.getpid() or hello.pid not in self.tree_pids():
            return f"rank {hello.rank}'s pid {hello.pid} is not a process of this run"
        return None

    def tree_pids(self) -> set[int]:
        if self.launcher is not None:
            self._our_pids |= {p.pid for p in self.launcher.tree()[1:]} - {0, 1, os.getpid()}
        return self._our_pids

    def rank_pids(self) -> dict[int, int]:
        """Pids of the ranks on this node that are processes of this run's torchrun: a pid
        in a hello is a claim, and ddptop signals these (stacks on a stall)."""
        here = self.node.node_rank
        claimed = {r: rs.hello.pid for r, rs in self.state.ranks.items()
                   if rs.hello is not None and rs.hello.node == here}
        if any(pid not in self._our_pids for pid in claimed.values()):
            self.tree_pids()
        return {r: pid for r, pid in claimed.items() if pid in self._our_pids}

    def alive_pids(self) -> set[int]:
        """Processes of the run alive now (a finished rank's pid may be someone else's by now)."""
        return {p.pid for p in self.launcher.run_processes()} if self.launcher is not None else set()

    def process_status(self) -> dict[int, str]:
        out = {}
        for rank, pid in self.rank_pids().items():
            try:
                out[rank] = psutil.Process(pid).status()
            except psutil.Error:
                out[rank] = "gone"
        return out

    def local_to_rank(self) -> dict[int, int]:
        """torchrun names each rank's log directory by local rank; on one node that is the
        rank, across nodes the hellos say which rank each local rank is."""
        if not self.node.multi:
            return {}
        here = self.node.node_rank
        return {rs.hello.local_rank: r for r, rs in self.state.ranks.items()
                if rs.hello is not None and rs.hello.node == here}

    def rank_dirs(self) -> dict[int, Path]:
        """rank -> torchrun's directory for it (<logs>/<id>/attempt_<n>/<local_rank>/, the last
        attempt): its stdout.log, stderr.log and, when it raised under @record, error.json."""
        to_rank = self.local_to_rank()
        out: dict[int, Path] = {}
        attempts = sorted((self.run_dir / "logs").glob("*/attempt_*"),
                          key=lambda d: int(d.name.removeprefix("attempt_") or 0)
                          if d.name.removeprefix("attempt_").isdigit() else -1)
        for attempt in attempts:
            for d in attempt.iterdir() if attempt.is_dir() else ():
                if d.name.isdigit():
                    rank = to_rank.get(int(d.name)) if self.node.multi else int(d.name)
                    if rank is not None:
                        out[rank] = d
        return out

    def error_files(self) -> dict[int, ErrorFile]:
        """What each rank's error.json says (written by torchrun's @record in the rank)."""
        out = {}
        for rank, d in self.rank_dirs().items():
            data = read_bytes(d / "error.json", ERROR_FILE_MAX)
            if data is None:
                continue
            parsed = parse_error_file(data.decode("utf-8", "replace"))
            if parsed is not None:
                out[rank] = parsed
        return out

    def stderr_tail(self, rank: int, lines: int = FAILURE_LOG_LINES) -> list[str]:
        """The last lines `rank` wrote to stderr (the end of a traceback, the interpreter's or
        the shell's complaint), from its log file: the in-memory log mixes in stdout."""
        d = self.rank_dirs().get(rank)
        if d is None:
            return []
        fd = open_regular(d / "stderr.log")  # never a FIFO or a link put in its place
        if fd is None:
            return []
        try:
            start = max(0, os.fstat(fd).st_size - 16384)
            data = os.pread(fd, 16384, start)
        except OSError:
            return []
        finally:
            os.close(fd)
        text = data.decode("utf-8", "replace").replace("\r\n", "\n").replace("\r", "\n")
        cut = text.splitlines()[1 if start else 0:]  # the first line read may be a piece of one
        kept = [line.rstrip()[:500] for line in cut if line.strip()]
        return kept[-lines:]
