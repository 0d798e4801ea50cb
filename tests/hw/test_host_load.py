"""The host's CPU as the monitor reads it for the straggler rule (issue 44: a busy host is not
a straggler): /proc/stat's runnable tasks and steal time, each rank's run-queue delay
(/proc/<pid>/schedstat's second field) and CPU time, and their rates over the last seconds."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from ddptop.hw.host_load import CLOCK_TICK, HostSample, read_host
from ddptop.model.host_load import HostHistory


def fake_proc(root: Path, pids: dict[int, tuple[int, int, int]], running: int = 7, steal: int = 50) -> None:
    """pid -> (run-queue delay ns, utime ticks, stime ticks)."""
    root.mkdir(exist_ok=True)
    (root / "stat").write_text(f"cpu  100 0 50 1000 5 0 2 {steal} 0 0\ncpu0 1 2 3\nprocs_running {running}\n")
    for pid, (wait, utime, stime) in pids.items():
        (root / str(pid)).mkdir(exist_ok=True)
        (root / str(pid) / "schedstat").write_text(f"123456 {wait} 42\n")
        # the command's name may hold spaces and parentheses: fields count after the last ")"
        rest = ["S"] + ["0"] * 10 + [str(utime), str(stime)] + ["0"] * 30
        (root / str(pid) / "stat").write_text(f"{pid} (python (a b)) {' '.join(rest)}\n")


def test_a_reading_of_proc(tmp_path: Path) -> None:
    fake_proc(tmp_path, {11: (2_000_000, 300, 100)})
    got = read_host({0: 11, 1: 99}, 5.0, proc=str(tmp_path))  # rank 1's pid is gone: left out
    assert got is not None and got.runnable == 7 and got.wait_ns == {0: 2_000_000}
    assert got.cpu_s == {0: pytest.approx(400 / CLOCK_TICK)} and got.steal_s == pytest.approx(50 / CLOCK_TICK)
    assert got.busy_s == pytest.approx(1207 / CLOCK_TICK) and got.cores >= 1
    assert read_host({}, 0.0, proc=str(tmp_path / "none")) is None  # not Linux: no reading


def test_this_process_on_the_real_proc() -> None:
    got = read_host({0: os.getpid()}, 0.0)
    if got is None:
        pytest.skip("no /proc here")
    assert got.runnable >= 1 and got.wait_ns[0] >= 0 and got.cpu_s[0] > 0


def test_rates_over_the_last_seconds() -> None:
    history = HostHistory()
    for t in range(10):
        history.add(HostSample(t=float(t), cores=2, runnable=6 + t % 2, steal_s=0.02 * t, busy_s=2.0 * t,
                               wait_ns={0: int(0.4e9 * t), **({1: int(0.1e9 * t)} if t < 9 else {})},
                               cpu_s={0: 0.5 * t, 1: 0.9 * t}))
    c = history.over(4.0)
    assert c is not None and c.seconds == 4.0 and c.cores == 2 and c.runnable == pytest.approx(6.6)  # t = 5..9
    assert c.steal == pytest.approx(0.01) and c.wait_share[0] == pytest.approx(0.4)
    assert c.wait_share[1] == pytest.approx(0.1)  # its last reading was at t=8: counted to there
    assert c.cpu_share == {0: pytest.approx(0.5), 1: pytest.approx(0.9)}
    assert c.busy and c.words() == "host CPU contended: 7 runnable on 2 cores"
    # rank 0 waited 0.3 s a second more than rank 1: 6 ms of a 20 ms step, more than half of a 5 ms excess
    assert c.explains(0, 5.0, 20.0) and not c.explains(1, 5.0, 20.0) and not c.explains(0, 20.0, 20.0)
    assert HostHistory().over(3.0) is None
