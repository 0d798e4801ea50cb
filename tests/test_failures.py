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
    from ddptop.failures import blame, parse_failures

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
    from ddptop.failures import blame

    # ddptop lost rank 0 first (torchrun's SIGTERM); rank 1 never connected and exited 1
    cause = blame(TERMED_AND_ERRED, first_lost=0)
    assert cause is not None and cause.rank == 1 and cause.exitcode == 1
