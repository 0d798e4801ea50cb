from ddptop.failures import parse_root_cause

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
