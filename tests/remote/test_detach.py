"""Runs that outlive their terminal: a supervisor process holds each run, TUIs are
viewers of it. Real 2-rank CPU runs: a detached run survives a viewer's SIGHUP and
shows its whole history on re-attach; an owned run stops cleanly when its TUI dies;
`d` detaches; wrong tokens are refused; bad input starts nothing. Viewer processes
run in a pseudo-terminal, as on an SSH session."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import os
import pickle
import pty
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import psutil
import pytest
from test_tui import START_TIMEOUT, alive_of, cpu_config, wait_for
from waiting import wait_until as _wait_until

from ddptop.remote.live import LIVE_ENV, LiveRun, find_run, live_runs
from ddptop.remote.viewer import RemoteSession
from ddptop.tui.factory import build_app, build_attach_app
from ddptop.tui.screens.choice_screen import ChoiceScreen
from ddptop.tui.synthetic import synthetic_state
from ddptop.viewer_wire import state_codec
from ddptop.viewer_wire import viewer_protocol as vp

wait_until = functools.partial(_wait_until, every=0.2)  # this file's polls look every 0.2 s (each looks at every process)
RUN_ARGS = ["--nproc", "2", "--steps", "100000", "--warmup", "2", "--set", "workers=0"]


@pytest.fixture
def live(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A private live directory of this test, short enough for socket paths."""
    path = Path(tempfile.mkdtemp(prefix="dt", dir="/tmp"))
    monkeypatch.setenv(LIVE_ENV, str(path))
    yield path
    # A test that failed half-way leaves its detached run going: stop it like a user
    # would (SIGTERM: the clean stop), then make sure.
    procs: list[psutil.Process] = []
    for entry in live_runs(path):
        try:
            root = psutil.Process(entry.pid)
            procs += [root, *root.children(recursive=True)]
            root.terminate()
        except psutil.Error:
            pass
    _, alive = psutil.wait_procs(procs, timeout=20)
    for proc in alive:
        with contextlib.suppress(psutil.Error):
            proc.kill()
    shutil.rmtree(path, ignore_errors=True)


def ddptop(*args: str, timeout: float = 60, columns: int | None = None) -> subprocess.CompletedProcess[str]:
    env = None if columns is None else {**os.environ, "COLUMNS": str(columns)}
    return subprocess.run([sys.executable, "-m", "ddptop", *args], capture_output=True, text=True,
                          timeout=timeout, env=env)


def in_terminal(*args: str) -> subprocess.Popen[bytes]:
    """`ddptop ARGS` with a pseudo-terminal (120x40) as its terminal; its screen is drained
    by a thread so the TUI never blocks on output."""
    import fcntl
    import termios

    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))
    proc = subprocess.Popen([sys.executable, "-m", "ddptop", *args], stdin=slave, stdout=slave,
                            stderr=slave, env={**os.environ, "TERM": "xterm-256color"},
                            start_new_session=True)
    os.close(slave)

    def drain() -> None:
        while True:
            try:
                if not os.read(master, 1 << 16):
                    break
            except OSError:
                break
        os.close(master)

    threading.Thread(target=drain, daemon=True).start()
    return proc


def entry_of(run_id: str, live: Path) -> LiveRun | None:
    return next((e for e in live_runs(live) if e.run_id == run_id), None)


def tree(pid: int) -> list[int]:
    root = psutil.Process(pid)
    return [pid, *(p.pid for p in root.children(recursive=True))]


def wait_gone(pids: list[int], timeout: float) -> float:
    """Seconds until none of `pids` runs (zombies count as gone)."""
    t0 = time.monotonic()
    wait_until(lambda: not alive_of(pids), timeout, f"processes {alive_of(pids)} to end")
    return time.monotonic() - t0


# --- a detached run ------------------------------------------------------------------------


