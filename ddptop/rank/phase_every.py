"""`--set phase_every=K`: the rank-side layer engaged on one step in K, bypassed on the others.

What the layer costs a step is its hooks' (docs/BENCHMARKS.md, session 15: +0.7 ms a step of a
launch-bound GPT at one rank, nine CUDA-event stamps and the forward and backward hooks of its
micro-batches). Engaged one step in K, it costs about 1/K of that: the other steps run with its
forward hooks removed and no stamp, as cost_ab's bypassed arm does (the instrument's `_engage`),
and send no record; the optimizer hooks still count every step, so the agreed stop and the step
limit stay exact. The figures are then the engaged steps' (a sample of the run's steps, the same
step numbers on every rank). While a capture is asked for or runs, every step is engaged. Off (K = 1)
by default; not with cost_ab, which switches the layer itself. Pure: no torch, no I/O.
"""

from __future__ import annotations

from typing import Any


class PhaseEvery:
    def __init__(self, settings: dict[str, Any]) -> None:
        self.k = max(1, int(settings.get("phase_every") or 1))

    @property
    def on(self) -> bool:
        return self.k > 1

    def engaged_after(self, step: int, captures: Any, commands: Any) -> bool:
        """Whether the layer is engaged from the boundary after step `step` (0-based): every Kth
        step, and while a command waits to be read (a capture's request) or a window is due or
        running."""
        if (step + 1) % self.k == 0 or commands:
            return True
        return captures is not None and bool(captures.scheduled or captures.active is not None
                                             or captures.warming is not None)
