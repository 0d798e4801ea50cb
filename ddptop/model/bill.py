"""The bill of costs: what ddptop's always-on parts cost a job, per kernel launch, per
all-reduce and per step, as measured on a GPU (docs/BENCHMARKS.md "Bill of costs"), and the cost
they predict for a run. Pure: the figures are data, the prediction arithmetic.

Measured 2026-11-27 on 2 of a 4x H200 host (NV18), torch 2.11.0+cu130, NCCL 2.28.9, each
variant a fresh torchrun of bench/bill_of_costs.py, ranks pinned to one core each, 3 rounds
interleaved: mean difference from plain torchrun with a t 95% interval over rounds
(docs/measurements/2026-11-27-issue42/call3_bill.json). The per-step figure is the rank-side
hooks' own, from the in-run A/B (`--cost`) of the fourth session (2x H100: +36 to +77 us a step
over four workloads). The per-launch figure is the lock-step bill of 2026-11-28 (session 14):
the plain job and the ddptop job at once, rank r of each on the same core and GPU, taking turns
burst by burst, 4 rounds, A/A +0.005 [-0.33, +0.34] us (docs/measurements/2026-11-28-s14-call2).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Figure:
    us: float
    lo: float
    hi: float


# everything ddptop turns on at once, the worker run under `ddptop -- ...` against plain torchrun
PER_LAUNCH = Figure(-0.01, -0.46, 0.45)  # a tiny kernel's launch, today's default (lock-step: nothing of ddptop runs in a launch)
LAUNCH_MEASURED = "2026-11-28 in lock-step, 2 of a 4x H200 host"
PER_ALLREDUCE = Figure(16.6, 7.6, 25.5)  # a 4 KiB all-reduce on a step the plugin does not stamp
PER_ALLREDUCE_STAMPED = Figure(21.7, -9.3, 52.8)  # ...on a stamped step (one in comm_timing_every)
PER_STEP_HOOKS = Figure(56.0, 36.0, 77.0)  # the rank-side hooks, per optimizer step
# without NCCL's timing (the default since issue 42's session 7): the flight recorder and
# NCCL_DEBUG=INFO to a file, each within the +-5 us the plain all-reduce itself moved by
PER_ALLREDUCE_UNTIMED = Figure(0.0, -5.0, 5.0)
# what TORCH_NCCL_ENABLE_TIMING did to a whole step of the ViT-L demo (one 1.2 GB all-reduce a
# step), ddptop with and without it against plain torchrun, 2026-11-27, 2x H200: a cost no
# per-collective micro-benchmark shows (timing events on NCCL's stream; pytorch/pytorch#143890)
NCCL_TIMING_VIT_STEP = Figure(1234.0, 680.0, 1787.0)
MEASURED = "2026-11-27, 2x H200 (NV18), torch 2.11, NCCL 2.28.9"

# the parts one by one (same runs): what each adds to a launch and an all-reduce, us
PARTS: tuple[tuple[str, Figure | None, Figure | None, str], ...] = (
    ("nsys wrapper (no capture running; the old --profiler auto)", Figure(2.65, 0.03, 5.28),
     Figure(8.9, -6.0, 23.8), "off by default now: only --profiler nsys wraps the ranks"),
    ("NCCL completion hook (+TORCH_NCCL_ENABLE_TIMING)", Figure(1.67, -0.84, 4.18),
     Figure(36.3, 3.7, 68.9), "off by default (nccl_timing): +1.2 ms a ViT-L step beyond these figures"),
    ("everything the launcher sets (timing, hook, flight recorder, NCCL_DEBUG=INFO to a file, "
     "the plugin, torchrun's log capture)", Figure(2.55, 0.56, 4.54), Figure(37.2, 21.3, 53.1),
     "timing, hook and plugin only with nccl_timing; the rest on"),
    ("the same, plugin mask on (a stamped step)", None, Figure(64.7, 42.5, 86.8),
     "with nccl_timing: one step in comm_timing_every"),
    ("under ddptop (all of it, the rank-side layer and the monitor too; NCCL's timing on)", Figure(1.56, -0.43, 3.55),
     PER_ALLREDUCE, "the fifth session's default"),
    ("under ddptop, today's default, in lock-step (2026-11-28)", PER_LAUNCH, None, "on"),
)


@dataclass(frozen=True)
class Prediction:
    us: float
    lo: float
    hi: float
    allreduces: float | None  # None: not counted (nothing times them in the run)
    every: int  # the plugin stamps one step in this many
    nccl_timing: bool = False
    hooks: Figure = PER_STEP_HOOKS  # the rank-side hooks' share a step: the bill's own, or measured on the script
    hooks_measured: bool = False  # `hooks` is the script's own (ddptop cost's in-run A/B)

    def text(self) -> str:
        counted = ("all-reduces not counted (not timed in the run: nccl_timing / gloo_timing off; the bill puts each within "
                   f"{PER_ALLREDUCE_UNTIMED.lo:+.0f}..{PER_ALLREDUCE_UNTIMED.hi:+.0f} us)"
                   if self.allreduces is None else f"{self.allreduces:g} all-reduce(s) a step")
        timing = (f"; with nccl_timing on, more where comm overlaps compute (the ViT-L demo: "
                  f"{NCCL_TIMING_VIT_STEP.us:+.0f} us [{NCCL_TIMING_VIT_STEP.lo:+.0f}, {NCCL_TIMING_VIT_STEP.hi:+.0f}])"
                  if self.nccl_timing else "")
        hooks = (f"the rank-side hooks {self.hooks.us:+.0f} us [{self.hooks.lo:+.0f}, {self.hooks.hi:+.0f}] as "
                 "measured on this script in one more run (engaged vs bypassed)" if self.hooks_measured else
                 f"the rank-side hooks {self.hooks.us:+.0f} us [{self.hooks.lo:+.0f}, {self.hooks.hi:+.0f}] from "
                 "other scripts (2x H100, 2026-11-26; a launch-bound script's own can be ten times that)")
        return (f"the bill predicts {self.us:+.0f} us a step per rank [{self.lo:+.0f}, {self.hi:+.0f}]: {hooks}, "
                f"{counted}, plus {PER_LAUNCH.us:+.2f} us [{PER_LAUNCH.lo:+.2f}, {PER_LAUNCH.hi:+.2f}] per kernel "
                f"launch (launches are not counted; {LAUNCH_MEASURED}; the rest: {MEASURED}){timing}")


def predict(allreduces_per_step: float | None, every: int = 10, nccl_timing: bool = False,
            hooks: Figure | None = None) -> Prediction:
    """The bill's cost of one step with this many all-reduces (None: not counted), the plugin
    stamping one step in `every` where NCCL's timing is on, and the rank-side hooks' share (`hooks`:
    measured on the script itself; None: the bill's generic figure); kernel launches are left to
    the reader (their figure is not resolved), and so is timing's effect on overlap (said)."""
    share = 1.0 / max(every, 1)
    per_step = hooks if hooks is not None else PER_STEP_HOOKS

    def part(pick: str) -> float:
        if not nccl_timing:
            per = getattr(PER_ALLREDUCE_UNTIMED, pick)
        else:
            per = ((1 - share) * getattr(PER_ALLREDUCE, pick) + share * getattr(PER_ALLREDUCE_STAMPED, pick))
        return getattr(per_step, pick) + (allreduces_per_step or 0.0) * per

    return Prediction(part("us"), part("lo"), part("hi"), allreduces_per_step, every, nccl_timing, per_step,
                      hooks is not None)