@pytest.mark.e2e
@pytest.mark.slow  # the suite stays under 10 min on 2 cores: `pytest -m slow` runs it (covered: the other detach tests and test_restart_race)
def test_detached_run_survives_viewers_and_stops_from_one(tmp_path: Path, live: Path) -> None:
    runs = tmp_path / "runs"
    res = ddptop(*RUN_ARGS, "--runs-dir", str(runs), "--detach")
    assert res.returncode == 0, res.stderr
    run_id = res.stdout.split()[2]
    assert f"ddptop attach {run_id}" in res.stdout and str(live) in res.stdout
    entry = find_run(run_id, live)
    assert entry.detached and entry.run_dir == str(runs.resolve() / run_id)
    assert oct(os.stat(entry.socket).st_mode & 0o777) == "0o600"
    assert oct(os.stat(live / f"{run_id}.json").st_mode & 0o777) == "0o600"
    # its own session: no terminal of ours can signal it
    assert os.getsid(entry.pid) == entry.pid

    # 1. A viewer (pilot) attaches: the run is there; `q` asks; `d` leaves it going.
    async def first_viewer() -> tuple[int, tuple[float, float], str]:
        app = build_attach_app(entry)
        async with app.run_test(size=(120, 40)) as pilot:
            state = app.workbench.current.state
            await wait_for(pilot, lambda: all(rs.last_step > 3 for rs in state.ranks.values())
                           and len(state.history) >= 2, START_TIMEOUT, "both ranks stepping")
            await pilot.press("q")
            assert isinstance(app.screen, ChoiceScreen)  # detach or stop: not a plain quit
            await pilot.press("escape")
            await pilot.pause()
            assert app.is_running and app.workbench.is_live()
            await pilot.press("d")
            await wait_for(pilot, lambda: not app.is_running, 10, "the viewer to close")
            return min(rs.last_step for rs in state.ranks.values()), state.history[0], app.exit_note

    step_at_detach, first_sample, note = asyncio.run(first_viewer())
    assert f"ddptop attach {run_id}" in note

    # 2. A real `ddptop attach` process in a terminal, which then hangs up (SSH drop).
    viewer = in_terminal("attach", run_id[:20])  # a unique prefix is enough
    wait_until(lambda: (e := entry_of(run_id, live)) and e.viewers == 1, 20, "the attach viewer to connect")
    viewer.send_signal(signal.SIGHUP)
    assert viewer.wait(timeout=15) == 0
    wait_until(lambda: (e := entry_of(run_id, live)) and e.viewers == 0, 10, "the viewer to be gone")
    assert psutil.Process(entry.pid).is_running()

    # 3. Re-attach: the steps went on meanwhile, and the whole history is there.
    async def second_viewer() -> tuple[list[int], float]:
        app = build_attach_app(find_run(run_id, live))
        async with app.run_test(size=(120, 40)) as pilot:
            session = app.workbench.current
            state = session.state
            await wait_for(pilot, lambda: state.status == "running", 10, "the first snapshot")
            first = {r: rs.last_step for r, rs in state.ranks.items()}
            assert min(first.values()) > step_at_detach
            for rs in state.ranks.values():
                assert rs.steps == rs.last_step + 1  # every record since step 0
            assert state.history[0] == first_sample  # throughput since the start, not since attach
            assert any("[trainer] rank 0" in line for line in state.logs[0])  # rank 0's first words
            await wait_for(pilot, lambda: all(rs.last_step > first[r] + 5 for r, rs in state.ranks.items()),
                           20, "the step count to keep rising")

            # `ddptop ls` lists it, with a step and its mode, and no token (wide enough to keep
            # pid and mode: at 80 columns they are the first to go, issue 46)
            listed = ddptop("ls", columns=300)
            assert listed.returncode == 0
            line = next(x for x in listed.stdout.splitlines() if x.startswith(run_id))
            assert "detached" in line and "running" in line and str(entry.pid) in line
            (row,) = [e for e in json.loads(ddptop("ls", "--json").stdout) if e["run_id"] == run_id]
            assert row["step"] > step_at_detach and row["world_size"] == 2 and "token" not in row

            # 4. Stop it from this viewer: nothing of it is left.
            pids = tree(session.pid)
            assert len(pids) >= 4  # supervisor, torchrun, 2 ranks
            await pilot.press("x")
            await pilot.press("y")  # `x` asks first on a live run
            t0 = time.monotonic()
            await wait_for(pilot, lambda: state.status == "stopped", 40, "the run to stop")
            stopped_s = time.monotonic() - t0
            await pilot.press("q")  # nothing live: quits at once
            return pids, stopped_s

    pids, stopped_s = asyncio.run(second_viewer())
    gone_s = wait_gone(pids, 15)
    print(f"\nstopped from a viewer in {stopped_s:.2f}s; every process gone {gone_s:.2f}s later")
    summary = json.loads((runs / run_id / "summary.json").read_text())
    assert summary["status"] == "stopped"
    last = [r["last_step"] for r in summary["ranks"]]
    assert last[0] == last[1]  # the agreed stop step
    assert entry_of(run_id, live) is None and not Path(entry.socket).exists()
    assert "supervisor" in (runs / run_id / "supervisor.log").read_text()


