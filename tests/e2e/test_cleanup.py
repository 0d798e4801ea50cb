"""Nothing of a run outlives it (issue 17): torchrun killed, a user script's own children
(a plain one, one that ignores SIGTERM, a setsid daemon), after completion and after SIGTERM."""

import contextlib
import errno
import json
import os
import re
import resource
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from waiting import hold, poll

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
    poll(lambda: not tagged(tag), seconds, every=0.2)
    return [p.info["cmdline"] for p in tagged(tag)]


def start(tmp_path: Path, steps: int, *opts: str) -> tuple[subprocess.Popen, str]:
    tag = f"ddptop-cleanup-{os.getpid()}-{time.monotonic_ns()}"
    script = tmp_path / "spawner.py"
    script.write_text(SPAWNER)
    proc = subprocess.Popen([sys.executable, "-m", "ddptop", "--headless", "--json", "--runs-dir", str(tmp_path / "runs"),
                             "--nproc", "2", *opts, "--", sys.executable, str(script), tag, str(steps)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    return proc, tag


def wait_running(tmp_path: Path, proc: subprocess.Popen) -> None:
    if not poll(lambda: any(p.stat().st_size > 200 for p in (tmp_path / "runs").glob("*/steps.jsonl")), 90,
                every=0.2, alive=lambda: proc.poll() is None):
        raise AssertionError("the run never got going")


# slow-marked (the suite under 10 min on 2 cores): the SIGTERM and kill -9 tests below check
# that the same script's children, its SIGTERM-ignoring one and setsid daemon included, are gone
@pytest.mark.slow
def test_a_scripts_own_children_are_gone_after_it_completes(tmp_path):
    proc, tag = start(tmp_path, 20)
    out, err = proc.communicate(timeout=180)
    assert proc.returncode == 0, out[-2000:] + err[-2000:]
    assert json.loads(out.strip().splitlines()[-1])["status"] == "completed"
    assert gone_within(tag, 10) == []


def test_sigterm_leaves_nothing_of_the_run(tmp_path):
    """SIGTERM to a headless run: every rank leaves its loop at the agreed step, and nothing of
    the run (the script's children, the SIGTERM-ignoring one and the daemon included) is left."""
    proc, tag = start(tmp_path, 100000)
    wait_running(tmp_path, proc)
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 130
    summary = json.loads(out.strip().splitlines()[-1])
    assert summary["status"] == "stopped", summary["error"]
    last = [r["last_step"] for r in summary["ranks"]]
    assert len(last) == 2 and last[0] == last[1], last
    assert gone_within(tag, 10) == []


def test_kill_9_of_torchrun_takes_the_ranks_and_their_children_down_and_blames_torchrun_not_a_rank(tmp_path):
    """The ranks (and their children) are ended by ddptop's sweep when torchrun goes, not by a
    fault of their own: the summary names torchrun's death as the cause and no rank."""
    proc, tag = start(tmp_path, 100000)
    wait_running(tmp_path, proc)
    (torchrun,) = [c for c in psutil.Process(proc.pid).children() if "torch.distributed.run" in " ".join(c.cmdline())]
    torchrun.kill()
    out, _ = proc.communicate(timeout=60)
    assert gone_within(tag, 10) == []
    summary = json.loads(out.strip().splitlines()[-1])
    ranks = [r["pid"] for r in summary["ranks"]]
    assert not [pid for pid in ranks if psutil.pid_exists(pid) and psutil.Process(pid).status() != "zombie"]
    assert proc.returncode == 1 and summary["status"] == "failed"
    assert summary["error"] == "torchrun was killed (SIGKILL); ddptop ended its ranks, which had not failed"
    assert summary["failed_rank"] is None, (summary["failed_rank"], summary["error"])
    assert "failed rank:" not in out  # the final report names none either


def test_kill_9_of_ddptop_leaves_nothing_of_the_run(tmp_path):
    """No sweep can run in a SIGKILLed ddptop: its keeper ends what the run started, the
    script's SIGTERM-ignoring child and setsid daemon included."""
    proc, tag = start(tmp_path, 100000)
    wait_running(tmp_path, proc)
    # torchrun, ddptop, two ranks, each with three children
    assert poll(lambda: len(tagged(tag)) >= 2 + 2 * 3, 30, every=0.2), [p.info["cmdline"] for p in tagged(tag)]
    hold(1.5, "a census: the keeper has heard of the script's children (it looks every second)")
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


SMALL_DISK = 700 << 10  # bytes: a tmpfs this size, or `ulimit -f` at this size

CHATTY = """
import sys, time
import torch, torch.nn as nn
model = nn.Linear(16, 4)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(10**6):
    model(torch.randn(8, 16)).sum().backward()
    opt.step()
    opt.zero_grad()
    print(f"step {step} " + "x" * 2000, flush=True)  # its own output fills the disk
    time.sleep(0.005)
"""


@contextlib.contextmanager
def small_tmpfs(mnt: Path) -> Iterator[None]:
    mnt.mkdir()
    if os.geteuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={SMALL_DISK >> 10}k", "tmpfs",
                                            str(mnt)], capture_output=True).returncode != 0:
        pytest.skip("needs to mount a small tmpfs (root); the ulimit-f case fills without mounting")
    try:
        yield
    finally:
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


