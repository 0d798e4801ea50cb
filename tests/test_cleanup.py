"""Nothing of a run outlives it (issue 17): torchrun killed, a user script's own children
(a plain one, one that ignores SIGTERM, a setsid daemon), after completion and after SIGTERM."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from ddptop.wire.protocol import ENV_ADDR

pytestmark = pytest.mark.e2e

SPAWNER = """
import os, signal, subprocess, sys, time
import torch, torch.distributed as dist, torch.nn as nn
tag = sys.argv[1]
rank = int(os.environ["RANK"])
sleeper = [sys.executable, "-c", "import time; time.sleep(300)", tag]
ignorer = [sys.executable, "-c", "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(300)", tag]
subprocess.Popen(sleeper)
subprocess.Popen(ignorer)
subprocess.Popen(sleeper, start_new_session=True)  # a daemon of its own session
dist.init_process_group("gloo")
model = nn.parallel.DistributedDataParallel(nn.Linear(16, 4))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
steps = int(sys.argv[2])
for step in range(steps):
    model(torch.randn(8, 16)).sum().backward()
    opt.step()
    opt.zero_grad()
    time.sleep(0.05)
dist.barrier()
dist.destroy_process_group()
"""


def tagged(tag: str) -> list[psutil.Process]:
    out = []
    for p in psutil.process_iter(["cmdline"]):
        try:
            if tag in (p.info["cmdline"] or []) and p.status() != psutil.STATUS_ZOMBIE:
                out.append(p)
        except psutil.Error:
            pass
    return out


def gone_within(tag: str, seconds: float) -> list:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        left = tagged(tag)
        if not left:
            return []
        time.sleep(0.2)
    return [p.info["cmdline"] for p in tagged(tag)]


def start(tmp_path: Path, steps: int) -> tuple[subprocess.Popen, str]:
    tag = f"ddptop-cleanup-{os.getpid()}-{time.monotonic_ns()}"
    script = tmp_path / "spawner.py"
    script.write_text(SPAWNER)
    proc = subprocess.Popen([sys.executable, "-m", "ddptop", "--headless", "--json", "--runs-dir", str(tmp_path / "runs"),
                             "--nproc", "2", "--", sys.executable, str(script), tag, str(steps)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    return proc, tag


def wait_running(tmp_path: Path, proc: subprocess.Popen) -> None:
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline and proc.poll() is None:
        if any(p.stat().st_size > 200 for p in (tmp_path / "runs").glob("*/steps.jsonl")):
            return
        time.sleep(0.2)
    raise AssertionError("the run never got going")


def test_a_scripts_own_children_are_gone_after_it_completes(tmp_path):
    proc, tag = start(tmp_path, 20)
    out, err = proc.communicate(timeout=180)
    assert proc.returncode == 0, out[-2000:] + err[-2000:]
    assert json.loads(out.strip().splitlines()[-1])["status"] == "completed"
    assert gone_within(tag, 10) == []


def test_sigterm_leaves_nothing_of_the_run(tmp_path):
    proc, tag = start(tmp_path, 100000)
    wait_running(tmp_path, proc)
    proc.send_signal(signal.SIGTERM)
    proc.communicate(timeout=60)
    assert proc.returncode == 130
    assert gone_within(tag, 10) == []


def test_kill_9_of_torchrun_takes_the_ranks_and_their_children_down(tmp_path):
    proc, tag = start(tmp_path, 100000)
    wait_running(tmp_path, proc)
    torchrun = [c for c in psutil.Process(proc.pid).children() if "torch.distributed.run" in " ".join(c.cmdline())]
    assert torchrun
    torchrun[0].kill()
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 1
    assert gone_within(tag, 10) == []
    ranks = [r["pid"] for r in json.loads(out.strip().splitlines()[-1])["ranks"]]
    assert not [pid for pid in ranks if psutil.pid_exists(pid) and psutil.Process(pid).status() != "zombie"]


def test_kill_9_of_ddptop_leaves_nothing_of_the_run(tmp_path):
    """No sweep can run in a SIGKILLed ddptop: its keeper ends what the run started, the
    script's SIGTERM-ignoring child and setsid daemon included."""
    proc, tag = start(tmp_path, 100000)
    wait_running(tmp_path, proc)
    time.sleep(1.5)  # a census: the keeper has heard of the script's children
    assert len(tagged(tag)) >= 2 + 2 * 3  # torchrun, ddptop, two ranks, each with three children
    keeper = [c for c in psutil.Process(proc.pid).children() if "ddptop.run.keeper" in " ".join(c.cmdline())]
    assert len(keeper) == 1
    (torchrun,) = [c for c in psutil.Process(proc.pid).children() if "torch.distributed.run" in " ".join(c.cmdline())]
    sock_dir = Path(torchrun.environ()[ENV_ADDR].removeprefix("unix:")).parent  # the hub's private socket dir
    assert sock_dir.is_dir() and sock_dir.name.startswith("ddptop-")
    proc.kill()
    proc.communicate()
    t0 = time.monotonic()
    assert gone_within(tag, 10) == []
    print(f"\nkill -9 of ddptop: every process of the run gone in {time.monotonic() - t0:.1f}s")
    assert psutil.wait_procs(keeper, timeout=5)[1] == []  # and the keeper too
    assert not sock_dir.exists()  # nothing left in /tmp either


