"""An nsys capture window on a rank (ddptop.rank.capture, issue 45): the capture range opens
one step before the window, so nsys's start-up lands on a step outside it, and the window's own
steps sit in one NVTX range (`ddptop_window`) that `nsys stats --filter-nvtx` keeps to. The
torch calls are stand-ins that record their order: CUDA is not on this machine; the GPU run of
the same path is `bash bench/gpu_check.sh nsysrun`."""

from __future__ import annotations

import collections
import contextlib
import json
from pathlib import Path
from types import SimpleNamespace

from ddptop.rank.capture import CaptureRunner
from ddptop.wire.protocol import NSYS_WINDOW_RANGE, CaptureCommand, Command


class Torch:
    def __init__(self) -> None:
        self.calls: list[str] = []
        say = self.calls.append

        @contextlib.contextmanager
        def nvtx_range(name: str):
            say(f"push {name}")
            yield
            say(f"pop {name}")

        self.cuda = SimpleNamespace(
            synchronize=lambda: say("sync"),
            profiler=SimpleNamespace(start=lambda: say("start"), stop=lambda: say("stop")),
            nvtx=SimpleNamespace(range=nvtx_range, range_push=lambda n: say(f"push {n}"),
                                 range_pop=lambda: say("pop window")))


class Probe:
    def __init__(self) -> None:
        self.commands: collections.deque[Command] = collections.deque()
        self.reports: list[tuple] = []

    def report_capture(self, capture_id, status, files=None, error="", warmup=0) -> None:  # noqa: ANN001
        self.reports.append((capture_id, status, warmup, error))


def run_steps(tmp_path: Path, at_step: int, first: int, last: int) -> tuple[Torch, Probe, dict[int, list[str]]]:
    torch = Torch()
    cmd = CaptureCommand(1, at_step, 2, str(tmp_path / "1"), "nsys").to_command()
    probe = Probe()
    probe.commands = collections.deque([cmd])
    runner = CaptureRunner(torch, probe, rank=0, cuda=True)
    by_step: dict[int, list[str]] = {}
    for step in range(first, last + 1):
        runner.poll(step)
        before = len(torch.calls)
        runner.begin_step(step)
        runner.end_step(step)
        by_step[step] = torch.calls[before:]
    return torch, probe, by_step


def test_the_range_opens_a_step_early_and_the_windows_steps_are_one_nvtx_range(tmp_path):
    torch, probe, by_step = run_steps(tmp_path, at_step=10, first=8, last=12)
    assert by_step[8] == []
    assert by_step[9] == ["sync", "start"]  # the warmup step: nsys's start-up here
    assert by_step[10] == [f"push {NSYS_WINDOW_RANGE}", "push ddptop_step_10", "pop ddptop_step_10"]
    assert by_step[11] == ["push ddptop_step_11", "pop ddptop_step_11", "pop window", "sync", "stop"]
    assert by_step[12] == []
    assert [(r[1], r[2]) for r in probe.reports] == [("recording", 1), ("written", 0)]  # the warmup: with "recording"
    times = json.loads((tmp_path / "1" / "rank0.nsys-window").read_text())
    assert times["steps"] == [10, 11] and times["start_s"] >= 0.0


def test_a_window_asked_for_too_late_to_warm_up_starts_cold_and_says_so(tmp_path):
    torch, probe, by_step = run_steps(tmp_path, at_step=10, first=10, last=11)
    assert by_step[10] == ["sync", "start", f"push {NSYS_WINDOW_RANGE}", "push ddptop_step_10", "pop ddptop_step_10"]
    assert [(r[1], r[2]) for r in probe.reports] == [("recording", 0), ("written", 0)]
