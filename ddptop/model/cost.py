"""What ddptop's rank-side layer cost a run (`--set cost_ab`): the figures
ddptop.analysis.cost_ab estimates from the ranks' blocks, as the run's state holds them. Pure."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Estimate:
    median: float
    lo: float  # bootstrap 95% interval of the median
    hi: float
    n: int  # groups

    def as_dict(self) -> dict[str, float]:
        return {"median": self.median, "lo": self.lo, "hi": self.hi, "n": self.n}


@dataclass(frozen=True)
class ArmCost:
    arm: str  # compared with "off"
    ratio: Estimate  # off's ms per step / this arm's: the arm's throughput relative to off (1: no cost)
    ms_per_step: Estimate  # this arm's ms per step minus off's, per rank
    cpu_us_per_step: Estimate  # process CPU time per step (all threads) minus off's, per rank
    step_ms: float  # off's median ms per step
    injected_ms: float | None = None  # busy: the spins' own time per step, as timed in the rank
    # the same on each block's median step (the typical step: a rare long step, whoever caused
    # it, moves the mean, not this), where the ranks stamped every step
    typical: Estimate | None = None
    hook_us_per_step: Estimate | None = None  # host time inside the layer's hooks, minus off's
    gc: dict[str, float] | None = None  # collections per 1000 steps and their ms per step, per arm

    def as_dict(self) -> dict[str, Any]:
        out = {"arm": self.arm, "ratio": self.ratio.as_dict(), "ms_per_step": self.ms_per_step.as_dict(),
               "cpu_us_per_step": self.cpu_us_per_step.as_dict(), "step_ms": self.step_ms,
               "injected_ms": self.injected_ms}
        if self.typical is not None:
            out["typical_ratio"] = self.typical.as_dict()
        if self.hook_us_per_step is not None:
            out["hook_us_per_step"] = self.hook_us_per_step.as_dict()
        if self.gc is not None:
            out["gc"] = self.gc
        return out


@dataclass(frozen=True)
class RunCost:
    """What the layer cost one run: each arm against off, with its verdict."""

    groups: int
    step_ms: float  # off's median ms per step
    arms: list[ArmCost]
    verdicts: dict[str, str]  # arm -> its verdict (verdicts())

    def to_dict(self) -> dict[str, Any]:
        """The run summary's `cost` (strict JSON: a figure with nothing behind it is null)."""
        return _no_nan({"groups": self.groups, "step_ms": self.step_ms,
                        "arms": [c.as_dict() | {"verdict": self.verdicts[c.arm]} for c in self.arms]})


def _no_nan(value: Any) -> Any:
    """NaN (a figure with nothing to estimate it from) as None: the summary is strict JSON."""
    if isinstance(value, float) and value != value:
        return None
    if isinstance(value, dict):
        return {k: _no_nan(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_no_nan(v) for v in value]
    return value