def limit_file_size() -> None:  # in the child: `ulimit -f` for ddptop and all it starts
    resource.setrlimit(resource.RLIMIT_FSIZE, (SMALL_DISK, SMALL_DISK))


def run_out_of_space(runs: Path, cmd: list[str], preexec=None) -> tuple[subprocess.CompletedProcess, dict, Path]:
    proc = subprocess.run([sys.executable, "-m", "ddptop", "--headless", "--json", "--interval", "0.5",
                           "--runs-dir", str(runs), "--nproc", "2", "--set", "phase_every=1", "--", *cmd],  # a record a step
                          capture_output=True, text=True, timeout=180, preexec_fn=preexec)
    assert proc.returncode == 1, proc.stdout[-2000:] + proc.stderr[-2000:]
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    return proc, summary, runs / summary["run_id"]


def assert_kept_whole_and_nothing_left(proc: subprocess.CompletedProcess, summary: dict, run_dir: Path) -> None:
    assert summary["status"] == "failed"
    # the live status lines and the final report say so, as the summary does
    assert any(line.startswith("[") and f"ERROR: {summary['error']}" in line for line in proc.stdout.splitlines())
    assert f": failed ({summary['error']})" in proc.stdout
    on_disk = run_dir / "summary.json"
    # written if there was room for it, else the reason is printed
    assert on_disk.exists() or f"summary.json not written: no space left on {run_dir}" in proc.stdout
    if on_disk.exists():
        assert json.loads(on_disk.read_text())["error"] == summary["error"]
    assert not list(run_dir.glob("*.tmp"))  # no half-written file next to the good ones
    data = (run_dir / "steps.jsonl").read_bytes()
    assert data and data.endswith(b"\n") and all(json.loads(line) for line in data.splitlines())
    pids = [r["pid"] for r in summary["ranks"] if r["pid"]]
    assert len(pids) == 2 and not [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != "zombie"]


@pytest.mark.parametrize("fill", [pytest.param("tmpfs", marks=pytest.mark.slow), "ulimit-f"])  # tmpfs: -m slow
def test_a_full_disk_stops_the_run_says_so_and_keeps_whole_lines(tmp_path, fill):
    """The runs dir on a 700 KB tmpfs (root only), or ddptop under `ulimit -f` 700 KB (needs
    nothing, so one case always runs): steps.jsonl outgrows it; the run stops at one agreed
    step, says no space, exits 1, and what it wrote stays valid."""
    runs = tmp_path / "small"
    script = Path(__file__).parents[1] / "scripts" / "single_process.py"
    cmd = [sys.executable, str(script), "--steps", "1000000"]
    if fill == "tmpfs":
        with small_tmpfs(runs):
            proc, summary, run_dir = run_out_of_space(runs, cmd)
            assert_kept_whole_and_nothing_left(proc, summary, run_dir)
            free = re.fullmatch(rf"no space left on {re.escape(str(run_dir))} \((\d+\.\d) MB free\)", summary["error"])
            assert free and float(free.group(1)) < SMALL_DISK / 2**20, summary["error"]
    else:
        proc, summary, run_dir = run_out_of_space(runs, cmd, preexec=limit_file_size)
        assert_kept_whole_and_nothing_left(proc, summary, run_dir)
        # the disk has room; the file may not grow: said as such
        assert re.fullmatch(rf"no space left on {re.escape(str(run_dir))} \(a file may not exceed 0\.7 MB: "
                            rf"ulimit -f; \d+\.\d MB free on the disk\)", summary["error"]), summary["error"]
        assert len((run_dir / "steps.jsonl").read_bytes()) <= SMALL_DISK
    # stopped cleanly, both at the step agreed on
    assert {r["status"] for r in summary["ranks"]} == {"stopped"}, [r["status"] for r in summary["ranks"]]
    assert len({r["last_step"] for r in summary["ranks"]}) == 1, [r["last_step"] for r in summary["ranks"]]


