"""Viewers whose terminal goes away: real `ddptop` processes in a real pseudo-terminal
whose master side is closed, as sshd or tmux does on an SSH drop or `kill-session`. With
the pty as the controlling terminal (SIGHUP, then EIO/EOF) and without it (EIO/EOF only,
no signal): the owned TUI stops its run cleanly and every process of it is gone; an
attached viewer leaves and its detached run goes on. And the TUI's exit after a stop:
130 and the same closing lines as headless."""

from __future__ import annotations

import contextlib
import fcntl
import functools
import json
import os
import pty
import re
import select
import struct
import subprocess
import sys
import termios
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import psutil
import pytest
from test_detach import ddptop, entry_of, live  # noqa: F401  (live: a fixture)
from waiting import hold
from waiting import wait_until as _wait_until

from ddptop.remote.live import LIVE_ENV, live_runs

wait_until = functools.partial(_wait_until, every=0.1)  # this file's polls look every 0.1 s (each looks at every process)
RUN_ARGS = ["--nproc", "2", "--steps", "100000", "--warmup", "2", "--set", "workers=0"]
START_TIMEOUT = 60.0  # torch import in two ranks on a loaded 2-core box
VIEWER_GONE_S = 5.0  # a viewer, once its terminal is gone
RUN_GONE_S = 10.0  # a clean stop at an agreed step, torchrun included (issue 17)
TERMINAL_GONE_S = 5.0  # every ddptop process, once the owned TUI's terminal is gone (issue 17, must-show 2)


def _take_terminal() -> None:  # in the child, after setsid: the pty becomes its terminal
    fcntl.ioctl(0, termios.TIOCSCTTY, 0)


class Terminal:
    """`ddptop ARGS` in a pseudo-terminal (120x40) that this test holds the master of.
    `controlling`: the pty is the process's controlling terminal (as under sshd), so
    closing the master also sends SIGHUP."""

    def __init__(self, *args: str, controlling: bool = True) -> None:
        self.master, slave = pty.openpty()
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "ddptop", *args], stdin=slave, stdout=slave, stderr=slave,
            env={**os.environ, "TERM": "xterm-256color"}, start_new_session=True,
            preexec_fn=_take_terminal if controlling else None)
        os.close(slave)
        self.screen = bytearray()
        self._stop = threading.Event()
        # select + a flag, not a blocking read: a read in flight would keep the master open
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        while not self._stop.is_set():
            if select.select([self.master], [], [], 0.1)[0]:
                try:
                    data = os.read(self.master, 1 << 16)
                except OSError:
                    return
                if not data:
                    return
                self.screen += data

    def type(self, keys: str) -> None:
        os.write(self.master, keys.encode())

    def hang_up(self) -> None:
        """Close the master side: the terminal is gone."""
        self._stop.set()
        self._reader.join()
        os.close(self.master)
        self.master = -1

    def close(self) -> None:
        if self.master >= 0:
            self.hang_up()
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def text(self) -> str:
        return self.screen.decode(errors="replace")


@contextlib.contextmanager
def terminal(*args: str, controlling: bool = True) -> Iterator[Terminal]:
    term = Terminal(*args, controlling=controlling)
    try:
        yield term
    finally:
        term.close()


class Census:
    """Every process under `root`, sampled every 0.1 s from now on: a child that gets
    reparented (to init or a subreaper) when its parent exits is still counted."""

    def __init__(self, root: int) -> None:
        self.seen: dict[int, psutil.Process] = {}
        self._root = psutil.Process(root)
        self._stop = threading.Event()
        self._sample()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    def _sample(self) -> None:
        with contextlib.suppress(psutil.Error):
            for proc in [self._root, *self._root.children(recursive=True)]:
                self.seen.setdefault(proc.pid, proc)
            for proc in list(self.seen.values()):  # and what they started since, wherever it is now
                with contextlib.suppress(psutil.Error):
                    for child in proc.children(recursive=True):
                        self.seen.setdefault(child.pid, child)

    def _loop(self) -> None:
        while not self._stop.wait(0.1):
            self._sample()

    def alive(self) -> list[str]:
        out = []
        for proc in self.seen.values():
            with contextlib.suppress(psutil.Error):
                if proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE:
                    out.append(f"{proc.pid} {' '.join(proc.cmdline())[:80]}")
        return out

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


