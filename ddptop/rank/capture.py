"""Capture windows on a rank: start and stop a profiler at agreed step
boundaries (the instrument calls it when a step closes, inside the optimizer's hook). torch.profiler writes one Chrome/Perfetto trace per rank; under
nsys (ddptop launched the rank inside `nsys profile --capture-range=cudaProfilerApi`)
the window is cudaProfilerStart/Stop. ddptop summarises the files afterwards."""

from __future__ import annotations

import contextlib
import gzip
import json
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ddptop.rank.client import Probe
from ddptop.wire.protocol import NSYS_WINDOW_RANGE as WINDOW_RANGE
from ddptop.wire.protocol import CaptureCommand

WARMUP_STEPS = 1  # the profiler starts this many steps before a window records (torch: prepare_trace;
# nsys: the capture range opens early and the window's own steps are an NVTX range, WINDOW_RANGE)


@dataclass
class Window:
    capture_id: int
    start: int
    count: int
    out_dir: Path
    profiler: str  # "torch" or "nsys"
    memory: bool = False  # torch.profiler's profile_memory (--set capture_memory=true)
    warmup: int = 0  # steps the profiler ran before recording (its start-up out of the window)

    @property
    def last(self) -> int:
        return self.start + self.count - 1


class CaptureRunner:
    def __init__(self, torch: Any, probe: Probe, rank: int, cuda: bool) -> None:
        self.torch, self.probe, self.rank, self.cuda = torch, probe, rank, cuda
        self.scheduled: list[Window] = []
        self.active: Window | None = None
        self._prof: Any = None
        self._step_ranges: list[contextlib.AbstractContextManager[Any]] = []
        self._nsys_start_s = 0.0
        self.warming: Window | None = None  # a window whose profiler warms up this step
        self._window_range = False  # the NVTX range around an nsys window's own steps is open

    def poll(self, next_step: int) -> None:
        """Take capture commands that arrived; a window already passed is reported missed."""
        while self.probe.commands:
            cmd = CaptureCommand.read(self.probe.commands.popleft())
            if cmd is None:
                continue
            w = Window(cmd.capture_id, cmd.at_step, cmd.count, Path(cmd.out_dir), cmd.profiler, memory=cmd.memory)
            if w.start < next_step:
                self.probe.report_capture(w.capture_id, "failed", error=f"rank {self.rank} was already at step "
                                          f"{next_step} when asked to capture from step {w.start}")
            else:
                self.scheduled.append(w)

    def begin_step(self, step: int) -> None:
        if self.active is None and self.warming is None:
            for w in self.scheduled:
                if w.start - WARMUP_STEPS == step:
                    self._warm(w)  # stays scheduled: it starts recording at its first step
                    break
        if self.active is None:
            for w in self.scheduled:
                if w.start == step:
                    self.scheduled.remove(w)
                    self._start(w)
                    break
        if self.active is not None and self._prof is not None:
            # ProfilerStep#N too (what torch.profiler's schedule writes): Holistic Trace Analysis
            # finds a trace's steps by it (its straggler and per-step analyses)
            for name in (f"ProfilerStep#{step}", f"ddptop_step_{step}"):
                rng = self.torch.profiler.record_function(name)
                rng.__enter__()
                self._step_ranges.append(rng)
        elif self.active is not None and self.active.profiler == "nsys":
            # the same step ranges as NVTX, so `nsys stats` (nvtx_sum) has the window's steps
            with contextlib.suppress(Exception):
                rng = self.torch.cuda.nvtx.range(f"ddptop_step_{step}")
                rng.__enter__()
                self._step_ranges.append(rng)

    def end_step(self, step: int) -> bool:
        """True when a window closed after this step (its trace was written meanwhile)."""
        while self._step_ranges:
            self._step_ranges.pop().__exit__(None, None, None)
        if self.active is not None and step >= self.active.last:
            self._stop()
            return True
        return False

    def _warm(self, w: Window) -> None:
        """The profiler's start-up (CUPTI, its buffers) on the step before the window, so the
        window's first step is the job's, not the profiler's (issue 45): torch.profiler records
        nothing then (its own warmup: prepare_trace); nsys's capture range opens a step early,
        and the window's steps get an NVTX range of their own (WINDOW_RANGE) that its stats keep
        to."""
        try:
            if w.profiler == "nsys":
                self._nsys_start_s = self._nsys_start()
                self.warming = w
                return
            self._prof = self._profiler(w)
            self._prof.prepare_trace()
            self.warming = w
        except Exception:  # noqa: BLE001 - the window then starts cold, and says so
            self._prof, self.warming = None, None

    def _nsys_start(self) -> float:
        """cudaProfilerStart, after a sync: the seconds it held the rank (nsys's own time)."""
        self.torch.cuda.synchronize()
        began = time.perf_counter()
        self.torch.cuda.profiler.start()
        return time.perf_counter() - began

    def _profiler(self, w: Window) -> Any:
        torch = self.torch
        acts = [torch.profiler.ProfilerActivity.CPU]
        if self.cuda:
            acts.append(torch.profiler.ProfilerActivity.CUDA)
        return torch.profiler.profile(activities=acts, profile_memory=w.memory)

    def _start(self, w: Window) -> None:
        torch = self.torch
        self.active = w
        warm = self.warming is w and (self._prof is not None or w.profiler == "nsys")
        self.warming = None
        try:
            w.out_dir.mkdir(parents=True, exist_ok=True)
            if w.profiler == "nsys":
                if warm:
                    w.warmup = WARMUP_STEPS
                else:  # the command came too late to open the range a step early
                    self._nsys_start_s = self._nsys_start()
                with contextlib.suppress(Exception):
                    torch.cuda.nvtx.range_push(WINDOW_RANGE)
                    self._window_range = True
            elif warm:
                self._prof.start_trace()
                w.warmup = WARMUP_STEPS
            else:  # the command came too late to warm up: recording starts cold
                self._prof = self._profiler(w)
                self._prof.start()
            self.probe.report_capture(w.capture_id, "recording", warmup=w.warmup)
        except Exception as exc:  # noqa: BLE001 - a failed capture never stops training
            self.active, self._prof = None, None
            self.probe.report_capture(w.capture_id, "failed", error=f"{type(exc).__name__}: {exc}")

    def _stop(self) -> None:
        torch = self.torch
        w, self.active = self.active, None
        assert w is not None
        try:
            if w.profiler == "nsys":
                if self._window_range:
                    self._window_range = False
                    with contextlib.suppress(Exception):
                        torch.cuda.nvtx.range_pop()
                torch.cuda.synchronize()
                began = time.perf_counter()
                torch.cuda.profiler.stop()  # with --capture-range-end=repeat nsys writes the window here
                times = {"start_s": round(self._nsys_start_s, 4), "stop_s": round(time.perf_counter() - began, 4),
                         "steps": [w.start, w.last]}
                path = w.out_dir / f"rank{self.rank}.nsys-window"  # read by ddptop.run.nsys.window_times
                path.write_text(json.dumps(times))
                files = [str(path)]  # nsys writes its report itself, found after the run
            else:
                prof, self._prof = self._prof, None
                prof.stop()
                files = [str(write_trace(prof, w.out_dir / f"rank{self.rank}.trace.json"))]
            self.probe.report_capture(w.capture_id, "written", files)
        except Exception as exc:  # noqa: BLE001
            self._prof = None
            self.probe.report_capture(w.capture_id, "failed", error=f"{type(exc).__name__}: {exc}")


def write_trace(prof: Any, path: Path) -> Path:
    """Export the window's Chrome trace next to `path`, gzipped (`.json.gz`: Perfetto, HTA and
    `ddptop trace` read it; a ViT-L/32 window is 19 MB of JSON, 1.5 MB gzipped). torch's own
    `.gz` export uses level 9 (0.59 s for that trace, the rank waits); level 6 takes 0.13 s for
    10% more bytes. If compressing fails (a full disk) the plain JSON is kept."""
    prof.export_chrome_trace(str(path))
    packed = path.with_name(path.name + ".gz")
    try:
        with open(path, "rb") as src, gzip.open(packed, "wb", compresslevel=6) as dst:
            shutil.copyfileobj(src, dst, 1 << 20)
    except OSError:
        packed.unlink(missing_ok=True)
        return path
    path.unlink()
    return packed


def nsys_active() -> bool:
    return bool(os.environ.get("NSYS_PROFILING_SESSION_ID") or os.environ.get("DDPTOP_NSYS"))
