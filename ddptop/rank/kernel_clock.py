"""Each all-reduce's kernel time, from ddptop's NCCL profiler plugin (ddptop/run/nccl_plugin.c).

NCCL's own timing (TORCH_NCCL_ENABLE_TIMING) spans a start event recorded before NCCL's host
code launches the kernel: on a rank whose collectives wait for nothing, each span carries
~15 µs of launch latency (HF's Trainer: 42 all-reduces of 0.17 ms over 3 steps read 1.14-1.33x
the trace's kernels; docs/GPU.md). Where ddptop's launcher built the plugin and NCCL loaded it
(NCCL >= 2.28), every channel of the kernel stamps the GPU's clock when it starts and ends, and
the plugin keeps (host issue time, kernel ns) per all-reduce. `NcclTimes` (ddptop.rank.comm)
still learns which all-reduces are its group's, and when they were issued, from the process
group's completion hook; it asks `kernel_ms` for each one's kernel time.

The plugin is the same library NCCL opened (dlopen of one path shares its state), read with
ctypes: no compiler, no CUDA call on this side.
"""

from __future__ import annotations

import collections
import ctypes
import os
from typing import Any

from ddptop.wire import protocol

PLUGIN_ENV = protocol.ENV_NCCL_PROFILER_PLUGIN
SKEW_S = 0.0005  # NCCL starts the collective after its Work was made: a record never precedes it by more
WINDOW_S = 0.05  # ...and follows within this (the host's launch path, a GIL hand-over)
BATCH = 512


class KernelClock:
    """The plugin of this process, or None from `open` (with why) where there is none."""

    def __init__(self, lib: Any) -> None:
        self._lib = lib
        self._buf = (ctypes.c_uint64 * (4 * BATCH))()
        self._by_comm: dict[int, collections.deque[tuple[float, float]]] = {}
        self.matched = 0
        self.missed = 0  # all-reduces reported by NCCL's hook with no kernel time here

    @classmethod
    def open(cls, environ: dict[str, str] | None = None) -> tuple[KernelClock | None, str]:
        env = os.environ if environ is None else environ
        path = env.get(PLUGIN_ENV, "")
        if not path:
            return None, env.get(protocol.ENV_NCCL_PLUGIN_WHY) or "ddptop's NCCL profiler plugin was not built for this run"
        other = f"{PLUGIN_ENV} names another profiler plugin ({os.path.basename(path)})"
        if os.path.basename(path) != protocol.NCCL_PLUGIN_LIBRARY:
            return None, other  # the user's own: not opened here (NCCL opens it)
        try:
            lib = ctypes.CDLL(path)
            take = lib.ddptop_nccl_take
        except (OSError, AttributeError):
            return None, other
        take.argtypes = [ctypes.POINTER(ctypes.c_uint64), ctypes.c_int]
        take.restype = ctypes.c_int
        lib.ddptop_nccl_enable.argtypes = [ctypes.c_int]
        lib.ddptop_nccl_comms.restype = ctypes.c_int
        lib.ddptop_nccl_dropped.restype = ctypes.c_uint64
        return cls(lib), ""

    def loaded(self) -> bool:
        """NCCL initialised a communicator with the plugin (none: NCCL < 2.28, or not yet)."""
        return int(self._lib.ddptop_nccl_comms()) > 0

    def dropped(self) -> int:
        return int(self._lib.ddptop_nccl_dropped())

    def enable(self, on: bool) -> None:
        """Kernel stamps on or off for the collectives called from now on (the cost A/B)."""
        self._lib.ddptop_nccl_enable(1 if on else 0)

    def drain(self) -> None:
        """Collects what the plugin finished since the last call (once per read of a step's
        all-reduces: one ctypes call per 512)."""
        buf = self._buf
        while True:
            n = int(self._lib.ddptop_nccl_take(buf, BATCH))
            for i in range(n):
                host_ns, kernel_ns, comm = buf[4 * i], buf[4 * i + 1], buf[4 * i + 2]
                queue = self._by_comm.setdefault(comm, collections.deque(maxlen=1 << 16))
                queue.append((host_ns / 1e9, kernel_ns / 1e6))
            if n < BATCH:
                return

    def kernel_ms(self, issued: float, comm: int | None) -> tuple[float | None, int | None]:
        """The kernel time (ms) of the all-reduce issued at host time `issued` on communicator
        `comm` (None: not known yet, the nearest record of any decides), and its communicator,
        from the records drained so far."""
        found = match(self._by_comm, issued, comm)
        if found is None:
            self.missed += 1
            return None, comm
        self.matched += 1
        return found


def match(by_comm: dict[int, collections.deque[tuple[float, float]]], issued: float,
          comm: int | None) -> tuple[float, int] | None:
    """Pure: pops the record of the all-reduce issued at `issued` from `by_comm` (per
    communicator, oldest first), dropping that communicator's older ones (their all-reduces
    were another group's, or went unreported). None when no record starts in the window."""
    best: tuple[float, int] | None = None
    for key, queue in by_comm.items():
        if comm is not None and key != comm:
            continue
        while queue and queue[0][0] < issued - SKEW_S:
            queue.popleft()
        if queue and queue[0][0] <= issued + WINDOW_S and (best is None or queue[0][0] < best[0]):
            best = (queue[0][0], key)
    if best is None:
        return None
    return by_comm[best[1]].popleft()[1], best[1]