def gone_within(check: Callable[[], list[str]], timeout: float) -> float:
    t0 = time.monotonic()
    wait_until(lambda: not check(), timeout, "processes to end")
    return time.monotonic() - t0


def stepping(live: Path, steps: int = 3) -> object:  # noqa: F811
    return wait_until(lambda: next((e for e in live_runs(live) if e.step > steps and e.viewers >= 1), None),
                 START_TIMEOUT, "a run stepping with its viewer")


@pytest.mark.e2e
@pytest.mark.parametrize("controlling", [True, pytest.param(False, marks=pytest.mark.slow)],
                         ids=["sighup-then-eio", "eio-eof-no-signal"])  # the second: -m slow
def test_owned_tui_whose_terminal_closes_stops_its_run_and_leaves_nothing(
        tmp_path: Path, live: Path, controlling: bool) -> None:  # noqa: F811
    runs = tmp_path / "runs"
    with terminal(*RUN_ARGS, "--runs-dir", str(runs), controlling=controlling) as term:
        census = Census(term.proc.pid)
        entry = stepping(live)
        assert not entry.detached
        term.hang_up()
        t0 = time.monotonic()
        code = term.proc.wait(RUN_GONE_S + 5)
        tui_s = time.monotonic() - t0
        all_s = tui_s + gone_within(census.alive, 5)
        census.stop()
    print(f"\nterminal closed ({'controlling' if controlling else 'no signal'}): TUI gone in {tui_s:.2f}s, "
          f"all {len(census.seen)} processes in {all_s:.2f}s")
    # The TUI sees its run to a clean end (as for `q`), then leaves: when it is gone, so is the rest.
    assert all_s <= TERMINAL_GONE_S, f"{all_s:.2f}s"
    assert all_s - tui_s < 1.0
    assert code == 130
    summary = json.loads((runs / entry.run_id / "summary.json").read_text())
    assert summary["status"] == "stopped" and "terminal closed" in summary["error"], summary["error"]
    last = [r["last_step"] for r in summary["ranks"]]
    assert last[0] == last[1]  # cleanly, at the agreed step
    assert live_runs(live) == []


def detached_sleeper(runs: Path) -> str:
    """A detached run of a plain command through torchrun: live and cheap (no torch in the rank),
    returned once its rank runs. A stop that lands while torchrun is still spawning the rank takes
    torchrun's own shutdown (up to its 30 s on a loaded host, as under plain torchrun): the tests
    that stop this run time a steady run's stop, not that."""
    res = ddptop("--nproc", "1", "--detach", "--runs-dir", str(runs), "--", "sleep", "300")
    assert res.returncode == 0, res.stderr
    run_id = res.stdout.split()[2]
    live_dir = Path(os.environ[LIVE_ENV])

    def rank_runs() -> bool:
        entry = entry_of(run_id, live_dir)
        with contextlib.suppress(psutil.Error):
            return entry is not None and any(p.name() == "sleep" for p in psutil.Process(entry.pid).children(recursive=True))
        return False

    wait_until(rank_runs, 60, f"run {run_id}'s rank to start")
    return run_id


def stop_run(run_id: str, live: Path) -> None:  # noqa: F811
    entry = entry_of(run_id, live)
    if entry is None:
        return
    root = psutil.Process(entry.pid)
    tree = [root, *root.children(recursive=True)]
    root.terminate()  # the supervisor's clean stop
    _, alive = psutil.wait_procs(tree, timeout=RUN_GONE_S)
    assert not alive, alive


