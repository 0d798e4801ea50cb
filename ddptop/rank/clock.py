"""Stamps for the step tracker: the host's monotonic clock on CPU, CUDA events on a GPU
(recorded on the device's current stream, read back once they have run, so timing never
makes the host wait for the GPU)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any


class HostClock:
    def stamp(self) -> float:
        return time.perf_counter()

    def elapsed(self, a: float, b: float) -> float:
        return (b - a) * 1000.0

    def done(self, stamp: Any) -> bool:  # noqa: ARG002
        return True

    def sync(self) -> None:
        pass


class CudaClock:
    def __init__(self, torch: Any, device: Any) -> None:
        self._cuda = torch.cuda
        self._event = torch.cuda.Event
        self.device = device

    def stamp(self) -> Any:
        event = self._event(enable_timing=True)
        event.record(self._cuda.current_stream(self.device))
        return event

    def elapsed(self, a: Any, b: Any) -> float:
        return a.elapsed_time(b)

    def done(self, stamp: Any) -> bool:
        return stamp.query()

    def sync(self) -> None:
        self._cuda.synchronize(self.device)


class LazyClock:
    """The step tracker's clock until the model's device is known (the first DDP or forward):
    `current()` gives the clock chosen so far (a HostClock when none is yet)."""

    def __init__(self, current: Callable[[], Any]) -> None:
        self._current = current

    def stamp(self) -> Any:
        return self._current().stamp()

    def elapsed(self, a: Any, b: Any) -> float:
        if isinstance(a, float) != isinstance(b, float):
            return 0.0  # stamped before and after the clock was chosen
        return self._current().elapsed(a, b)

    def done(self, stamp: Any) -> bool:
        return isinstance(stamp, float) or self._current().done(stamp)

    def sync(self) -> None:
        self._current().sync()


class AtMostEvery:
    """`ready()` is True at most once in `seconds` (the first call: always): what the rank
    sends or samples less often than every step."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self._at = float("-inf")

    def ready(self) -> bool:
        now = time.monotonic()
        if now - self._at < self.seconds:
            return False
        self._at = now
        return True
