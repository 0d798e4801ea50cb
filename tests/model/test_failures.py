import json
import subprocess
import sys

import pytest

from ddptop.model.config import RunConfig
from ddptop.model.failures import parse_root_cause

REPORT = """
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
============================================================
trainer FAILED
------------------------------------------------------------
Failures:
  <NO_OTHER_FAILURES>
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-11-22_08:22:58
  host      : localhost
  rank      : 1 (local_rank: 1)
  exitcode  : 1 (pid: 4634)
  error_file: /x/error.json
  traceback : Traceback (most recent call last):
    File "/work/main/trainer/run.py", line 87, in main
      raise RuntimeError(f"ddptop: injected failure on rank {rank} at step {step}")
  RuntimeError: ddptop: injected failure on rank 1 at step 8

============================================================
"""

SIGNAL = """
Root Cause (first observed failure):
[0]:
  time      : 2026-11-22_08:22:58
  host      : vm
  rank      : 3 (local_rank: 3)
  exitcode  : -9 (pid: 77)
  error_file: <N/A>
  traceback : Signal 9 (SIGKILL) received by PID 77
============================================================
"""


def test_exception_root_cause():
    cause = parse_root_cause(REPORT)
    assert cause.rank == 1 and cause.exitcode == 1
    assert cause.message == "RuntimeError: ddptop: injected failure on rank 1 at step 8"


def test_signal_root_cause():
    cause = parse_root_cause(SIGNAL)
    assert cause.rank == 3 and cause.exitcode == -9 and "SIGKILL" in cause.message


def test_no_report():
    assert parse_root_cause("all fine\n") is None


BOTH = """
Failures:
[1]:
  time      : 2026-11-22_10:03:15
  host      : vm
  rank      : 1 (local_rank: 1)
  exitcode  : -9 (pid: 88)
  error_file: <N/A>
  traceback : Signal 9 (SIGKILL) received by PID 88
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-11-22_10:03:14
  host      : vm
  rank      : 0 (local_rank: 0)
  exitcode  : 1 (pid: 87)
  error_file: /x/error.json
  traceback : Traceback (most recent call last):
    RuntimeError: Connection closed by peer [127.0.0.1]:1234
============================================================
"""


def test_a_signalled_rank_is_blamed_over_the_peer_that_saw_it_vanish():
    from ddptop.model.failures import blame, parse_failures

    assert [(c.rank, c.exitcode) for c in parse_failures(BOTH)] == [(1, -9), (0, 1)]
    assert parse_root_cause(BOTH).rank == 0  # torchrun's own pick
    assert blame(BOTH, first_lost=None).rank == 1
    assert blame(REPORT, first_lost=1).message.startswith("RuntimeError: ddptop: injected")
    assert blame("no report", first_lost=3).rank == 3


TERMED_AND_ERRED = """
Failures:
[1]:
  time      : 2026-11-23_10:00:01
  host      : vm
  rank      : 0 (local_rank: 0)
  exitcode  : -15 (pid: 80)
  error_file: <N/A>
  traceback : Signal 15 (SIGTERM) received by PID 80
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-11-23_10:00:00
  host      : vm
  rank      : 1 (local_rank: 1)
  exitcode  : 1 (pid: 81)
  error_file: <N/A>
  traceback : To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html
============================================================
"""


def test_a_rank_that_failed_before_connecting_is_blamed_not_the_one_torchrun_terminated():
    from ddptop.model.failures import blame

    # ddptop lost rank 0 first (torchrun's SIGTERM); rank 1 never connected and exited 1
    cause = blame(TERMED_AND_ERRED, first_lost=0)
    assert cause is not None and cause.rank == 1 and cause.exitcode == 1


def error_json(message: str, stamp: int) -> str:
    """What torch's @record writes to TORCHELASTIC_ERROR_FILE (ErrorHandler.record_exception)."""
    import json

    return json.dumps({"message": {"message": message, "extraInfo": {
        "py_callstack": "Traceback (most recent call last):\n  ...\n" + message, "timestamp": str(stamp)}}})


