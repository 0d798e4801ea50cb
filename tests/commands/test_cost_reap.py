"""`ddptop cost` ends what a run left behind: a process of this user whose environment carries
the run's DDPTOP_STAMP (a rank whose torchrun died first), and only those."""

import os
import subprocess
import sys
import time

from ddptop.commands.cost_runs import reap


def _sleeper(stamp: str) -> subprocess.Popen:
    code = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(60)"
    return subprocess.Popen([sys.executable, "-c", code], env={**os.environ, "DDPTOP_STAMP": stamp})


def test_a_runs_leftover_is_ended_even_if_it_ignores_sigterm_and_no_other(tmp_path):
    ours, other = _sleeper(str(tmp_path / "a" / "stamp")), _sleeper(str(tmp_path / "b" / "stamp"))
    try:
        time.sleep(0.5)  # both have their environment
        assert reap(str(tmp_path / "a" / "stamp")) == [ours.pid]
        assert ours.wait(5) != 0 and other.poll() is None
    finally:
        for p in (ours, other):
            p.kill()
            p.wait()