# --- an owned run -------------------------------------------------------------------------


@pytest.mark.e2e
def test_owned_run_stops_cleanly_when_its_tui_dies_and_wrong_tokens_are_refused(
        tmp_path: Path, live: Path) -> None:
    runs = tmp_path / "runs"
    tui = in_terminal(*RUN_ARGS, "--runs-dir", str(runs))  # plainly: the TUI owns the run
    try:
        entry = wait_until(lambda: next(iter(live_runs(live)), None), 20, "the supervisor")
        assert not entry.detached
        wait_until(lambda: (e := entry_of(entry.run_id, live)) and e.step > 3 and e.viewers == 1,
              START_TIMEOUT, "both ranks stepping")

        # A viewer with a wrong token is refused and counted; the run goes on.
        async def intruder() -> tuple[bytes, bytes]:
            reader, writer = await asyncio.open_unix_connection(entry.socket)
            writer.write(vp.encode("hello", token="0" * 32, owner=True))
            reply = await reader.readline()
            rest = await asyncio.wait_for(reader.read(), 5)  # then closed
            writer.close()
            return reply, rest

        reply, rest = asyncio.run(intruder())
        assert vp.decode(reply) == {"kind": "refused", "reason": "wrong token"} and rest == b""
        assert entry_of(entry.run_id, live).viewers == 1

        pids = tree(entry.pid)
        assert len(pids) >= 4
        tui.kill()  # the terminal's process dies without a word: no stop, no detach sent
        t0 = time.monotonic()
        tui.wait(timeout=10)
        gone_s = wait_gone(pids, 30)
    finally:
        if tui.poll() is None:
            tui.kill()
    print(f"\nowner killed: run stopped and every process gone in {gone_s:.2f}s "
          f"({time.monotonic() - t0:.2f}s)")
    summary = json.loads((runs / entry.run_id / "summary.json").read_text())
    assert summary["status"] == "stopped" and "owner viewer disconnected" in summary["error"]
    last = [r["last_step"] for r in summary["ranks"]]
    assert last[0] == last[1]  # cleanly, at the agreed step
    assert summary["refused_connections"] == 1
    assert live_runs(live) == [] and not Path(entry.socket).exists()


@pytest.mark.e2e
def test_d_detaches_an_owned_run_and_it_keeps_going(tmp_path: Path, live: Path) -> None:
    async def owner() -> tuple[str, int, str]:
        app = build_app(cpu_config(steps=100000), tmp_path)
        async with app.run_test(size=(80, 24)) as pilot:
            session = app.workbench.current
            state = session.state
            await wait_for(pilot, lambda: all(rs.last_step > 3 for rs in state.ranks.values()),
                           START_TIMEOUT, "both ranks stepping")
            assert session.owner and not session.detached
            await pilot.press("d")
            await wait_for(pilot, lambda: not app.is_running, 10, "the TUI to close")
            return session.run_id, session.pid, app.exit_note

    run_id, pid, note = asyncio.run(owner())
    assert note == f"run {run_id} goes on detached; watch it again with: ddptop attach {run_id}"
    entry = wait_until(lambda: entry_of(run_id, live), 5, "the registry entry")
    assert entry.detached and entry.pid == pid
    step = entry.step
    wait_until(lambda: (e := entry_of(run_id, live)) and e.step > step + 5, 20, "steps without any viewer")

    async def stop() -> None:  # any viewer may stop a detached run
        session = RemoteSession.attach(find_run(run_id, live))
        runner = asyncio.create_task(session.run())
        while session.state.status != "running":
            await asyncio.sleep(0.1)
        session.request_stop("test")
        state = await asyncio.wait_for(runner, 40)
        assert state.status == "stopped" and state.error == "test"

    pids = tree(pid)
    asyncio.run(stop())
    wait_gone(pids, 15)
    assert live_runs(live) == []


# --- usage and protocol ---------------------------------------------------------------------


def test_attach_to_an_unknown_run_is_one_line_and_exit_2(live: Path) -> None:
    res = ddptop("attach", "nosuch")
    assert res.returncode == 2 and res.stdout == ""
    (line,) = res.stderr.strip().splitlines()
    assert line.startswith("ddptop attach: error:") and "no live" in line


