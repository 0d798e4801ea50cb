"""A run directory moved aside and replaced by a symlink (issue 33.3/33.6): the recorder
writes through a descriptor of the directory it made, so nothing reaches the link's target;
it notices the swap and the run stops, saying so; a runs directory others can write without
the sticky bit is warned about. In the end-to-end test the swap is made by another local user
when the tests run as root (as in CI), else by this test's own uid (a rename in a directory one
may write is the same call whoever makes it). (torchrun's own files are opened by path: the swap
comes once it holds them.)"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

import pytest
from waiting import poll

from ddptop.run.recorder import Recorder, new_run_dir, runs_dir_warning

SLEEPER = "import time\nwhile True:\n    time.sleep(0.1)\n"


def sleeper_run(runs: Path, script: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "ddptop", "--headless", "--json", "--runs-dir", str(runs),
                             "--nproc", "1", "--", sys.executable, str(script)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def started_run_dir(runs: Path, proc: subprocess.Popen) -> Path:
    """The run's directory, once torchrun has opened the rank's logs (it writes them by path,
    and holds them open)."""
    started = poll(lambda: list(runs.glob("*/logs/*/attempt_0/0/stderr.log")), 60, alive=lambda: proc.poll() is None)
    assert started, "the run did not start"
    return next(runs.glob("*/config.json")).parent


def swap(run_dir: Path, theirs: Path) -> Path:
    aside = run_dir.with_name(run_dir.name + ".aside")
    run_dir.rename(aside)
    run_dir.symlink_to(theirs)
    return aside


def test_the_recorder_writes_nothing_through_a_link_put_in_its_place(tmp_path: Path) -> None:
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    run_dir = new_run_dir(tmp_path / "runs", "r1")
    rec = Recorder(run_dir)
    rec.write_config({"a": 1})
    rec.record_steps(0, [{"step": 0, "step_ms": 1.0}])
    assert rec.check() == ""
    aside = swap(run_dir, theirs)
    rec.record_steps(0, [{"step": 1, "step_ms": 1.0}])
    assert "was moved aside or replaced" in rec.check() and "nothing was written through it" in rec.error
    assert rec.write_summary({"secret": "--wandb-key=SECRET"}) == ""  # into the run's own directory
    rec.close()
    assert list(theirs.iterdir()) == []
    assert json.loads((aside / "summary.json").read_text()) == {"secret": "--wandb-key=SECRET"}
    assert len((aside / "steps.jsonl").read_text().splitlines()) == 2


def test_a_runs_dir_others_can_write_without_the_sticky_bit_is_warned_about(tmp_path: Path) -> None:
    team = tmp_path / "team"
    team.mkdir()
    team.chmod(0o777)
    assert "is writable by others (mode 777, no sticky bit)" in runs_dir_warning(team)
    team.chmod(0o1777)
    assert runs_dir_warning(team) == ""
    team.chmod(0o755)
    assert runs_dir_warning(team) == ""


def swap_as(uid: int | None, run_dir: Path, theirs: Path) -> Path:
    """The swap, made by local user `uid` (None: this test's own)."""
    if uid is None:
        return swap(run_dir, theirs)
    aside = run_dir.with_name(run_dir.name + ".aside")
    res = subprocess.run(["/bin/sh", "-c", 'mv "$1" "$2" && ln -s "$3" "$1"', "swap", str(run_dir), str(aside),
                          str(theirs)], user=uid, capture_output=True, text=True, timeout=30)
    assert res.returncode == 0, res.stderr
    return aside


@pytest.mark.e2e
def test_a_swapped_run_dir_stops_the_run_naming_the_swap(tmp_path: Path) -> None:
    from test_trust import other_uid

    uid = other_uid()  # None unless root: then the swap is this uid's own
    base = Path(tempfile.mkdtemp(prefix="ddptop-swap-", dir="/tmp"))  # the other user can reach it
    base.chmod(0o755)
    script = tmp_path / "sleeper.py"
    script.write_text(SLEEPER)
    runs, theirs = base / "team", base / "theirs"
    runs.mkdir()
    runs.chmod(0o777)  # a team directory: everyone may write, no sticky bit
    theirs.mkdir()
    if uid is not None:
        os.chown(theirs, uid, -1)
    proc = sleeper_run(runs, script)
    try:
        run_dir = started_run_dir(runs, proc)
        swap_as(uid, run_dir, theirs)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode != 0, out + err
    summary = json.loads(out.strip().splitlines()[-1])
    assert "was moved aside or replaced" in summary["error"], summary["error"]
    assert any("writable by others" in note for note in summary["notes"]), summary["notes"]
    assert list(theirs.iterdir()) == []  # no byte through the link
    assert (run_dir.with_name(run_dir.name + ".aside") / "summary.json").is_file()
    assert os.path.islink(run_dir)
    shutil.rmtree(base, ignore_errors=True)


def fifo_tree(run_dir: Path, theirs: Path, uid: int | None) -> None:
    """In `theirs`, the run dir's layout with a FIFO in place of every file (the rank logs,
    torchrun.log, NCCL's logs): a plain open() of any of them waits for a writer forever."""
    for path in [p for p in run_dir.rglob("*") if p.is_file()]:
        twin = theirs / path.relative_to(run_dir)
        twin.parent.mkdir(parents=True, exist_ok=True)
        os.mkfifo(twin)
    if uid is not None:
        for path in [theirs, *theirs.rglob("*")]:
            os.chown(path, uid, -1)


@pytest.mark.e2e
@pytest.mark.parametrize("then", ["nothing", "sigint"])
def test_a_run_dir_swapped_for_a_tree_of_fifos_stops_within_10_s(tmp_path: Path, then: str) -> None:
    """Issue 49.3: the log tail opened the swapped path's FIFO with a plain open and blocked the
    monitor's loop for good (SIGINT did nothing). Now the run's files are read through the
    recorder's descriptor of its own directory, never as a FIFO: the run stops by itself (the
    swap noticed), or at once on SIGINT, within 10 s either way."""
    import signal
    import time

    from test_trust import other_uid

    uid = other_uid()  # root (CI, here): a second local user; else this uid plays the other
    base = Path(tempfile.mkdtemp(prefix="ddptop-fifo-", dir="/tmp"))
    base.chmod(0o755)
    script = tmp_path / "sleeper.py"
    script.write_text(SLEEPER)
    runs, theirs = base / "team", base / "theirs"
    runs.mkdir()
    runs.chmod(0o777)  # everyone may write, no sticky bit
    theirs.mkdir()
    proc = sleeper_run(runs, script)
    try:
        run_dir = started_run_dir(runs, proc)
        fifo_tree(run_dir, theirs, uid)
        swap_as(uid, run_dir, theirs)
        swapped = time.monotonic()
        if then == "sigint":
            proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=10)
        took = time.monotonic() - swapped
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert took < 10, took
    summary = json.loads(out.strip().splitlines()[-1])
    assert summary["status"] in ("stopped", "failed"), summary
    if then == "nothing":
        assert "was moved aside or replaced" in summary["error"], summary["error"]
    shutil.rmtree(base, ignore_errors=True)


def test_the_log_tail_reads_no_fifo_and_no_link(tmp_path: Path) -> None:
    from ddptop.run.logtail import LogTail

    fifo = tmp_path / "stderr.log"
    os.mkfifo(fifo)
    (tmp_path / "real.log").write_text("theirs\n")
    (tmp_path / "link.log").symlink_to(tmp_path / "real.log")
    tail = LogTail()
    got: list[list[str]] = []
    reader = threading.Thread(target=lambda: got.append(tail.read(fifo)), daemon=True)
    reader.start()
    reader.join(5)
    if reader.is_alive():  # the old plain open(): free it (a writer end opens and closes)
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
    assert got == [[]], "the log tail blocked on a FIFO"
    assert tail.read(tmp_path / "link.log") == []
    assert tail.read(tmp_path / "real.log") == ["theirs"]
