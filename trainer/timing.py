"""Per-step phase timing: CUDA events on GPU (read back a step or two later, so
timing never forces a sync), a monotonic clock on CPU, NVTX ranges on GPU."""

from __future__ import annotations

import collections
import time
from typing import Any

import torch

from trainer.comm import summarize

PHASE_KEYS = {"data": "data_ms", "forward": "forward_ms", "backward": "backward_ms",
              "optimizer": "optimizer_ms"}


class StepClock:
    """Call begin_step(), then mark(phase) at the end of each phase (a phase may
    repeat, e.g. with gradient accumulation), then end_step(). Finished records
    come out of ready() in step order."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self._pending: collections.deque[tuple[int, list[tuple[str, Any]], dict[str, Any]]] = (
            collections.deque()
        )
        self._marks: list[tuple[str, Any]] = []
        self._last = self._stamp()  # end of the previous step = start of this one
        self._nvtx_open = 0

    def _stamp(self) -> Any:
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            return event
        return time.perf_counter()

    def _push(self, name: str) -> None:
        if self.cuda:
            torch.cuda.nvtx.range_push(name)
            self._nvtx_open += 1

    def _pop(self) -> None:
        if self.cuda and self._nvtx_open:
            torch.cuda.nvtx.range_pop()
            self._nvtx_open -= 1

    def begin_step(self, step: int) -> None:
        self._marks = [("start", self._last)]
        self._push(f"step {step}")
        self._push("data")

    def mark(self, phase: str, next_phase: str | None = None) -> None:
        self._pop()
        self._marks.append((phase, self._stamp()))
        if next_phase:
            self._push(next_phase)

    def end_step(self, step: int, extra: dict[str, Any], comm: list[list[Any]] | None = None) -> None:
        self._pop()  # the step range
        self._last = self._marks[-1][1]
        self._pending.append((step, self._marks, {**extra, "_comm": comm or []}))

    def restart(self) -> None:
        """The next step starts now, not when the last one ended: time spent between
        steps (a profiler writing its trace) belongs to no step."""
        self._last = self._stamp()

    def ready(self, flush: bool = False) -> list[dict[str, float]]:
        if flush and self.cuda:
            torch.cuda.synchronize()
        out = []
        while self._pending:
            step, marks, extra = self._pending[0]
            if self.cuda and not flush and not marks[-1][1].query():
                break
            self._pending.popleft()
            out.append(self._record(step, marks, extra))
        return out

    def _record(self, step: int, marks: list[tuple[str, Any]], extra: dict[str, Any]) -> dict[str, float]:
        rec: dict[str, float] = dict.fromkeys(PHASE_KEYS.values(), 0.0)
        for (_, a), (phase, b) in zip(marks, marks[1:]):
            rec[PHASE_KEYS[phase]] += self._elapsed(a, b)
        rec["step_ms"] = self._elapsed(marks[0][1], marks[-1][1])
        rec["step"] = step
        comm = extra.pop("_comm")
        if comm:
            backward_end = next(stamp for phase, stamp in reversed(marks) if phase == "backward")
            rec.update(summarize(comm, marks[0][1], backward_end, self._elapsed))
        for key, value in extra.items():
            rec[key] = value.item() if isinstance(value, torch.Tensor) else value
        return rec

    def _elapsed(self, a: Any, b: Any) -> float:
        return a.elapsed_time(b) if self.cuda else (b - a) * 1000.0