def test_error_files_are_read_in_both_of_torchs_forms():
    from ddptop.model.failures import parse_error_file

    got = parse_error_file(error_json("ValueError: bad batch at step 5", 1700000001))
    assert got.message == "ValueError: bad batch at step 5" and got.timestamp == 1700000001
    # gloo's message goes on over lines ("At:", a C++ stack): the exception's line is the first
    gloo = parse_error_file(error_json("RuntimeError: Connection closed by peer\n\nAt:\n  comm.py(12)", 5))
    assert gloo.message == "RuntimeError: Connection closed by peer"
    flat = parse_error_file('{"message": "c10::Error: CUDA error", "timestamp": 17}')
    assert flat.message == "c10::Error: CUDA error" and flat.timestamp == 17
    for bad in ("", "not json", "[]", '{"x": 1}', '{"message": 3}', '{"message": {"message": ["x"]}}'):
        assert parse_error_file(bad) is None, bad
    assert parse_error_file('{"message": {"message": "E: x", "extraInfo": {"timestamp": "nan"}}}').timestamp is None


def test_the_first_rank_to_fail_in_time_by_its_error_file_is_blamed():
    from ddptop.model.failures import ErrorFile, blame

    # rank 0 raised first; rank 1 raised later of the broken connection (both under @record)
    errors = {1: ErrorFile("RuntimeError: Connection closed by peer", 1700000009),
              0: ErrorFile("ValueError: bad batch", 1700000008)}
    cause = blame("", first_lost=None, errors=errors)
    assert cause.rank == 0 and cause.message == "ValueError: bad batch"
    # torchrun was killed before it could report: the error files still say who raised
    assert blame("no report", first_lost=None, errors={1: ErrorFile("KeyError: 'lr'", None)}).rank == 1
    # a rank killed by a signal comes first: its peers' errors are what its death did to them
    assert blame(BOTH, first_lost=None, errors={0: ErrorFile("RuntimeError: Connection closed", 1)}).rank == 1
    # the error file's message replaces the report's last traceback line
    cause = blame(REPORT, first_lost=1, errors={1: ErrorFile("RuntimeError: ddptop: injected failure", 3)})
    assert cause.rank == 1 and cause.message == "RuntimeError: ddptop: injected failure"
    # ddptop lost rank 0 to torchrun's SIGTERM; of the ranks that erred, the earlier error file
    cause = blame(TERMED_AND_ERRED, first_lost=0, errors={1: ErrorFile("OSError: no data", 10)})
    assert (cause.rank, cause.exitcode, cause.message) == (1, 1, "OSError: no data")


def test_last_words_are_the_exception_else_the_last_line_that_is_not_ddptops():
    from ddptop.model.failures import last_words

    assert last_words(["Traceback (most recent call last):", '  File "x.py", line 1',
                       "ModuleNotFoundError: No module named 'torch'"]) == "ModuleNotFoundError: No module named 'torch'"
    assert last_words(["python: can't open file '/x/train.py': [Errno 2] No such file or directory",
                       "ddptop: not measuring this process: ..."]).startswith("python: can't open file")
    assert last_words(["[rank1]: RuntimeError: boom", "  "]) == "RuntimeError: boom"
    assert last_words([]) == ""


def test_the_final_report_carries_the_failed_ranks_last_stderr_lines():
    from ddptop.model.report import final_report
    from ddptop.model.state import RunState

    state = RunState(run_id="r", config=RunConfig(preset="asis", script=True), world_size=2, command=["python", "t.py"])
    state.failure_log = ["Traceback (most recent call last):", "ModuleNotFoundError: No module named 'torch'"]
    state.finish("failed", 1.0, error="rank 1 failed before connecting to ddptop: ModuleNotFoundError: "
                                      "No module named 'torch' (exit code 1)", failed_rank=1)
    text = final_report(state.summary(), "/runs/r")
    assert "failed (rank 1 failed before connecting to ddptop: ModuleNotFoundError" in text.splitlines()[0]
    assert "failed rank: 1; the end of its stderr" in text
    assert text.splitlines()[-2] == "  | ModuleNotFoundError: No module named 'torch'"


