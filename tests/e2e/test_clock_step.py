"""Issue 49, case 4: a wall-clock step (NTP, a VM resumed) changes neither who the keeper knows
(kill -9 of ddptop after a +120 s step leaves no orphan: processes are known by their start in
ticks since boot) nor how long a run lasted (a +3600 s step mid-run is not in its elapsed_s).
The step is simulated, never made on the machine: a sitecustomize on the PYTHONPATH shifts the
wall clock as the process named by DDPTOP_TEST_STEP_IN sees it (time.time, and psutil's boot
time, which the kernel moves with the wall clock) by DDPTOP_TEST_STEP_S, DDPTOP_TEST_STEP_AFTER_S
after it started."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from test_cleanup import gone_within, tagged
from waiting import hold, poll

pytestmark = pytest.mark.e2e

STEP = """
import os, time
_who = os.environ.get("DDPTOP_TEST_STEP_IN", "")
try:
    _cmd = open("/proc/self/cmdline", "rb").read().split(b"\\0")
except OSError:
    _cmd = []
if _who and _who.encode() in _cmd:
    import psutil._pslinux as _ps
    _step, _after = float(os.environ["DDPTOP_TEST_STEP_S"]), float(os.environ.get("DDPTOP_TEST_STEP_AFTER_S", "0"))
    _t0, _time, _boot = time.monotonic(), time.time, _ps.boot_time
    _shift = lambda: _step if time.monotonic() - _t0 >= _after else 0.0
    time.time = lambda: _time() + _shift()
    _ps.boot_time = lambda: _boot() + _shift()
"""

SCRIPT = """
import signal, subprocess, sys, time
tag, seconds = sys.argv[1], float(sys.argv[2])
sleeper = [sys.executable, "-c", "import time; time.sleep(300)", tag]
ignorer = [sys.executable, "-c", "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(300)", tag]
if seconds > 60:
    subprocess.Popen(ignorer)
    subprocess.Popen(sleeper, start_new_session=True)  # a daemon of its own session
time.sleep(seconds)
"""


def start(tmp_path: Path, seconds: float, step_in: str, step_s: float, after_s: float) -> tuple[subprocess.Popen, str]:
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(STEP)
    script = tmp_path / "script.py"
    script.write_text(SCRIPT)
    tag = f"ddptop-clock-{os.getpid()}-{time.monotonic_ns()}"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")]),
           "DDPTOP_TEST_STEP_IN": step_in, "DDPTOP_TEST_STEP_S": str(step_s), "DDPTOP_TEST_STEP_AFTER_S": str(after_s)}
    proc = subprocess.Popen([sys.executable, "-m", "ddptop", "--headless", "--json", "--runs-dir", str(tmp_path / "runs"),
                             "--nproc", "1", "--", sys.executable, str(script), tag, str(seconds)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    return proc, tag


def test_kill_9_after_a_clock_step_of_120_s_leaves_no_orphan(tmp_path: Path) -> None:
    # the keeper sees the clock 120 s ahead of what ddptop saw when it told it of each process
    proc, tag = start(tmp_path, 300, "ddptop.run.keeper", 120, 0)
    try:
        # the script, its SIGTERM-ignoring child and its setsid daemon
        assert poll(lambda: len(tagged(tag)) >= 3, 60, every=0.2, alive=lambda: proc.poll() is None), \
            [p.info["cmdline"] for p in tagged(tag)]
        hold(2.5, "a census: the keeper has heard of the script's children (it looks every second)")
        keeper = [c for c in psutil.Process(proc.pid).children() if "ddptop.run.keeper" in " ".join(c.cmdline())]
        assert len(keeper) == 1
    finally:
        proc.kill()
        proc.communicate()
    left = gone_within(tag, 10)
    for p in tagged(tag):  # the old keeper took them all for reused pids: end them here
        p.kill()
    assert left == []


def test_a_clock_step_of_3600_s_mid_run_is_not_in_its_elapsed_time(tmp_path: Path) -> None:
    # ddptop's own clock jumps an hour ahead 2 s after it started; the script runs ~6 s
    proc, _ = start(tmp_path, 6, "ddptop", 3600, 2)
    out, err = proc.communicate(timeout=120)
    summary = json.loads(out.strip().splitlines()[-1])
    assert summary["status"] == "completed", err[-2000:]
    assert 5 <= summary["elapsed_s"] < 60, summary["elapsed_s"]  # read 3606 with the wall clock