def test_a_full_disk_stops_the_run_says_so_and_keeps_whole_lines(tmp_path):
    mnt = tmp_path / "small"
    mnt.mkdir()
    if os.geteuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "-o", "size=700k", "tmpfs", str(mnt)],
                                           capture_output=True).returncode != 0:
        pytest.skip("needs to mount a small tmpfs (root)")
    try:
        script = Path(__file__).parent / "scripts" / "single_process.py"
        proc = subprocess.run([sys.executable, "-m", "ddptop", "--headless", "--json", "--interval", "1",
                               "--runs-dir", str(mnt), "--nproc", "2", "--", sys.executable, str(script),
                               "--steps", "1000000"], capture_output=True, text=True, timeout=180)
        assert proc.returncode == 1, proc.stdout[-2000:] + proc.stderr[-2000:]
        assert "no space left on" in proc.stdout  # the status line and the final report say so
        summary = json.loads(proc.stdout.strip().splitlines()[-1])
        assert summary["status"] == "failed" and summary["error"].startswith("no space left on"), summary["error"]
        (steps,) = mnt.glob("*/steps.jsonl")
        data = steps.read_bytes()
        assert data.endswith(b"\n") and all(json.loads(line) for line in data.splitlines())
        pids = [r["pid"] for r in summary["ranks"] if r["pid"]]
        assert pids and not [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != "zombie"]
    finally:
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


def test_a_run_dir_removed_mid_run_stops_the_run_and_says_so(tmp_path):
    import shutil

    proc, tag = start(tmp_path, 100000)
    wait_running(tmp_path, proc)
    (run_dir,) = (tmp_path / "runs").iterdir()
    shutil.rmtree(run_dir)
    t0 = time.monotonic()
    out, err = proc.communicate(timeout=60)
    took = time.monotonic() - t0
    assert proc.returncode == 1, out[-2000:] + err[-2000:]
    summary = json.loads(out.strip().splitlines()[-1])
    assert summary["status"] == "failed"
    assert summary["error"] == f"the run's directory {run_dir} was removed: its records cannot be kept"
    assert f": failed ({summary['error']})" in out  # the final report's status line
    assert took < 15, took
    assert gone_within(tag, 10) == []


def test_a_stopped_rank_does_not_hold_up_a_stop(tmp_path):
    proc, tag = start(tmp_path, 100000)
    wait_running(tmp_path, proc)
    ranks = [p for p in tagged(tag) if p.cmdline()[1].endswith("spawner.py")]
    assert len(ranks) == 2
    ranks[1].suspend()  # SIGSTOP: it will not reach the agreed step, nor handle SIGTERM
    t0 = time.monotonic()
    proc.send_signal(signal.SIGINT)
    proc.communicate(timeout=60)
    took = time.monotonic() - t0
    assert proc.returncode == 130
    assert took < 10, took
    assert gone_within(tag, 10) == []