def test_a_scripts_own_output_filling_the_disk_stops_the_run_and_says_so(tmp_path):
    """The ranks' stdout logs (under the run's directory) fill a 700 KB tmpfs: the script's
    prints fail and it dies of it, and the run is reported as out of space, not as a crash.
    Only on a tmpfs: under `ulimit -f` the script's write fails with EFBIG on its own file
    while the disk has room, which is the script's error and reported as such."""
    runs = tmp_path / "small"
    script = tmp_path / "chatty.py"
    script.write_text(CHATTY)
    with small_tmpfs(runs):
        proc, summary, run_dir = run_out_of_space(runs, [sys.executable, str(script)])
        assert re.fullmatch(rf"no space left on {re.escape(str(run_dir))} \(\d+\.\d MB free\)", summary["error"]), \
            summary["error"]
        assert_kept_whole_and_nothing_left(proc, summary, run_dir)
        assert sum(p.stat().st_size for p in run_dir.glob("logs/*/attempt_0/*/stdout.log")) > SMALL_DISK // 2


def test_disk_errors_name_the_directory_and_the_room_left(tmp_path, monkeypatch):
    from collections import namedtuple

    from ddptop.run.recorder import LOW_SPACE_BYTES, disk_error, low_space

    assert re.fullmatch(rf"no space left on {re.escape(str(tmp_path))} \(\d+\.\d MB free\)",
                        disk_error(tmp_path, OSError(errno.ENOSPC, "No space left on device")))
    assert disk_error(tmp_path, OSError(errno.EIO, "Input/output error")).startswith(
        f"cannot write the run's records in {tmp_path}: Input/output error (")
    # a disk with room: nothing to say (this test's own tmp dir has more than 256 KB free)
    assert shutil.disk_usage(tmp_path).free > LOW_SPACE_BYTES and low_space(tmp_path) == ""
    assert low_space(tmp_path / "no-such-dir") == ""
    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda path: usage(700 << 10, 600 << 10, 100 << 10))
    assert low_space(tmp_path) == f"no space left on {tmp_path} (0.1 MB free)"  # about full: stop now
    monkeypatch.setattr(shutil, "disk_usage", lambda path: usage(0, 0, 0))  # a file system with no sizes
    assert low_space(tmp_path) == ""


def test_a_run_dir_removed_mid_run_stops_the_run_and_says_so(tmp_path):
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
    """A rank that cannot run its SIGINT handler (stopped) is killed once the stop's grace
    (--stop-grace, torchrun's 30 s by default) has passed, and the summary says so."""
    proc, tag = start(tmp_path, 100000, "--stop-grace", "3")
    wait_running(tmp_path, proc)
    ranks = [p for p in tagged(tag) if p.cmdline()[1].endswith("spawner.py")]
    assert len(ranks) == 2
    ranks[1].suspend()  # SIGSTOP: it will not reach the agreed step, nor handle SIGINT
    t0 = time.monotonic()
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=60)
    took = time.monotonic() - t0
    assert proc.returncode == 130
    assert 3 < took < 12, took
    notes = json.loads(out.strip().splitlines()[-1])["notes"]
    assert [n for n in notes if n.startswith("rank 1 was killed (SIGKILL) after the 3 s grace (--stop-grace)")], notes
    assert gone_within(tag, 10) == []