@pytest.mark.parametrize("args, fragment", [
    (["--preset", "nosuch"], "valid: single, baseline"),
    (["--steps", "0"], "steps must be at least 1"),
    (["--headless"], "--headless does not apply"),
    (["--json"], "--json does not apply"),
])
def test_detach_with_bad_input_starts_nothing(tmp_path: Path, live: Path, args: list[str],
                                              fragment: str) -> None:
    runs = tmp_path / "runs"
    res = ddptop("--nproc", "2", "--detach", "--runs-dir", str(runs), *args)
    assert res.returncode == 2 and res.stdout == ""
    (line,) = res.stderr.strip().splitlines()
    assert line.startswith("ddptop: error:") and fragment in line, line
    assert not runs.exists() or not any(runs.iterdir())
    assert list(live.iterdir()) == []  # no supervisor, no socket, no registry entry


def test_detach_refuses_a_live_dir_others_can_enter(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o755)
    shared.chmod(0o755)
    monkeypatch.setenv(LIVE_ENV, str(shared))
    res = ddptop("--nproc", "2", "--detach", "--runs-dir", str(tmp_path / "runs"))
    assert res.returncode == 2 and "mode 0700" in res.stderr and len(res.stderr.strip().splitlines()) == 1
    assert list(shared.iterdir()) == []


def test_state_snapshot_round_trips_and_a_pickle_is_refused() -> None:
    state = synthetic_state(4)
    back = vp.load_state(vp.dump_state(state))
    assert back.summary() == state.summary()
    assert list(back.logs[0]) == list(state.logs[0]) and list(back.history) == list(state.history)

    class Evil:
        def __reduce__(self):  # noqa: ANN204
            return (os.system, ("true",))

    with pytest.raises(vp.ViewerProtocolError, match="not JSON"):
        vp.load_state(pickle.dumps(Evil()))
    assert vp.mismatch(vp.decode(b'{"v": 99, "kind": "hello"}'))  # refused at the handshake
    assert vp.decode(vp.encode("stop", reason="x")) == {"v": vp.VERSION, "kind": "stop", "reason": "x"}


def test_snapshots_carry_only_changed_logs_and_a_viewer_that_missed_one_gets_them_all(
        live: Path) -> None:
    from types import SimpleNamespace

    from ddptop.remote.supervisor import Supervisor, _Viewer

    class Writer:  # a viewer's connection: a buffer, and a transport that can be "full"
        def __init__(self) -> None:
            self.frames: list[tuple[dict, object]] = []
            self.full = False
            self.transport = SimpleNamespace(is_closing=lambda: False,
                                             get_write_buffer_size=lambda: 1 << 40 if self.full else 0)

        def write(self, data: bytes) -> None:
            head, _, payload = data.partition(b"\n")
            self.frames.append((vp.decode(head), json.loads(payload)))

    state = synthetic_state(2)
    session = SimpleNamespace(state=state, done=False, run_id=state.run_id)
    sup = Supervisor(session, live, detached=True)  # type: ignore[arg-type]
    a, b = Writer(), Writer()
    marks = state_codec.marks(state)  # both had the last snapshot
    sup.viewers = {_Viewer(a, owner=False, marks=marks), _Viewer(b, owner=False, marks=marks)}
    state.add_log(1, "a new line")
    b.full = True  # b misses this tick
    sup._broadcast(final=False)
    (head, snap), = a.frames
    assert snap["delta"] and set(snap["state"]["logs"]) == {"1"} and snap["state"]["logs"]["1"][-1] == "a new line"
    assert b.frames == []
    b.full = False
    sup._broadcast(final=False)
    head, snap = a.frames[-1]
    assert snap["delta"] and snap["state"]["logs"] == {}  # nothing new for a
    (head, snap), = b.frames
    assert not snap["delta"] and set(snap["state"]["logs"]) == {str(r) for r in state.logs}  # b catches up
    assert list(state.logs[1])[-1] == "a new line"  # the supervisor's own state is untouched


