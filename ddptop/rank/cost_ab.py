"""ddptop's own cost, measured inside the rank on the script's own steps (`--set cost_ab=S`).

After warmup and a short calibration the run's steps are cut into blocks of about S seconds
(the same number of steps on every rank: rank 0 decides and tells the others through the
process group's store); an S shorter than a step makes blocks of one step, the arms then
alternate step by step (bench/overhead_ab.py's default: the step-to-step drift cancels best). Each group of blocks runs every arm once, in a random order that every
rank draws from the same seed:
    on    the rank-side layer engaged, as in any run
    off   bypassed: every hook that can be removed is removed, the optimizer hooks only count
          steps (what cannot be removed: a comm hook already registered, NCCL's completion
          hook, the launch environment; measured apart, bench/investigations/nccl_timing_cost.py)
    aa    the same as off (the A/A check: the method must read 1.000 between the two)
    busy  off plus a calibrated busy wait of cost_ab_busy_pct % of a step (on a GPU a spin
          kernel on the script's stream, so the cost is real whether the step is host- or
          device-bound): the method must see it
A block is timed from the step boundary before its first step to the one after its last (CUDA
events on the current stream, or the host clock), and each of its steps too (a stamp at every
step boundary, on every arm alike); with the process's and the main thread's CPU time (on a GPU
both include the script's own spin-waits on the device), the host time spent inside the layer's
hooks (`timed`: what the layer itself costs the main thread) and the garbage collections. Adjacent blocks of one group share the machine's state, so drift cancels in their ratio
(ddptop.analysis.cost_ab). The blocks go to <run dir>/cost_ab/rank<R>.json at exit.

Imports the standard library and the rank's clocks (ddptop.rank.clock); torch is handed in.
"""

from __future__ import annotations

import functools
import gc
import json
import os
import random
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ddptop.rank.clock import HostClock

ARMS = ("on", "off", "aa", "busy")
CALIBRATION_STEPS = 10
SLOW_S = 20e-6  # a part's call slower than this is counted apart (a new CUDA event: ~140 us)
SEED = 20261125
STORE_KEY = "ddptop_cost_ab_steps"


