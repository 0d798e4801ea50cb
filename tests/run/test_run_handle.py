"""The RunHandle protocol (ddptop.run.handle): Session, RemoteSession and StaticSession
are handles; only a supervised run is a DetachableRun, and the Workbench reads ownership
and detaching through the protocol. No run is started here."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from ddptop.model.config import RunConfig
from ddptop.remote.viewer import RemoteSession
from ddptop.run.handle import DetachableRun, owns
from ddptop.run.session import Session
from ddptop.run.workbench import Workbench
from ddptop.tui.synthetic import StaticSession, synthetic_state


def test_only_a_supervised_run_is_detachable_and_ownership_follows_it(tmp_path: Path) -> None:
    config = RunConfig(nproc=2)
    in_process = Session(config, tmp_path)
    scripted = StaticSession(synthetic_state(2), config, tmp_path / "x")
    owned = RemoteSession(config, tmp_path, "r1", tmp_path / "live", owner=True)
    watched = RemoteSession(config, tmp_path, "r2", tmp_path / "live", owner=False)
    detached = RemoteSession(config, tmp_path, "r3", tmp_path / "live", owner=True, detached=True)
    assert not isinstance(in_process, DetachableRun) and not isinstance(scripted, DetachableRun)
    assert all(isinstance(s, DetachableRun) for s in (owned, watched, detached))
    assert [owns(s) for s in (in_process, scripted, owned, watched, detached)] == [True, True, True, False, False]


def test_workbench_detaches_only_a_live_supervised_run(tmp_path: Path) -> None:
    async def main() -> None:
        config = RunConfig(nproc=2)
        bench = Workbench(config, tmp_path)
        bench.new_session()  # an in-process Session, not started: live, cannot outlive us
        assert bench.is_live() and bench.owns_current() and not bench.can_detach()
        with pytest.raises(RuntimeError):
            await bench.detach()
        bench.attach(RemoteSession(config, tmp_path, "r1", tmp_path / "live", owner=False))
        assert bench.can_detach() and not bench.owns_current()
        scripted = StaticSession(synthetic_state(2), config, tmp_path / "x")
        bench.attach(scripted)
        assert not bench.is_live() and not bench.can_detach()
        assert await scripted.run() is scripted.state
        with pytest.raises(RuntimeError):
            await bench.capture()

    asyncio.run(main())
