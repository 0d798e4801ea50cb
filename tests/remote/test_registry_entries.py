"""Registry entries are data, not instructions (issue 33.6): `ddptop ls` reads only regular
files of ours, bounded, without following links or waiting on FIFOs; an entry's run id must
name its own file and its socket must be in the live directory; `ls` removes only what a
supervisor made there, and attach connects to no socket outside it."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from ddptop.remote.live import LIVE_ENV, LiveRun, live_runs, read_entry, write_entry
from ddptop.remote.viewer import RemoteSession, ViewerError


@pytest.fixture
def live() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="dr", dir="/tmp"))  # short: socket paths are limited
    yield path
    shutil.rmtree(path, ignore_errors=True)


def dead_pid() -> int:
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    return gone.pid


def entry(run_id: str, pid: int, sock: str) -> LiveRun:
    return LiveRun(run_id=run_id, pid=pid, socket=sock, token="t", run_dir="/d", runs_dir="/",
                   preset="baseline", world_size=2, detached=True, started_at=time.time())


def test_crafted_entries_are_skipped_in_under_a_second_and_nothing_outside_is_touched(
        live: Path, tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    victim = outside / "victim.sock"
    victim.write_text("theirs")
    (outside / "victim.json").write_text("theirs")
    pid = dead_pid()
    os.mkfifo(live / "fifo.json")  # a plain open would block for ever
    (live / "zero.json").symlink_to("/dev/zero")  # a plain read would never end
    (live / "dir.json").mkdir()
    (live / "big.json").write_text(" " * (1 << 20) + "{}")
    write_entry(live, entry("out", pid, str(victim)))  # dead, its socket elsewhere: ls would delete it
    write_entry(live, entry("dots", pid, f"{live}/../{outside.name}/victim.sock"))
    dots = dict(entry("x", pid, "").to_dict(), run_id=f"../{outside.name}/victim")  # `../` in the id
    (live / "evil.json").write_text(json.dumps(dots))
    (live / "types.json").write_text(json.dumps(dict(entry("types", pid, "").to_dict(), step="9")))
    stale = live / "ab12cd34.sock"  # what a dead supervisor leaves: removed with its entry
    stale.write_text("")
    write_entry(live, entry("mine", pid, str(stale)))

    t0 = time.monotonic()
    assert live_runs(live) == []
    assert time.monotonic() - t0 < 1.0
    res = subprocess.run([sys.executable, "-m", "ddptop", "ls", "--json"], capture_output=True, text=True,
                         env={**os.environ, LIVE_ENV: str(live)}, timeout=30)
    assert res.returncode == 0 and json.loads(res.stdout) == [], res.stderr

    assert victim.read_text() == "theirs" and (outside / "victim.json").read_text() == "theirs"
    left = sorted(p.name for p in live.iterdir())
    # what no supervisor made stays (not ls's to delete); the entries ls read as its own, and
    # the dead supervisor's socket, are gone
    assert left == ["big.json", "dir.json", "dots.json", "evil.json", "fifo.json", "out.json", "types.json",
                    "zero.json"]
    assert [read_entry(live / name) for name in left] == [None] * len(left)


def test_attach_connects_to_no_socket_outside_the_live_dir(live: Path, tmp_path: Path) -> None:
    outside = Path(tempfile.mkdtemp(prefix="do", dir="/tmp"))
    server = socket.socket(socket.AF_UNIX)
    try:
        server.bind(str(outside / "trap.sock"))
        server.listen(1)
        server.setblocking(False)
        session = RemoteSession.attach(entry("trap", os.getpid(), str(outside / "trap.sock")), live)
        with pytest.raises(ViewerError, match="is not in the live directory"):
            asyncio.run(session.run())
        with pytest.raises(BlockingIOError):
            server.accept()  # nobody came
    finally:
        server.close()
        shutil.rmtree(outside, ignore_errors=True)
