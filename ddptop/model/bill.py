"""The bill of costs: what ddptop's always-on parts cost a job, per kernel launch, per
all-reduce and per step, as measured on a GPU (docs/BENCHMARKS.md "Bill of costs"), and the cost
they predict for a run. Pure: the figures are data, the prediction arithmetic.

Measured 2026-11-27 on 2 of a 4x H200 host (NV18), torch 2.11.0+cu130, NCCL 2.28.9, each
variant a fresh torchrun of bench/bill_of_costs.py, ranks pinned to one core each, 3 rounds
interleaved: mean difference from plain torchrun with a t 95% interval over rounds
(docs/measurements/2026-11-27-issue42/call3_bill.json). The per-step figure is the rank-side
hooks' own, from the in-run A/B (`--cost`) of the fourth session (2x H100: +36 to +77 us a step
over four workloads).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Figure:
    us: float
    lo: float
    hi: float


# everything ddptop turns on at once, the worker run under `ddptop -- ...` against plain torchrun
PER_LAUNCH = Figure(1.56, -0.43, 3.55)  # a tiny kernel's launch (not resolved: the interval holds 0)
PER_ALLREDUCE = Figure(16.6, 7.6, 25.5)  # a 4 KiB all-reduce on a step the plugin does not stamp
PER_ALLREDUCE_STAMPED = Figure(21.7, -9.3, 52.8)  # ...on a stamped step (one in comm_timing_every)
PER_STEP_HOOKS = Figure(56.0, 36.0, 77.0)  # the rank-side hooks, per optimizer step
MEASURED = "2026-11-27, 2x H200 (NV18), torch 2.11, NCCL 2.28.9"

# the parts one by one (same runs): what each adds to a launch and an all-reduce, us
PARTS: tuple[tuple[str, Figure | None, Figure | None, str], ...] = (
    ("nsys wrapper (no capture running; the old --profiler auto)", Figure(2.65, 0.03, 5.28),
     Figure(8.9, -6.0, 23.8), "off by default now: only --profiler nsys wraps the ranks"),
    ("NCCL completion hook (+TORCH_NCCL_ENABLE_TIMING)", Figure(1.67, -0.84, 4.18),
     Figure(36.3, 3.7, 68.9), "on: the all-reduces' own times (comm_ms); one Python call per collective"),
    ("everything the launcher sets (timing, hook, flight recorder, NCCL_DEBUG=INFO to a file, "
     "the plugin, torchrun's log capture)", Figure(2.55, 0.56, 4.54), Figure(37.2, 21.3, 53.1), "on"),
    ("the same, plugin mask on (a stamped step)", None, Figure(64.7, 42.5, 86.8), "one step in comm_timing_every"),
    ("under ddptop (all of it, the rank-side layer and the monitor too)", PER_LAUNCH, PER_ALLREDUCE, "on"),
)


@dataclass(frozen=True)
class Prediction:
    us: float
    lo: float
    hi: float
    allreduces: float
    every: int  # the plugin stamps one step in this many

    def text(self) -> str:
        return (f"the bill predicts {self.us:+.0f} us a step per rank [{self.lo:+.0f}, {self.hi:+.0f}] for "
                f"{self.allreduces:g} all-reduce(s) a step, plus {PER_LAUNCH.us:+.1f} us "
                f"[{PER_LAUNCH.lo:+.1f}, {PER_LAUNCH.hi:+.1f}] per kernel launch (launches are not counted; "
                f"bill of {MEASURED})")


def predict(allreduces_per_step: float, every: int = 10) -> Prediction:
    """The bill's cost of one step with this many all-reduces, the plugin stamping one step in
    `every`; kernel launches are left to the reader (their figure is not resolved)."""
    share = 1.0 / max(every, 1)

    def part(pick: str) -> float:
        per = ((1 - share) * getattr(PER_ALLREDUCE, pick) + share * getattr(PER_ALLREDUCE_STAMPED, pick))
        return getattr(PER_STEP_HOOKS, pick) + allreduces_per_step * per

    return Prediction(part("us"), part("lo"), part("hi"), allreduces_per_step, every)
