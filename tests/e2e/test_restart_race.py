"""Two viewers of one run apply settings at once (issue 33.3): the supervisor grants one
restart; the other viewer is told "a restart is already under way, from <the first>" and
starts nothing, so exactly one new run follows (two would fight for the same GPUs)."""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path

import pytest

from ddptop.model.config import RunConfig
from ddptop.remote.live import find_run
from ddptop.remote.viewer import RemoteSession
from ddptop.run.handle import RestartRefused, RunHandle
from ddptop.run.workbench import Workbench
from ddptop.tui.synthetic import StaticSession, synthetic_state

# A run that goes on until stopped (no torch: the ranks never connect; the stop ends torchrun).
SLEEPER = "import time\nwhile True:\n    time.sleep(0.1)\n"


@pytest.mark.e2e
def test_two_viewers_restarting_within_100_ms_start_exactly_one_run(tmp_path: Path) -> None:
    script = tmp_path / "sleeper.py"
    script.write_text(SLEEPER)
    runs = tmp_path / "runs"
    config, cmd = RunConfig(nproc=1), [sys.executable, str(script)]
    started: list[str] = []

    def factory(c: RunConfig, d: Path, u: list[str] | None) -> RunHandle:
        started.append("new run")  # the next run, created (the caller would start it)
        return StaticSession(synthetic_state(1))

    async def main() -> None:
        run = RemoteSession.spawn(config, runs, cmd, detached=True)
        runner = asyncio.create_task(run.run())
        deadline = time.monotonic() + 30
        while (entry := _entry(run.run_id)) is None:
            assert time.monotonic() < deadline, "the supervisor did not register"
            await asyncio.sleep(0.1)
        benches, followers = [], []
        for _ in range(2):  # two viewers of the run, each with its own workbench
            bench = Workbench(config, runs, cmd, session_factory=factory)
            viewer = bench.attach(RemoteSession.attach(entry))
            followers.append(asyncio.create_task(bench.run(viewer)))
            benches.append(bench)
        while ((e := _entry(run.run_id)) is None or e.viewers < 3):  # the spawner and both viewers
            assert time.monotonic() < deadline, "the viewers did not connect"
            await asyncio.sleep(0.05)
        t0 = time.monotonic()
        results = await asyncio.gather(*(b.restart(config, f"settings changed, from viewer {i}")
                                         for i, b in enumerate(benches)), return_exceptions=True)
        refused = [r for r in results if isinstance(r, RestartRefused)]
        assert len(refused) == 1 and len(started) == 1, results
        assert str(refused[0]).startswith("a restart is already under way, from a viewer, uid ")
        assert time.monotonic() - t0 < 30
        state = await asyncio.wait_for(runner, 30)
        await asyncio.gather(*followers, return_exceptions=True)
        assert state.status == "stopped"
        log = "\n".join(state.logs[-1])
        assert log.count("restart asked by") == 1 and "restart (refused: one is under way) asked by" in log

    asyncio.run(asyncio.wait_for(main(), 120))


def _entry(run_id: str):  # noqa: ANN202
    try:
        return find_run(run_id)
    except Exception:  # noqa: BLE001  (not registered yet)
        return None
