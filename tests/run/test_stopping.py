"""The stop's last resorts (ddptop.run.stopping.Stopper), with a launcher that does what a
real torchrun did: it swallows a SIGINT that comes while it starts (plain torchrun too, for
its first ~1.5 s, 2026-11-28), and its rank, a script that never imports torch, never says
hello, so no rank can be killed by name. A detached run stopped by a viewer at its start ran
on for good (tests/e2e/test_live_squat.py, rerun in CI)."""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path

import pytest

from ddptop.model.config import RunConfig
from ddptop.model.state import RunState
from ddptop.run import stopping


class Torchrun:
    """Running until stop(); every signal it gets is recorded, and none ends it."""

    def __init__(self, ranks: int) -> None:
        self.running, self.ranks, self.signals, self.stopped = True, ranks, [], False

    def tree(self) -> list[object]:
        return [object()] * (1 + self.ranks)

    def send(self, sig: int) -> None:
        self.signals.append(sig)

    async def stop(self, grace_s: float = 5.0) -> None:  # noqa: ARG002
        self.stopped, self.running = True, False


class Procs:
    def __init__(self, launcher: Torchrun, run_dir: Path) -> None:
        self.launcher, self.run_dir = launcher, run_dir

    def rank_pids(self) -> dict[int, int]:
        return {}  # no rank said hello

    def process_status(self) -> dict[int, str]:
        return {}


def stop(tmp_path: Path, ranks: int, grace_s: float = 0.3) -> tuple[Torchrun, RunState]:
    state = RunState(run_id="r", config=RunConfig(), world_size=1, warmup=0)
    launcher = Torchrun(ranks)
    stopper = stopping.Stopper(state, Procs(launcher, tmp_path), grace_s)  # type: ignore[arg-type]
    asyncio.run(asyncio.wait_for(stopper.run(0.0), 10))
    return launcher, state


@pytest.fixture(autouse=True)
def quick(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(stopping, "STARTING_GRACE_S", 0.2)


def test_a_stop_while_torchrun_starts_ends_torchrun_instead_of_a_sigint_it_would_lose(tmp_path):
    launcher, state = stop(tmp_path, ranks=0)
    assert launcher.stopped and launcher.signals == []
    assert any("stop before any rank started: torchrun ended" in line for line in state.logs[-1]), state.logs


def test_a_torchrun_still_running_after_the_grace_with_no_rank_to_name_is_ended(tmp_path):
    launcher, state = stop(tmp_path, ranks=1)
    assert launcher.signals == [signal.SIGINT] and launcher.stopped
    assert any("torchrun still running after the grace" in line for line in state.logs[-1]), state.logs
