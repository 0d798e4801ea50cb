"""Communication timing, stragglers and stalls on real 2-rank gloo runs."""

import asyncio
import json
import os
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from ddptop.model.config import RunConfig, preset_config
from ddptop.run.session import Session

pytestmark = pytest.mark.e2e


def test_comm_time_and_straggler_named(tmp_path):
    cmd = [sys.executable, "-m", "ddptop", "--headless", "--json", "--runs-dir", str(tmp_path), "--nproc", "2",
           "--steps", "50", "--warmup", "5", "--set", "workers=0", "--set", "delay_rank=1", "--set", "delay_ms=40",
           "--set", "gloo_timing=true"]  # each bucket timed (off by default on gloo)
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=240)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    summary = json.loads(res.stdout.strip().splitlines()[-1])
    for r in summary["ranks"]:
        assert r["comm_ms_p50"] > 0 and r["comm_share"] > 0 and r["buckets_mean"] >= 1
        assert r["ddp_timing"]["backward_comm_ms"] > 0  # DDP's own logger, the cross-check
    # rank 0 waits for the slow rank inside the all-reduce; rank 1 is named, with its slow phase
    assert summary["straggler"]["rank"] == 1 and summary["straggler"]["phase"] == "data"
    assert summary["ranks"][0]["exposed_comm_ms_p50"] > 30
    assert "straggler" in res.stdout and "cross-check, rank 0: DDP's own logger" in res.stdout


async def start_running(session: Session) -> asyncio.Task:
    """Start the session's run and return once every rank is past step 5."""
    runner = asyncio.create_task(session.run())
    for _ in range(900):
        if session.state.status == "running" and session.state.current_step >= 5:
            return runner
        await asyncio.sleep(0.1)
    raise AssertionError("run never started")


@pytest.mark.slow  # the suite stays under 10 min on 2 cores: `pytest -m slow` runs it (covered: test_failures' hung rank gets its stacks taken)
def test_sigstopped_rank_is_flagged_as_stall_with_stacks(tmp_path):
    config = preset_config("baseline", RunConfig(nproc=2, steps=100000, warmup=2, workers=0))
    session = Session(config, tmp_path)

    async def main():
        runner = await start_running(session)
        state = session.state
        victim = state.ranks[1].hello.pid
        tree = session.launcher.tree()
        # the hub's socket: in a directory only this user can enter, and 0600 itself
        assert stat.S_IMODE(os.stat(session._sock_dir).st_mode) == 0o700
        assert stat.S_IMODE(os.stat(Path(session._sock_dir) / "hub.sock").st_mode) == 0o600
        os.kill(victim, signal.SIGSTOP)
        t0 = time.monotonic()
        while state.stall is None and time.monotonic() - t0 < 30:
            await asyncio.sleep(0.1)
        detected = time.monotonic() - t0
        assert state.stall is not None, "stall not flagged"
        assert detected <= state.stall.bound_s + 2.0
        assert state.stall.suspects == [1]
        await asyncio.sleep(2.0)  # stacks written
        session.request_stop("test")
        final = await asyncio.wait_for(runner, 60)
        return final, tree, detected

    final, tree, detected = asyncio.run(main())
    assert final.status == "stopped"
    stacks = Path(final.stall.stacks[0])
    assert stacks.exists() and "Thread" in stacks.read_text()  # rank 0: waiting in the all-reduce
    assert "no answer" in final.stall.stacks[1]  # rank 1 is stopped: cannot answer
    summary = json.loads((session.run_dir / "summary.json").read_text())
    assert summary["stalls"] == 1 and summary["stall"]["suspects"] == [1]
    _, alive = psutil.wait_procs(tree, timeout=10)
    assert alive == []


def test_sigkilled_rank_fails_the_run_within_5s_and_keeps_records(tmp_path):
    config = preset_config("baseline", RunConfig(nproc=2, steps=100000, warmup=2, workers=0))
    session = Session(config, tmp_path)

    async def main():
        runner = await start_running(session)
        state = session.state
        tree = session.launcher.tree()
        received = sum(rs.steps for rs in state.ranks.values())
        os.kill(state.ranks[1].hello.pid, signal.SIGKILL)
        t0 = time.monotonic()
        final = await asyncio.wait_for(runner, 60)
        return final, tree, received, time.monotonic() - t0

    final, tree, received, detect_s = asyncio.run(main())
    assert final.status == "failed" and final.failed_rank == 1
    print(f"\nrank SIGKILLed: run marked failed after {detect_s:.2f}s")
    assert detect_s < 5.0, detect_s
    log = (session.run_dir / "torchrun.log").read_text(errors="replace")[-3000:]
    assert "SIGKILL" in final.error or "Signal 9" in final.error, (final.error, log)
    assert any("[trainer] rank 1" in line for line in final.logs.get(1, []))  # its last log lines
    lines = (session.run_dir / "steps.jsonl").read_text().splitlines()
    assert len(lines) >= received  # every record received before the crash is on disk
    summary = json.loads((session.run_dir / "summary.json").read_text())
    assert summary["status"] == "failed" and summary["failed_rank"] == 1
    _, alive = psutil.wait_procs(tree, timeout=10)
    assert alive == []
