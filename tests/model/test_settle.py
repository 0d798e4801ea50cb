"""How a run ends when torchrun itself is killed (issue 33.8): the run failed, but its ranks
had not, and their rows must not say they had."""

from __future__ import annotations

import time
from pathlib import Path
from types import SimpleNamespace

from ddptop.model.config import RunConfig
from ddptop.model.state import RunState
from ddptop.run import outcome


def test_after_kill_9_of_torchrun_the_rank_rows_do_not_say_failed(tmp_path: Path) -> None:
    state = RunState("r", RunConfig(), world_size=2)
    for rs in state.ranks.values():
        rs.status = "running"
    (tmp_path / "torchrun.log").write_text("W1125 06:31:55 torch/distributed/run.py:982] Setting OMP_NUM_THREADS\n")
    procs = SimpleNamespace(run_dir=tmp_path, error_files=lambda: {}, stderr_tail=lambda rank: [])
    outcome.settle(state, -9, procs, time.time(), recorder_error="", stopped=False, stop_reason="",  # type: ignore[arg-type]
                   user_script=True)
    assert state.status == "failed" and state.failed_rank is None
    assert state.error == "torchrun was killed (SIGKILL); ddptop ended its ranks, which had not failed"
    assert [rs.status for rs in state.ranks.values()] == ["stopped", "stopped"]
    assert [r["status"] for r in state.summary()["ranks"]] == ["stopped", "stopped"]


def test_torchrun_exiting_0_is_a_completed_run_even_with_a_rank_ddptop_never_heard(tmp_path: Path) -> None:
    from ddptop.model.report import final_report
    from ddptop.wire.protocol import Bye, Hello

    procs = SimpleNamespace(run_dir=tmp_path, error_files=lambda: {}, stderr_tail=lambda rank: [])
    state = RunState("r", RunConfig(), world_size=2)
    state.apply(Hello(rank=1, local_rank=1, world_size=2, host="h", pid=2, token="t"), 1.0)
    state.apply(Bye(rank=1), 2.0)
    state.add_log(0, "[ddptop] could not connect to ddptop (unix:/x/hub.sock): [Errno 11] Resource "
                     "temporarily unavailable")
    outcome.settle(state, 0, procs, time.time(), recorder_error="", stopped=False, stop_reason="",  # type: ignore[arg-type]
                   user_script=False)
    assert state.status == "completed" and state.failed_rank is None
    assert state.error == ("rank 0 not monitored (could not connect: could not connect to ddptop "
                           "(unix:/x/hub.sock): [Errno 11] Resource temporarily unavailable)")
    head = final_report(state.summary(), str(tmp_path)).splitlines()[0]
    assert head.startswith("run r: completed (rank 0 not monitored (could not connect: ")

    # a script's rank that never imported torch never tried to connect: nothing to say
    plain = RunState("p", RunConfig(), world_size=1)
    outcome.settle(plain, 0, procs, time.time(), recorder_error="", stopped=False, stop_reason="",  # type: ignore[arg-type]
                   user_script=True)
    assert plain.status == "completed" and plain.error == ""
