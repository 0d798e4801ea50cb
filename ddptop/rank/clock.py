"""Stamps for the step tracker: the host's monotonic clock on CPU, CUDA events on a GPU
(recorded on the device's current stream, read back once they have run, so timing never
makes the host wait for the GPU). A GPU stamp reuses an event already read (`release`) and
the stream object of the current stream, so a stamp is one record call: a new event and a
new Stream object per stamp cost the host ~100 us a stamp on an H100 under NCCL
(docs/BENCHMARKS.md)."""

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

    def release(self, stamps: list[Any]) -> None:
        pass


POOL = 512  # events kept for reuse at most
STREAMS = 64  # stream objects remembered at most


class CudaClock:
    def __init__(self, torch: Any, device: Any) -> None:
        self._cuda = torch.cuda
        self._event = torch.cuda.Event
        self.device = device
        self._index = device.index if device.index is not None else torch.cuda.current_device()
        # the current stream's identity, without building a Stream object (torch.cuda.current_stream's own call)
        self._raw: Any = getattr(torch._C, "_cuda_getCurrentStream", None)
        self._streams: dict[Any, Any] = {}
        self._free: list[Any] = []
        self.created = 0  # events made (not reused): each cost the host ~140 us on an H100

    def _stream(self) -> Any:
        if self._raw is None:
            return self._cuda.current_stream(self.device)
        key = self._raw(self._index)
        stream = self._streams.get(key)
        if stream is None:
            if len(self._streams) >= STREAMS:
                self._streams.clear()
            stream = self._streams[key] = self._cuda.current_stream(self.device)
        return stream

    def stamp(self) -> Any:
        if self._free:
            event = self._free.pop()
        else:
            event = self._event(enable_timing=True)
            self.created += 1
        event.record(self._stream())
        return event

    def release(self, stamps: list[Any]) -> None:
        """Events whose times have been read and that nothing refers to any more."""
        room = POOL - len(self._free)
        if room > 0:
            self._free.extend(stamps[:room])

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

    def chosen(self, clock: Any) -> None:
        """The clock is chosen: stamps go to it directly (two calls less a stamp)."""
        self.stamp = clock.stamp  # type: ignore[method-assign]

    def elapsed(self, a: Any, b: Any) -> float:
        if isinstance(a, float) != isinstance(b, float):
            return 0.0  # stamped before and after the clock was chosen
        return self._current().elapsed(a, b)

    def done(self, stamp: Any) -> bool:
        return isinstance(stamp, float) or self._current().done(stamp)

    def sync(self) -> None:
        self._current().sync()

    def release(self, stamps: list[Any]) -> None:
        self._current().release([s for s in stamps if not isinstance(s, float)])


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