# --- the browser view ---------------------------------------------------------------------


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.e2e
def test_attach_web_serves_the_app_page_and_runs_a_viewer_per_browser(tmp_path: Path, live: Path) -> None:
    import urllib.error
    import urllib.request

    import aiohttp

    # A detached run of a plain command through torchrun: live, cheap (no torch in the rank).
    res = ddptop("--nproc", "1", "--detach", "--runs-dir", str(tmp_path), "--", "sleep", "300")
    assert res.returncode == 0, res.stderr
    run_id = res.stdout.split()[2]
    entry = find_run(run_id, live)
    bad = ddptop("attach", "--web", "--port", "0", run_id)
    assert bad.returncode == 2 and "--port must be in 1-65535" in bad.stderr

    port = free_port()
    server = subprocess.Popen([sys.executable, "-m", "ddptop", "attach", "--web", "--read-only",
                               "--port", str(port), run_id],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    out: list[str] = []
    threading.Thread(target=lambda: out.extend(line.decode() for line in server.stdout), daemon=True).start()
    try:
        url = str(wait_until(lambda: next((w for line in out for w in line.split() if "?token=" in w), None),
                        30, "the token URL"))
        assert url.startswith(f"http://127.0.0.1:{port}/?token=")
        token = url.split("=", 1)[1]

        def page(address: str) -> tuple[int, str] | None:
            try:
                with urllib.request.urlopen(address, timeout=5) as resp:
                    return resp.status, resp.read().decode()
            except urllib.error.HTTPError as exc:
                return exc.code, ""
            except OSError:
                return None

        assert wait_until(lambda: page(f"http://127.0.0.1:{port}/"), 30, "the web server") == (403, "")
        status, html = page(url)
        assert status == 200
        assert f"<div>ddptop {run_id}</div>" in html  # the page of this run
        assert f'data-session-websocket-url="ws://127.0.0.1:{port}/ws"' in html

        async def browser() -> bytes:  # what the page's script does: a websocket drives one viewer
            async with aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True)) as http:
                async with http.get(url) as resp:  # the cookie, as the browser keeps it
                    assert resp.status == 200
                async with http.ws_connect(f"http://127.0.0.1:{port}/ws?width=100&height=30",
                                           origin=f"http://127.0.0.1:{port}") as ws:
                    screen = b""

                    async def read(until_: Callable[[], bool], timeout: float, what: str) -> None:
                        nonlocal screen
                        deadline = time.monotonic() + timeout
                        while not until_():
                            if time.monotonic() > deadline:
                                raise AssertionError(f"timed out waiting for {what}")
                            with contextlib.suppress(asyncio.TimeoutError):
                                msg = await ws.receive(timeout=0.5)
                                if msg.type == aiohttp.WSMsgType.BINARY:
                                    screen += msg.data

                    await read(lambda: screen and (e := entry_of(run_id, live)) and e.viewers == 1, 30,
                               "a viewer of the run behind the page")
                    # Who else sees the secret: no process's command line holds it.
                    for proc in psutil.process_iter(["cmdline"]):
                        assert token not in " ".join(proc.info["cmdline"] or ()), proc
                    await ws.send_str(json.dumps(["stdin", "x"]))  # the key that stops a run...
                    await read(lambda: b"cannot stop the run" in screen, 15, "the read-only notice")
                    return screen

        assert b"read-only view" in asyncio.run(browser())  # the TUI's screen, drawn for the browser
        wait_until(lambda: (e := entry_of(run_id, live)) and e.viewers == 0, 15, "the page's viewer to go")
        assert entry_of(run_id, live).status in ("starting", "running")  # ...did not: a watcher's page
    finally:
        server.send_signal(signal.SIGINT)
        server.wait(timeout=15)
    assert f"serving run {run_id} at http://127.0.0.1:{port}/?token=" in "".join(out)

    pids = tree(entry.pid)
    os.kill(entry.pid, signal.SIGTERM)  # the supervisor stops its run cleanly on SIGTERM
    wait_gone(pids, 30)
    assert json.loads((tmp_path / run_id / "summary.json").read_text())["status"] == "stopped"


def test_ls_ignores_and_cleans_entries_of_dead_supervisors(live: Path) -> None:
    from ddptop.remote.live import write_entry

    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()  # a pid that no longer runs (a supervisor killed with SIGKILL leaves this)
    sock = live / "x.sock"
    sock.write_text("")
    write_entry(live, LiveRun(run_id="r1", pid=gone.pid, socket=str(sock), token="t", run_dir="/d",
                              runs_dir="/", preset="baseline", world_size=2, detached=True,
                              started_at=time.time()))
    write_entry(live, LiveRun(run_id="r2", pid=os.getpid(), socket="", token="t", run_dir="/d",
                              runs_dir="/", preset="baseline", world_size=2, detached=True,
                              started_at=time.time()))  # alive, but not a supervisor: a reused pid
    res = ddptop("ls", "--json")
    assert res.returncode == 0 and json.loads(res.stdout) == []
    assert list(live.iterdir()) == []  # both entries and the stale socket removed