@pytest.mark.e2e
@pytest.mark.parametrize("controlling", [True, False], ids=["sighup-then-eio", "eio-eof-no-signal"])
def test_attached_viewer_whose_terminal_closes_leaves_and_the_detached_run_goes_on(
        tmp_path: Path, live: Path, controlling: bool) -> None:  # noqa: F811
    run_id = detached_sleeper(tmp_path)
    try:
        with terminal("attach", run_id, controlling=controlling) as term:
            census = Census(term.proc.pid)
            wait_until(lambda: (e := entry_of(run_id, live)) and e.viewers == 1, START_TIMEOUT,
                  "the viewer to connect")
            term.hang_up()
            t0 = time.monotonic()
            code = term.proc.wait(VIEWER_GONE_S)
            gone_s = time.monotonic() - t0
            census.stop()
            assert census.alive() == []
        print(f"\nattached viewer: gone {gone_s:.2f}s after its terminal closed")
        assert code == 0
        wait_until(lambda: (e := entry_of(run_id, live)) and e.viewers == 0, 5, "the supervisor to see it go")
        assert entry_of(run_id, live).status in ("starting", "running")  # the run goes on
    finally:
        stop_run(run_id, live)


# --- the TUI's exit, as headless: exit code and closing lines ----------------------------


def after_the_tui(screen: str) -> str:
    """What the terminal shows once the TUI has left its alternate screen (the modes it
    resets on the way out taken away)."""
    return re.sub(r"\x1b\[[0-9;?]*[a-zA-Z]", "", screen.rsplit("\x1b[?1049l", 1)[-1])


@pytest.mark.e2e
# sigterm is slow-marked: test_tui's SIGTERM to the TUI covers the same stop
@pytest.mark.parametrize("how", ["x-then-q", pytest.param("sigterm", marks=pytest.mark.slow)])
def test_a_stopped_run_exits_130_with_the_closing_lines_of_headless(
        tmp_path: Path, live: Path, how: str) -> None:  # noqa: F811
    runs = tmp_path / "runs"
    with terminal(*RUN_ARGS, "--runs-dir", str(runs)) as term:
        entry = stepping(live)
        if how == "sigterm":
            term.proc.terminate()
        else:
            term.type("x")  # stop the run (asked first: yes); the TUI stays...
            wait_until(lambda: "Stop the live run?" in term.text(), 10, "the stop question")
            term.type("y")
            wait_until(lambda: (runs / entry.run_id / "summary.json").exists(), RUN_GONE_S + 5, "the stop")
            hold(1, "the final state reaches the TUI before q")
            term.type("q")  # ...until `q` (nothing live: no question)
        code = term.proc.wait(RUN_GONE_S + 10)
        hold(0.3, "the last bytes through the pty")
        shown = after_the_tui(term.text())
    assert code == 130, shown
    summary = json.loads((runs / entry.run_id / "summary.json").read_text())
    assert summary["status"] == "stopped"
    lines = [line.rstrip() for line in shown.replace("\r", "").splitlines() if line.strip()]
    assert lines[0].startswith(f"run {entry.run_id}: stopped"), lines
    assert lines[-1] == f"records: {runs.resolve() / entry.run_id}", lines
    assert any(line.split()[:1] == ["0"] and line.endswith("stopped") for line in lines)  # the rank table
    assert live_runs(live) == []


@pytest.mark.parametrize("status, owner, code", [
    ("completed", True, 0), ("failed", True, 1), ("stopped", True, 130), ("running", True, 130),
    ("stopped", False, 0),  # a viewer's exit says nothing about someone else's run
])
def test_exit_code_follows_the_run_this_tui_owned(tmp_path: Path, status: str, owner: bool,
                                                  code: int) -> None:
    from dataclasses import dataclass

    from ddptop.run.handle import DetachableRun
    from ddptop.tui.app import DdpTopApp, exit_code
    from ddptop.tui.synthetic import StaticSession, synthetic_state, synthetic_workbench

    @dataclass
    class Supervised(StaticSession):
        """A run held by a supervisor: this TUI owns it, or only watches it."""

        owner: bool = True
        detached: bool = False

        async def detach(self) -> None:
            self.detached = True

    state = synthetic_state(2)
    if status != "running":
        state.finish(status, time.time(), error="" if status == "completed" else "why")
    bench = synthetic_workbench(state, tmp_path)
    run = Supervised(state, bench.current.config, bench.current.run_dir, owner=owner)
    assert isinstance(run, DetachableRun)
    bench.sessions[-1] = run
    assert exit_code(DdpTopApp(bench, autostart=False)) == code