def test_a_scripts_status_line_has_no_step_total_of_the_demo():
    # issue 17: a user-script run showed the demo trainer's step count ("step 2100/200")
    from ddptop.model.config import RunConfig
    from ddptop.model.report import status_line
    from ddptop.model.state import RunState

    for config, total in ((RunConfig(nproc=1, steps=200), "/200"), (RunConfig(nproc=1, steps=200).script_view(), "")):
        state = RunState(run_id="r", config=config, world_size=1)
        state.status = "running"
        state.ranks[0].add({"step": 2099, "step_ms": 10.0}, 0, 1.0)
        line = status_line(state, 2.0)
        assert f"step 2100{total} " in line, line


RAISES_BEFORE_CONNECTING = """
import os, sys
if os.environ["RANK"] == "1":
    print("rank 1: reading its shard", file=sys.stderr)
    import no_such_module_ddptop_test  # before torch: ddptop's layer never connected
import torch, torch.distributed as dist, torch.nn as nn
dist.init_process_group("gloo")  # rank 0 waits here for rank 1 until torchrun ends it
model = nn.parallel.DistributedDataParallel(nn.Linear(4, 4))
"""


@pytest.mark.e2e
def test_a_rank_that_raises_before_connecting_is_named_with_its_last_stderr_line(tmp_path):
    script = tmp_path / "early.py"
    script.write_text(RAISES_BEFORE_CONNECTING)
    res = subprocess.run([sys.executable, "-m", "ddptop", "--headless", "--json", "--runs-dir", str(tmp_path / "runs"),
                          "--nproc", "2", "--", sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert res.returncode == 1, res.stdout[-2000:] + res.stderr[-2000:]
    *lines, last = res.stdout.strip().splitlines()
    summary = json.loads(last)
    cause = "ModuleNotFoundError: No module named 'no_such_module_ddptop_test'"
    assert summary["status"] == "failed" and summary["failed_rank"] == 1
    assert summary["error"] == f"rank 1 failed before connecting to ddptop: {cause} (exit code 1)"
    assert summary["failure_log"][-1] == cause and "rank 1: reading its shard" in summary["failure_log"]
    head = next(line for line in lines if line.startswith("run "))
    assert f"failed (rank 1 failed before connecting to ddptop: {cause}" in head
    assert "failed rank: 1; the end of its stderr (logs/.../1/stderr.log):" in lines
    assert f"  | {cause}" in lines


HANGS = """
import time
import torch, torch.distributed as dist, torch.nn as nn
dist.init_process_group("gloo")
model = nn.parallel.DistributedDataParallel(nn.Linear(16, 4))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(20):
    model(torch.randn(8, 16)).sum().backward()
    opt.step()
    opt.zero_grad()
    time.sleep(0.02)
if dist.get_rank() == 1:
    while True:  # hung: rank 0 has finished and left
        time.sleep(1)
"""


@pytest.mark.e2e
def test_a_hung_scripts_rank_gets_its_stacks_taken_not_killed_and_is_the_suspect(tmp_path):
    import signal
    import time

    import psutil
    from waiting import hold, poll

    script = tmp_path / "hangs.py"
    script.write_text(HANGS)
    runs = tmp_path / "runs"
    proc = subprocess.Popen([sys.executable, "-m", "ddptop", "--headless", "--json", "--interval", "1",
                             "--runs-dir", str(runs), "--nproc", "2", "--", sys.executable, str(script)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        t0 = time.monotonic()
        deadline = t0 + 60
        while time.monotonic() < deadline:
            line = proc.stdout.readline()
            if "STALLED" in line or not line:
                break
        assert "STALLED" in line and "suspects [1]" in line, line
        print(f"\nstall flagged {time.monotonic() - t0:.1f}s after the start")
        stacks = next(runs.glob("*/stacks"))
        poll(lambda: (stacks / "rank1.txt").stat().st_size, max(0.0, deadline - time.monotonic()), every=0.2)
        hold(1.0, "a process killed by SIGUSR1 would be gone by now")
        hung = [p for p in psutil.Process(proc.pid).children(recursive=True) if p.cmdline()[1:2] == [str(script)]]
        assert len(hung) == 1 and hung[0].status() != psutil.STATUS_ZOMBIE  # rank 1, alive; rank 0 left
        t1 = time.monotonic()
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=30)
        print(f"stacks after {t1 - t0:.1f}s, stopped {time.monotonic() - t1:.1f}s after SIGINT")
    finally:
        proc.kill()
    assert proc.returncode == 130, out[-2000:] + err[-2000:]
    summary = json.loads(out.strip().splitlines()[-1])
    assert summary["status"] == "stopped"
    # rank 1 was ended by the stop (torchrun's SIGTERM), not by "Signal 10 (SIGUSR1)"
    assert summary["ranks"][0]["status"] == "done" and summary["ranks"][1]["status"] in ("stopped", "lost")
    assert "Signal 10" not in out + err
    assert summary["error"] == "signal SIGINT"  # headless names the signal that stopped it
    stall = summary["stall"]
    assert stall["suspects"] == [1] and list(stall["stacks"]) == ["1"]  # rank 0 had finished: not asked
    text = (stacks / "rank1.txt").read_text()
    assert f'File "{script}", line 14 in <module>' in text, text


def test_torchrun_killed_blames_no_rank_unless_one_failed_first():
    from ddptop.model.failures import ErrorFile, blame, launcher_killed

    # kill -9 of torchrun: no report in its log (it had no time), no error file, nobody crashed
    log = "W1125 06:31:55 torch/distributed/run.py:982] Setting OMP_NUM_THREADS ...\n"
    said = launcher_killed(-9, log, {}, crashed=[])
    assert said == "torchrun was killed (SIGKILL); ddptop ended its ranks, which had not failed"
    assert "signal 64" in launcher_killed(-64, log)
    assert blame(log, 0, {}) is not None  # what the session would say without it: the first rank lost
    # a rank to blame after all
    assert launcher_killed(-9, REPORT) == ""  # torchrun had reported a rank's failure
    assert launcher_killed(-9, log, {1: ErrorFile("RuntimeError: boom", 1.0)}) == ""  # a rank raised
    assert launcher_killed(-9, log, {}, crashed=[1]) == ""  # a rank's own exception hook said so
    # torchrun not killed: exited with an error (its rank failed) or cleanly
    assert launcher_killed(1, log) == "" and launcher_killed(0, log) == ""


def test_a_rank_that_raised_then_aborted_in_teardown_is_blamed_for_its_exception():
    """gloo can abort a rank at interpreter exit after the script raised (CI saw torchrun
    report only 'Signal 6 (SIGABRT)'): the exception is the cause, the signal comes after."""
    from ddptop.model.failures import RootCause
    from ddptop.model.state import RunState
    from ddptop.run.outcome import _error_text

    state = RunState(run_id="r", config=RunConfig(), world_size=2)
    state.ranks[1].status = "crashed"
    state.add_log(1, "Traceback (most recent call last):")
    state.add_log(1, "RuntimeError: boom in the user's own loop")
    cause = RootCause(1, -6, "Signal 6 (SIGABRT) received by PID 4242")
    text = _error_text(state, 1, cause, 1, [])
    assert text == ("RuntimeError: boom in the user's own loop "
                    "(then Signal 6 (SIGABRT) received by PID 4242 at exit)")
    state.ranks[1].status = "lost"  # killed from outside (SIGKILL): the signal is the cause
    assert _error_text(state, 1, RootCause(1, -9, "Signal 9 (SIGKILL) received by PID 1"), 1, []) == \
        "Signal 9 (SIGKILL) received by PID 1"
