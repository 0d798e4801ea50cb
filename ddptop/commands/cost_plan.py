"""What one `ddptop cost` measures and of what: the plan of its runs (the command, the ranks,
each rank's CPUs) and each run's record. Plain data, shared by commands/cost (which runs them)
and commands/cost_report (which reports them)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from ddptop.model.config import RunConfig
from ddptop.model.usage import UsageError


@dataclass(frozen=True)
class Plan:
    cmd: list[str]
    nproc: int
    pairs: int
    warmup: int | None
    cpus: list[list[int]]
    timeout: float
    ddptop_args: list[str]
    config: RunConfig | None  # --preset: the demo's config, written for both arms
    lockstep: bool = False  # both arms at once, taking turns step by step
    pin_main: bool = False  # --lockstep: each rank's main thread on one core, the same in both jobs
    phase_every: int = 1  # the ddptop arm's --set phase_every (its layer engaged one step in this many)


@dataclass
class RunRecord:
    pair: int
    arm: str
    rc: int
    wall_s: float
    ranks: dict[int, list[float]]
    stderr: list[str]  # the ranks' stderr (plain: torchrun's whole stderr)
    summary: dict[str, Any] | None  # ddptop's own summary (ddptop arm)
    step_ms: float | None = None
    allreduces: float | None = None  # DDP's all-reduces a step, as ddptop's records count them (ddptop arm)
    every: int = 10  # the run's comm_timing_every (ddptop arm)
    nccl_timing: bool = False  # the run had NCCL time its collectives (ddptop arm)
    timed: float | None = None  # the share of its steps the ddptop arm timed (phase_every: one in K after the first)
    starts: dict[int, list[float]] = field(default_factory=dict)  # --lockstep: when each rank's turns came back


def cpu_lists(text: str, nproc: int, available: list[int] | None = None) -> list[list[int]]:
    """Each local rank's CPUs: `auto` splits the CPUs this process may use evenly (none where
    there are fewer CPUs than ranks), `none` pins nothing, else `;`-separated lists of ranges."""
    if text == "none":
        return []
    if text == "auto":
        cpus = sorted(available if available is not None else os.sched_getaffinity(0))
        each = len(cpus) // nproc
        return [cpus[i * each:(i + 1) * each] for i in range(nproc)] if each else []
    try:
        out = [_ranges(part) for part in text.split(";")]
    except ValueError:
        raise UsageError(f"--cpus: expected auto, none or lists like '0-7;8-15', got {text!r}") from None
    if len(out) != nproc or not all(out):
        raise UsageError(f"--cpus names {len(out)} CPU list(s) for {nproc} rank(s)")
    return out


def _ranges(part: str) -> list[int]:
    cpus: list[int] = []
    for item in part.split(","):
        lo, _, hi = item.strip().partition("-")
        cpus += range(int(lo), int(hi or lo) + 1)
    return cpus