class CostAB:
    def __init__(self, torch: Any, rank: int, settings: dict[str, Any], engage: Callable[[bool], None]) -> None:
        self.torch = torch
        self.rank = rank
        self.block_s = float(settings.get("cost_ab") or 0.0)
        arms = [a.strip() for a in str(settings.get("cost_ab_arms") or "on,off,aa,busy").split(",") if a.strip()]
        self.arms = [a for a in arms if a in ARMS] or ["on", "off"]
        self.max_blocks = int(settings.get("cost_ab_blocks") or 0)
        self.busy_pct = float(settings.get("cost_ab_busy_pct") or 0.5)
        self.parts = self.enabled and bool(settings.get("cost_ab_parts"))  # profile_parts applies
        self.start = int(settings.get("warmup") or 0) + 1
        self._engage = engage
        self._rng = random.Random(SEED)
        self._cuda = False
        self.clock: Any = HostClock()
        self.steps_per_block = 0
        self.step_ms = 0.0
        self.busy_ms = 0.0
        self._busy: Callable[[], None] | None = None
        self._cal: Any = None  # the calibration's first stamp
        self._order: list[str] = []
        self._arm = "on"
        self._group = 0
        self._in_block = 0
        self._opened: tuple[Any, float, float, float, int, float] | None = None  # stamp, CPU, thread CPU, hook s, gc n, gc s
        self._depth = self._ends = 0  # optimizer steps seen while bypassed
        self._spins: list[tuple[Any, Any]] = []  # the busy arm's spins in the open block
        self._stamps: list[Any] = []  # the open block's step boundaries
        self.hook_s = 0.0  # host seconds inside the layer's hooks (timed), all arms
        self.per_hook: dict[str, dict[str, list[float]]] = {}  # arm -> hook -> [calls, seconds, slow calls]
        self._inside = False
        self.gc_n, self.gc_s = 0, 0.0  # collections and their seconds, since calibration
        self._gc_at = 0.0
        self.blocks: list[dict[str, Any]] = []
        self._unread: list[dict[str, Any]] = []  # closed blocks still holding their stamps
        self.last_step: int | None = None  # the run ends after this step (cost_ab_blocks)
        self._over = False  # the last block ended: the run's end (its flush) is no hook's cost

    @property
    def enabled(self) -> bool:
        return self.block_s > 0

    def timed(self, hook: Callable[..., Any]) -> Callable[..., Any]:
        """`hook` with its host time added to hook_s (the outermost of nested hooks only)."""

        @functools.wraps(hook)
        def run(*args: Any, **kwargs: Any) -> Any:
            if self._inside:
                return hook(*args, **kwargs)
            self._inside = True
            start = time.perf_counter()
            try:
                return hook(*args, **kwargs)
            finally:
                took = time.perf_counter() - start
                self.hook_s += took
                self._inside = False
                self._count(name, took)

        name = getattr(hook, "__name__", "hook")
        return run

    def _count(self, name: str, took: float) -> None:
        """One call of hook or part `name` in the open block's arm (none outside blocks or after
        the run's end): [calls, seconds, calls over SLOW_S]."""
        if self._opened is not None and not self._over:
            row = self.per_hook.setdefault(self._arm, {}).setdefault(name, [0, 0.0, 0])
            row[0] += 1
            row[1] += took
            row[2] += took > SLOW_S

    def run_ends(self) -> None:
        """The run's end: what the instrument does now (its flush waits 0.25 s for NCCL's last
        reports) is no step's cost. On 2x H100 the HF script's 800 engaged steps carried it as
        +312 us/step of `comm.with_nccl_times` (264 ms over 801 calls, Lightning's 293 over 3,201)."""
        self._over = True

    def profile_parts(self, owners: dict[str, Any]) -> None:
        """Time these methods too, inside the hooks (`owner.method` names, e.g.
        "tracker.mark"): where a hook's host time goes, per arm (with cost_ab_parts only: the
        timing costs ~1.5 us a call, which the engaged arm would carry)."""
        if not self.parts:
            return
        for name, owner in owners.items():
            attr = name.rsplit(".", 1)[-1]
            method = getattr(owner, attr, None)
            if method is not None:
                setattr(owner, attr, self._part(name, method))

    def _part(self, name: str, method: Callable[..., Any]) -> Callable[..., Any]:
        """`method` timed as part `name` (`name@autograd` when another thread calls it: the
        backward hooks run on autograd's device thread); row: [calls, seconds, calls > SLOW_S]."""
        main = threading.get_ident()

        @functools.wraps(method)
        def run(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                return method(*args, **kwargs)
            finally:
                took = time.perf_counter() - start
                self._count(name if threading.get_ident() == main else f"{name}@autograd", took)

        return run

    def _on_gc(self, phase: str, info: dict[str, Any]) -> None:  # noqa: ARG002
        if phase == "start":
            self._gc_at = time.perf_counter()
        else:
            self.gc_n += 1
            self.gc_s += time.perf_counter() - self._gc_at

    def use_clock(self, clock: Any, cuda: bool) -> None:
        """The instrument's clock (CUDA events on the script's stream, or the host's); its
        calls are profiled as parts (a stamp's host cost, a record's reads)."""
        if self.parts:
            self.profile_parts({"clock.stamp": clock, "clock.elapsed": clock, "clock.done": clock})
        self.clock, self._cuda = clock, cuda

    def bypassed_opt(self, begin: bool, cycle: int = 1) -> bool:
        """An optimizer step began or ended while the layer is bypassed; True when that
        ended a training step (every optimizer of the script's cycle stepped once)."""
        if begin:
            self._depth += 1
            return False
        self._depth = max(0, self._depth - 1)
        if self._depth:
            return False
        self._ends += 1
        return self._ends % max(1, cycle) == 0

    # --- step boundaries -----------------------------------------------------------------------
    def step_ended(self, step: int) -> None:
        """Step `step` (0-based, counted on every arm) just ended."""
        if step + 1 < self.start:
            return
        if step + 1 == self.start:
            self._cal = self.clock.stamp()
            return
        if self.steps_per_block == 0:
            if step + 1 - self.start >= CALIBRATION_STEPS:
                self._calibrate(step)
            return
        if self._busy is not None and self._arm == "busy":
            self._busy()
        self._stamps.append(self.clock.stamp())
        self._in_block += 1
        if self._in_block >= self.steps_per_block:
            self._close_block()
            self._open_block()
        self._over = self.last_step is not None and step >= self.last_step

    def _calibrate(self, step: int) -> None:
        end = self.clock.stamp()
        self.clock.sync()
        self.step_ms = self.clock.elapsed(self._cal, end) / CALIBRATION_STEPS
        mine = max(1, round(self.block_s * 1000.0 / max(self.step_ms, 1e-3)))
        self.steps_per_block = self._agree(mine)
        self.busy_ms = self.step_ms * self.busy_pct / 100.0
        if "busy" in self.arms:
            self._busy = self._make_busy(self.busy_ms)
        gc.callbacks.append(self._on_gc)
        if self.max_blocks > 0:
            groups = -(-self.max_blocks // len(self.arms))
            self.last_step = step + groups * len(self.arms) * self.steps_per_block
        self._open_block()

    def _agree(self, mine: int) -> int:
        """Rank 0's steps per block, for every rank (blocks must switch at the same step)."""
        dist = self.torch.distributed
        try:
            if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
                return mine
            store = dist.distributed_c10d._get_default_store()
            if dist.get_rank() == 0:
                store.set(STORE_KEY, str(mine))
                return mine
            return int(store.get(STORE_KEY))
        except Exception:  # noqa: BLE001 - no store: every rank's own estimate (ranks run in lockstep)
            return mine

    def _make_busy(self, ms: float) -> Callable[[], None]:
        torch = self.torch
        if self._cuda:
            cycles = int(_spin_cycles_per_ms(torch) * ms)

            def sleep() -> None:  # timed, since clocks move: the block says what was injected
                start = self.clock.stamp()
                torch.cuda._sleep(cycles)
                self._spins.append((start, self.clock.stamp()))

            return sleep

        def spin() -> None:
            start = time.perf_counter()
            until = start + ms / 1000.0
            while time.perf_counter() < until:
                pass
            self._spins.append((start, time.perf_counter()))

        return spin

    def _open_block(self) -> None:
        if not self._order:
            self._order = list(self.arms)
            self._rng.shuffle(self._order)
            self._group += 1
        self._arm = self._order.pop(0)
        self._depth = self._ends = 0
        self._engage(self._arm == "on")
        self._in_block = 0
        self._opened = (self.clock.stamp(), time.process_time(), time.thread_time(), self.hook_s, self.gc_n, self.gc_s)

    def _close_block(self) -> None:
        if self._opened is None:
            return
        stamp, cpu, thread, hook, gc_n, gc_s = self._opened
        self.blocks.append({"group": self._group, "arm": self._arm, "steps": self._in_block,
                            "a": stamp, "b": self._stamps[-1] if self._stamps else self.clock.stamp(),
                            "stamps": self._stamps, "cpu_ms": (time.process_time() - cpu) * 1000.0,
                            "thread_ms": (time.thread_time() - thread) * 1000.0, "spins": self._spins,
                            "hook_ms": (self.hook_s - hook) * 1000.0, "gc": self.gc_n - gc_n,
                            "gc_ms": (self.gc_s - gc_s) * 1000.0})
        self._unread.append(self.blocks[-1])
        self._spins, self._stamps = [], []
        self._opened = None
        self._read()

    def _read(self, final: bool = False) -> None:
        """Blocks whose stamps have all run become numbers, and their events go back to the
        clock for reuse (a new CUDA event costs the host ~140 us, docs/BENCHMARKS.md)."""
        if final:
            self.clock.sync()
        left = []
        for b in self._unread:
            if final or self.clock.done(b["b"]):
                self._to_numbers(b)
            else:
                left.append(b)
        self._unread = left

    def _to_numbers(self, b: dict[str, Any]) -> None:
        elapsed = self.clock.elapsed
        marks = [b["a"], *b["stamps"]]
        b["ms"] = elapsed(b["a"], b["b"])
        b["step_ms"] = [round(elapsed(x, y), 4) for x, y in zip(marks, marks[1:])]
        if b["spins"]:
            b["busy_ms"] = sum(elapsed(x, y) for x, y in b["spins"])
        self.clock.release([*marks, *(s for pair in b["spins"] for s in pair)])
        for key in ("a", "b", "stamps", "spins"):
            del b[key]

    # --- the end -----------------------------------------------------------------------------
    def result(self) -> dict[str, Any]:
        self._read(final=True)
        return {"rank": self.rank, "arms": self.arms, "block_s": self.block_s, "steps_per_block": self.steps_per_block,
                "calibration_step_ms": self.step_ms, "busy_pct": self.busy_pct, "busy_ms": self.busy_ms,
                "device": "cuda" if self._cuda else "cpu", "blocks": self.blocks,
                "hooks": {arm: {name: {"calls": n, "ms": s * 1000.0, "slow": slow} for name, (n, s, slow) in hooks.items()}
                          for arm, hooks in self.per_hook.items()},
                "events_created": getattr(self.clock, "created", None)}

    def write(self, config_path: str | None) -> None:
        if not self.enabled or not self.blocks or not config_path:
            return
        out = Path(config_path).parent / "cost_ab"
        out.mkdir(mode=0o700, exist_ok=True)
        tmp = out / f".rank{self.rank}.json.tmp"
        tmp.write_text(json.dumps(self.result()))
        os.replace(tmp, out / f"rank{self.rank}.json")


def _spin_cycles_per_ms(torch: Any) -> float:
    """How many clock cycles torch.cuda._sleep spins per millisecond on this GPU."""
    cycles = 20_000_000
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    torch.cuda._sleep(cycles)
    end.record()
    end.synchronize()
    return cycles / max(start.elapsed_time(end), 1e-6)
