"""Stamps for the step tracker: the host's monotonic clock on CPU, CUDA events on a GPU
(recorded on the device's current stream, read back once they have run, so timing never
makes the host wait for the GPU). A GPU stamp reuses an event already read (`release`) and
the stream object of the current stream, so a stamp is one record call: a new event and a
new Stream object per stamp cost the host ~100 us a stamp on an H100 under NCCL; a reused
event is recorded by the driver's cuEventRecord with the GIL held (torch's record lets go of
it, and taking it back inside a step is what a stamp cost) (docs/BENCHMARKS.md)."""

from __future__ import annotations

import ctypes
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


def driver_record() -> Callable[[int, int], int] | None:
    """The CUDA driver's cuEventRecord(event, stream), called with the GIL held (ctypes.PyDLL).
    torch's Event.record lets go of the GIL around the same call; inside a training step,
    where other threads wait for it (NCCL's completion hook, autograd's device thread), taking
    it back cost 15-40 us a stamp against 2-3 us alone (2x H200, docs/BENCHMARKS.md). None
    where the driver cannot be loaded (torch's record then)."""
    try:
        fn = ctypes.PyDLL("libcuda.so.1").cuEventRecord
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
    fn.restype = ctypes.c_int
    return fn


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
        self._record = driver_record()

    def _stream(self) -> tuple[Any, int]:
        """The current stream's object and its CUDA handle."""
        if self._raw is None:
            stream = self._cuda.current_stream(self.device)
            return stream, stream.cuda_stream
        key = self._raw(self._index)
        found = self._streams.get(key)
        if found is None:
            if len(self._streams) >= STREAMS:
                self._streams.clear()
            stream = self._cuda.current_stream(self.device)
            found = self._streams[key] = (stream, stream.cuda_stream)
        return found

    def stamp(self) -> Any:
        stream, handle = self._stream()
        if self._free:
            event = self._free.pop()
            if self._record is not None:  # an event torch made and recorded once: the driver's call
                if self._record(event.cuda_event, handle) == 0:
                    return event
                self._record = None  # refused: torch's record from now on
        else:
            event = self._event(enable_timing=True)
            self.created += 1
        event.record(stream)
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
