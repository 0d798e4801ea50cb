"""The one measure `ddptop cost` takes in both of its arms, plain torchrun and ddptop: a
timestamp at the end of every optimizer step, and nothing else.

On the ranks' PYTHONPATH in both arms (under ddptop, its own sitecustomize runs this one
through its chain). With DDPTOP_STAMP set and RANK set (a torchrun rank), it pins the rank to
its CPUs (DDPTOP_STAMP_CPUS: one comma list per local rank, `;` between them) so that both arms
place the ranks alike, and, once the script has imported torch, appends time.perf_counter() to
a list at every optimizer step (torch's global step post-hook: ~1 µs a step, the same in both
arms). At exit it writes the list to `$DDPTOP_STAMP.rank<RANK>.json`. It imports nothing of
ddptop and runs the sitecustomize it shadows, if any, first.
"""

import os
import sys
from typing import Any, cast


def _chain() -> None:
    """The sitecustomize this one shadows, by ddptop's own chain (loaded by its path: the plain
    arm's ranks have no ddptop on their path)."""
    import importlib.util

    here = os.path.dirname(os.path.abspath(__file__))
    path = os.path.join(os.path.dirname(here), "boot", "_ddptop_site_chain.py")
    spec = importlib.util.spec_from_file_location("_ddptop_site_chain", path)
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.chain(here)


def _pin(local_rank: int) -> None:
    lists = [part for part in os.environ.get("DDPTOP_STAMP_CPUS", "").split(";") if part]
    if lists and hasattr(os, "sched_setaffinity"):
        cpus = {int(c) for c in lists[local_rank % len(lists)].split(",")}
        os.sched_setaffinity(0, cpus)


def _stamp(prefix: str, rank: str) -> None:
    import atexit
    import importlib
    import importlib.abc
    import importlib.util
    import json
    import time

    stamps: list = []
    pid = os.getpid()
    turns = _Turns.open(rank)

    def on_step(*_args, **_kwargs) -> None:
        if turns is not None and turns.on:
            turns.sync()  # the step ends when its device work does: the other job's turn starts clean
        stamps.append(time.perf_counter())
        if turns is not None and turns.on:
            turns.hand_over_and_wait()

    def hook_in() -> None:
        try:
            importlib.import_module("torch.optim.optimizer").register_optimizer_step_post_hook(on_step)
        except Exception as exc:  # noqa: BLE001 - never into the script
            print(f"ddptop cost: this rank is not stamped: {type(exc).__name__}: {exc}", file=sys.stderr)

    def write() -> None:
        if os.getpid() != pid:
            return  # a forked child that exits through atexit: the rank writes its own
        if turns is not None:
            turns.leave()
        with open(f"{prefix}.rank{rank}.json", "w") as f:
            json.dump({"rank": int(rank), "pid": os.getpid(), "stamps": stamps,
                       **({"starts": turns.starts} if turns is not None else {})}, f)

    class Watcher(importlib.abc.MetaPathFinder):
        def find_spec(self, fullname, path, target=None):  # noqa: ARG002
            if fullname != "torch":
                return None
            sys.meta_path.remove(self)
            spec = importlib.util.find_spec("torch")
            loader = getattr(spec, "loader", None)
            if loader is None or not hasattr(loader, "exec_module"):
                return spec
            original = loader.exec_module

            def exec_module(module) -> None:
                original(module)
                loader.exec_module = original
                hook_in()

            loader.exec_module = exec_module
            return spec

    atexit.register(write)
    if "torch" in sys.modules:
        hook_in()
    else:
        sys.meta_path.insert(0, Watcher())


TURN_WAIT_MODULE = "_ddptop_turn_wait"  # ddptop.rank.phase_every reads it: that file's constant of the same name


class _Turns:
    """This rank's turns with the same rank of the other job (`ddptop cost --lockstep`)."""

    def __init__(self, mine: int, theirs: int, job: str, wait_s: float, pin_main: bool = False) -> None:
        import types

        self.mine, self.theirs, self.wait_s = mine, theirs, wait_s
        # the seconds this rank has waited for its turn (the other job's steps), for ddptop's own
        # clock of the job's pace (ddptop.rank.phase_every.working_clock): K as the job alone would have it
        self.waited: Any = cast(Any, sys.modules.setdefault(TURN_WAIT_MODULE, types.ModuleType(TURN_WAIT_MODULE)))
        self.waited.total_s = 0.0
        self.skip_next = job == "b"
        self.on = True
        self.starts: list = []
        self.pin_main = pin_main

    def _pin_main(self) -> None:
        """DDPTOP_STAMP_PIN_MAIN: this (the main) thread alone on the first of the rank's CPUs,
        as the same rank of the other job (a core's slow spells then fall on both); the threads
        that already run keep their CPUs, and a process forked later gets them back."""
        self.pin_main = False
        if not hasattr(os, "sched_setaffinity"):
            return
        cpus = os.sched_getaffinity(0)
        os.register_at_fork(after_in_child=lambda: os.sched_setaffinity(0, cpus))
        os.sched_setaffinity(0, {min(cpus)})  # pid 0: the calling thread only

    @classmethod
    def open(cls, rank: str) -> "_Turns | None":
        folder, job = os.environ.get("DDPTOP_STAMP_TURNS"), os.environ.get("DDPTOP_STAMP_JOB")
        if not folder or job not in ("a", "b"):
            return None
        other = "b" if job == "a" else "a"
        mine = os.open(os.path.join(folder, f"turn_{job}_{rank}"), os.O_RDWR)
        theirs = os.open(os.path.join(folder, f"turn_{other}_{rank}"), os.O_RDWR)
        return cls(mine, theirs, job, float(os.environ.get("DDPTOP_STAMP_TURN_S", "300")),
                   os.environ.get("DDPTOP_STAMP_PIN_MAIN") == "1")

    def sync(self) -> None:
        cuda = getattr(sys.modules.get("torch"), "cuda", None)
        if cuda is not None and cuda.is_available() and cuda.is_initialized():
            cuda.synchronize()

    def hand_over_and_wait(self) -> None:
        import select
        import time

        if self.pin_main:
            self._pin_main()
        t0 = time.perf_counter()
        if self.skip_next:
            self.skip_next = False
        else:
            os.write(self.theirs, b"t")
        ready, _, _ = select.select([self.mine], [], [], self.wait_s)
        got = os.read(self.mine, 1) if ready else b""
        self.waited.total_s += time.perf_counter() - t0
        if got != b"t":  # the other job left, or its turn never came back: run on alone
            self.on = False
            return
        self.starts.append(time.perf_counter())

    def leave(self) -> None:
        """For good: the other job's rank, waiting or not yet, runs on alone."""
        self.on = False
        os.write(self.theirs, b"e")


def _start() -> None:
    prefix, rank = os.environ.get("DDPTOP_STAMP"), os.environ.get("RANK")
    if not prefix or rank is None or os.environ.get("DDPTOP_STAMP_PID", str(os.getpid())) != str(os.getpid()):
        return  # not a rank, or a rank's own child (a DataLoader worker): not stamped
    os.environ["DDPTOP_STAMP_PID"] = str(os.getpid())
    try:
        _pin(int(os.environ.get("LOCAL_RANK", rank)))
        _stamp(prefix, rank)
    except Exception as exc:  # noqa: BLE001 - the script runs whatever happens here
        print(f"ddptop cost: this rank is not stamped: {type(exc).__name__}: {exc}", file=sys.stderr)


try:
    _chain()
finally:
    _start()
