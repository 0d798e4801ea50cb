"""Nothing a rank says is trusted beyond its rank (issue 16): with the token, a client still
cannot claim a rank outside the run, take over a connected rank, crash the decoder, get a
foreign process signalled, or crowd out the ranks with idle connections."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
import pytest
from test_detach import free_port
from test_hostile import TOKEN, good_rank, hung_up, send, steps, until, with_hub
from waiting import wait_until

from ddptop.model.config import RunConfig
from ddptop.remote.live import LIVE_ENV
from ddptop.run.hub import MAX_UNAUTHENTICATED
from ddptop.run.session import Session
from ddptop.wire import protocol


def hello(rank: int, world: int = 2, pid: int = 1) -> bytes:
    return protocol.encode(protocol.Hello(rank=rank, local_rank=rank, world_size=world, host="h", pid=pid,
                                          token=TOKEN))


def test_ranks_outside_the_run_and_second_hellos_are_refused_and_the_honest_rank_reports(monkeypatch):
    async def scenario(hub, sink, path):
        hub.world_size = 2
        r0, w0 = await good_rank(path)
        await until(lambda: any(isinstance(m, protocol.Hello) for m in sink.messages))
        forged = [hello(5), hello(1, world=10**9), hello(0)]  # out of range, huge world, a takeover
        raw = b'{"v":1,"kind":"hello","rank":1000000000000,"local_rank":0,"world_size":2,"host":"h","pid":1,"token":"x"}\n'
        for frame in [*forged, raw]:
            reader, writer = await asyncio.open_unix_connection(path)
            await send(writer, frame)
            assert await hung_up(reader)
            writer.close()
        await send(w0, steps(0, 0))
        await send(w0, b'{"v":1,"kind":"steps","rank":0,"records":[{"step":1,"step_ms":1' + b"0" * 400 + b"}]}\n")
        await send(w0, steps(0, 2))
        await until(lambda: sink.steps(0) == [0, 2])
        await hub.broadcast(protocol.Command("stop", at_step=3))  # rank 0's connection is still its own
        line = await asyncio.wait_for(r0.readline(), 5)
        assert protocol.decode(line) == protocol.Command("stop", at_step=3)
        w0.close()

    sink = with_hub(scenario)
    assert len(sink.refused) == 4, sink.refused
    assert any("this run has 2 rank(s)" in r for r in sink.refused)
    assert any("second hello for rank 0" in r for r in sink.refused)
    assert sink.dropped in (["bad-number"], ["bad-record"])  # a 400-digit step time: refused either way
    assert [m.rank for m in sink.messages if isinstance(m, protocol.Hello)] == [0]


def test_idle_connections_cannot_crowd_out_a_rank():
    async def scenario(hub, sink, path):
        idle = [await asyncio.open_unix_connection(path) for _ in range(MAX_UNAUTHENTICATED * 3)]
        r0, w0 = await good_rank(path)  # says hello at once: never the oldest waiting
        await send(w0, steps(0, 0))
        await until(lambda: sink.steps(0) == [0])
        for _, writer in idle:
            writer.close()
        w0.close()

    sink = with_hub(scenario)
    assert len(sink.refused) >= MAX_UNAUTHENTICATED * 2


def test_only_processes_of_our_own_torchrun_are_ever_signalled(tmp_path: Path):
    """A hello's pid is a claim: stall stacks (SIGUSR1) go only to descendants of torchrun."""
    stranger = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    torchrun = subprocess.Popen([sys.executable, "-c",
                                 "import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', "
                                 "'import time; time.sleep(60)']); time.sleep(60)"])
    try:
        session = Session(RunConfig(nproc=4), tmp_path)

        class Launcher:
            def tree(self):
                root = psutil.Process(torchrun.pid)
                return [root, *root.children(recursive=True)]

        session.procs.launcher = Launcher()
        deadline = 50
        while not psutil.Process(torchrun.pid).children() and deadline:
            deadline -= 1
            asyncio.run(asyncio.sleep(0.1))
        rank_pid = psutil.Process(torchrun.pid).children()[0].pid
        admitted = []
        for rank, pid in enumerate([rank_pid, stranger.pid, 0, os.getpid()]):
            msg = protocol.Hello(rank=rank, local_rank=rank, world_size=4, host="h", pid=pid, token="")
            admitted.append(session.collector.hub_admit(msg) is None)  # the hub refuses a hello it does not admit
            session.state.apply(msg, 1.0)
        assert admitted == [True, False, False, False]
        assert session.procs.rank_pids() == {0: rank_pid}  # and never signals a claimed pid
    finally:
        for p in (stranger, torchrun):
            for child in psutil.Process(p.pid).children(recursive=True):
                child.kill()
            p.kill()
            p.wait()


def test_run_directories_are_private(tmp_path: Path):
    from ddptop.run.recorder import new_run_dir

    old = os.umask(0o022)
    try:
        run_dir = new_run_dir(tmp_path / "runs", "r1")
    finally:
        os.umask(old)
    assert run_dir.stat().st_mode & 0o777 == 0o700


# --- another local user on the same machine ------------------------------------------------

OTHER_USER = "ddptop-other"


def other_uid() -> int | None:
    """A second local account to play the other user on a shared server (made when the tests run
    as root, as in CI); None where that is not possible."""
    import pwd

    if os.geteuid() != 0:
        return None
    try:
        return pwd.getpwnam(OTHER_USER).pw_uid
    except KeyError:
        pass
    if not shutil.which("useradd"):
        return None
    subprocess.run(["useradd", "--no-create-home", "--shell", "/usr/sbin/nologin", OTHER_USER],
                   capture_output=True)
    try:
        return pwd.getpwnam(OTHER_USER).pw_uid
    except KeyError:
        return None


@dataclass
class OtherUser:
    """The second local user: its uid and gid (no supplementary groups), an interpreter it can
    run, a world-readable copy of ddptop (and psutil) to import, and a private home of its own.
    Nothing of the owner's (the venv under /root, the environment, the tokens) is handed over."""

    uid: int
    gid: int
    python: str
    path: Path  # the copy of the sources on its sys.path
    home: Path  # 0700, its own: its HOME and its live directory

    def run(self, *argv: str, env: dict[str, str] | None = None, timeout: float = 60,
            ) -> subprocess.CompletedProcess[str]:
        base = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": str(self.home), "PYTHONPATH": str(self.path),
                "PYTHONDONTWRITEBYTECODE": "1", LIVE_ENV: str(self.home / "live")}
        return subprocess.run(list(argv), capture_output=True, text=True, user=self.uid, group=self.gid,
                              extra_groups=[], env={**base, **(env or {})}, cwd=str(self.home), timeout=timeout)

    def py(self, code: str, *args: str, **kw: Any) -> subprocess.CompletedProcess[str]:
        return self.run(self.python, "-c", code, *args, **kw)

    def ddptop(self, *args: str, **kw: Any) -> subprocess.CompletedProcess[str]:
        return self.run(self.python, "-m", "ddptop", *args, **kw)


@pytest.fixture(scope="module")
def other_user() -> Iterator[OtherUser]:
    import grp

    import psutil as psutil_module

    uid = other_uid()
    if uid is None:
        pytest.skip("needs root (to act as a second local user with useradd), as CI runs")
    gid = grp.getgrnam(OTHER_USER).gr_gid if OTHER_USER in {g.gr_name for g in grp.getgrall()} else uid
    base = Path(tempfile.mkdtemp(prefix="ddptop-other-", dir="/tmp"))
    try:
        base.chmod(0o755)
        src = base / "src"
        skip = shutil.ignore_patterns("__pycache__", "*.pyc")
        shutil.copytree(Path(__file__).resolve().parents[2] / "ddptop", src / "ddptop", ignore=skip)
        shutil.copytree(Path(psutil_module.__file__).parent, src / "psutil", ignore=skip)
        for path in [src, *src.rglob("*")]:
            path.chmod(0o755 if path.is_dir() else 0o644)
        home = base / "home"
        home.mkdir(mode=0o700)
        os.chown(home, uid, gid)
        user = OtherUser(uid, gid, "", src, home)
        # An interpreter the other user can run and that imports the copy: the venv's own
        # lives under /root (0700), so usually the system's python3.
        candidates = [os.path.realpath(sys.executable), os.path.realpath(getattr(sys, "_base_executable", "")),
                      "/usr/bin/python3", shutil.which("python3") or ""]
        tried = []
        for python in dict.fromkeys(c for c in candidates if c):
            try:
                res = user.run(python, "-c", "import sys, psutil, ddptop.cli; print('ok', sys.version_info >= (3, 10))")
            except OSError as exc:  # not even executable by it (under /root)
                tried.append(f"{python}: {exc.strerror}")
                continue
            tried.append(f"{python}: {(res.stdout + res.stderr).strip()[-120:]}")
            if res.stdout.strip() == "ok True":
                user.python = python
                break
        if not user.python:
            pytest.skip("no python the second user can run with ddptop's sources: " + "; ".join(tried))
        yield user
    finally:
        shutil.rmtree(base, ignore_errors=True)


SOCKET_PROBE = r"""
import errno, socket, sys
for path in sys.argv[1:]:
    s = socket.socket(socket.AF_UNIX)
    try:
        s.connect(path)
        print(path, "CONNECTED")
    except OSError as exc:
        print(path, errno.errorcode.get(exc.errno, exc.errno))
    finally:
        s.close()
"""

WEB_PROBE = r"""
import base64, json, os, socket, sys, urllib.error, urllib.request
port, token = int(sys.argv[1]), sys.argv[2]
base = f"http://127.0.0.1:{port}"

def get(path):
    try:
        with urllib.request.urlopen(base + path, timeout=10) as resp:
            return resp.status
    except urllib.error.HTTPError as exc:
        return exc.code

def upgrade(path, origin):
    # a websocket handshake by hand (the other user has only the standard library)
    key = base64.b64encode(os.urandom(16)).decode()
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall((f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nUpgrade: websocket\r\n"
                   f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n"
                   f"Origin: {origin}\r\n\r\n").encode())
        return int(s.recv(4096).split(b" ", 2)[1])

print(json.dumps({
    "page": get("/"), "asset": get("/static/js/textual.js"), "bad_token": get("/?token=guess"),
    "ws": upgrade("/ws?width=80&height=24", base), "ws_bad_token": upgrade("/ws?token=guess", base),
    "ws_foreign_origin": upgrade(f"/ws?token={token}", "http://evil.example"),
    "page_with_secret": get(f"/?token={token}"),  # the control: this user reaches the server
}))
"""

CMDLINES = r"""
import os
out = []
for pid in filter(str.isdigit, os.listdir("/proc")):
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            out.append(f.read().replace(b"\0", b" ").decode(errors="replace"))
    except OSError:
        pass
print("\n".join(out))
"""


def stop_tree(pid: int) -> None:
    """SIGTERM a supervisor (its clean stop), then make sure nothing of it is left."""
    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
        root.terminate()
    except psutil.Error:
        return
    _, alive = psutil.wait_procs(procs, timeout=30)
    for proc in alive:
        with contextlib.suppress(psutil.Error):
            proc.kill()


@pytest.mark.e2e
def test_another_local_user_cannot_read_runs_or_reach_live_runs(other_user: OtherUser) -> None:
    """A real detached 2-rank run, its live directory made by ddptop itself, and `attach --web` on
    it; as a second local user: `ddptop ls`/`attach` see nothing of it, the run directory, the live
    directory and both sockets (viewers', hub's) are permission denied, no process's argv holds a
    secret, and the web page and websocket are 403 without the secret. Then its owner stops it
    from a viewer, and supervisor.log in the run directory says who."""
    from ddptop.remote.live import ensure_live_dir, find_run, live_runs

    shared = Path(tempfile.mkdtemp(prefix="ddptop-shared-", dir="/tmp"))
    entry = None
    server = None
    try:
        shared.chmod(0o755)  # a place others can traverse, as a shared /scratch
        live = ensure_live_dir(shared / "live")  # ddptop's own, as `ddptop --detach` makes it
        assert live.stat().st_mode & 0o777 == 0o700
        runs = shared / "runs"
        env = {**os.environ, LIVE_ENV: str(live)}
        res = subprocess.run([sys.executable, "-m", "ddptop", "--nproc", "2", "--detach", "--steps", "100000",
                              "--warmup", "2", "--set", "workers=0", "--set", "batch_size=8",
                              "--runs-dir", str(runs)], capture_output=True, text=True, env=env, timeout=90)
        assert res.returncode == 0, res.stderr
        run_id = res.stdout.split()[2]
        entry = find_run(run_id, live)
        run_dir = Path(entry.run_dir)
        wait_until(lambda: any(e.run_id == run_id and e.step >= 1 for e in live_runs(live)), 120,
                   "both ranks stepping")
        hub_socket = ""
        for proc in psutil.Process(entry.pid).children(recursive=True):  # torchrun and the ranks have it
            with contextlib.suppress(psutil.Error):
                hub_socket = proc.environ().get(protocol.ENV_ADDR, "").removeprefix("unix:") or hub_socket
        assert Path(hub_socket).is_socket() and Path(entry.socket).is_socket()  # both there, for root
        assert (run_dir / "config.json").is_file() and (live / f"{run_id}.json").is_file()

        # `ddptop ls` and `ddptop attach` as the other user: with its own live directory, no
        # such run; pointed at the owner's, refused (not its own directory), one line each.
        mine = other_user.ddptop("ls")
        assert mine.returncode == 0 and "no live ddptop runs" in mine.stdout and run_id not in mine.stdout, mine
        theirs = {LIVE_ENV: str(live)}
        for args in (("ls",), ("ls", "--json"), ("attach", run_id)):
            res = other_user.ddptop(*args, env=theirs)
            assert res.returncode == 2 and run_id not in res.stdout + res.stderr, res
            assert f"must be a directory owned by uid {other_user.uid}" in res.stderr, res.stderr
        res = other_user.ddptop("attach", run_id)
        assert res.returncode == 2 and "no live ddptop run on this machine" in res.stderr, res.stderr

        # The records and the live directory: permission denied (the command ran: the runs
        # directory itself is listed, so the refusals are the run's own modes).
        assert run_id in other_user.run("ls", str(runs)).stdout
        for argv in (("ls", str(run_dir)), ("cat", str(run_dir / "config.json")),
                     ("cat", str(run_dir / "steps.jsonl")), ("ls", str(live)),
                     ("cat", str(live / f"{run_id}.json"))):
            res = other_user.run(*argv)
            assert res.returncode != 0 and "Permission denied" in res.stderr, (argv, res)

        # Both sockets: EACCES (not ENOENT, not a connection).
        res = other_user.py(SOCKET_PROBE, entry.socket, hub_socket)
        assert res.stdout.split() == [entry.socket, "EACCES", hub_socket, "EACCES"], res

        # The web view: without the secret, 403 for the page, an asset and the websocket.
        port = free_port()
        server = subprocess.Popen([sys.executable, "-m", "ddptop", "attach", "--web", "--port", str(port), run_id],
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        url = wait_until(lambda: next((w for w in [server.stdout.readline().decode()] if "?token=" in w), None),
                         30, "the token URL")
        secret = url.split("?token=", 1)[1].split()[0]
        wait_until(lambda: other_user.py("import socket, sys; socket.create_connection(('127.0.0.1', int(sys.argv[1])))",
                                         str(port)).returncode == 0, 30, "the web server to listen")
        res = other_user.py(WEB_PROBE, str(port), secret)
        got = json.loads(res.stdout or "{}")
        assert got == {"page": 403, "asset": 403, "bad_token": 403, "ws": 403, "ws_bad_token": 403,
                       "ws_foreign_origin": 403, "page_with_secret": 200}, res

        # What `ps` shows the other user: the run's processes, but none of its secrets.
        shown = other_user.py(CMDLINES).stdout
        assert "ddptop.remote.supervisor" in shown and "attach --web" in shown
        for name, value in (("viewer token", entry.token), ("web secret", secret)):
            assert value not in shown, name
        assert live_runs(live)[0].status == "running"  # none of it touched the run

        # The owner stops it from a viewer: the run's own log says who (kind, uid, pid).
        from ddptop.remote.viewer import RemoteSession

        async def stop_from_a_viewer():
            session = RemoteSession.attach(find_run(run_id, live), live)
            runner = asyncio.create_task(session.run())
            while session.state.status != "running":
                await asyncio.sleep(0.1)
            session.request_stop("stopped by user, from a terminal viewer")
            return await asyncio.wait_for(runner, 60)

        assert asyncio.run(stop_from_a_viewer()).status == "stopped"
        said = (run_dir / "supervisor.log").read_text()
        assert (f"stop asked by a terminal viewer, uid {os.getuid()}, pid {os.getpid()}: stopped by user, "
                "from a terminal viewer") in said, said[-2000:]
    finally:
        if server is not None:
            server.send_signal(signal.SIGINT)
            try:
                server.wait(timeout=15)
            except subprocess.TimeoutExpired:
                server.kill()
        if entry is not None:
            stop_tree(entry.pid)
        shutil.rmtree(shared, ignore_errors=True)


def test_a_live_dir_someone_else_owns_or_can_enter_is_refused(tmp_path: Path, monkeypatch) -> None:
    from ddptop.remote import live as live_module
    from ddptop.remote.live import LiveDirError, ensure_live_dir

    made = ensure_live_dir(tmp_path / "live")
    assert made.stat().st_mode & 0o777 == 0o700 and ensure_live_dir(made) == made  # ours: fine, twice
    mine = os.getuid()
    monkeypatch.setattr(live_module.os, "getuid", lambda: mine + 4242)  # as another user sees it
    with pytest.raises(LiveDirError, match=f"owned by uid {mine + 4242} .*uid {mine}\\)"):
        ensure_live_dir(made)
    monkeypatch.undo()
    made.chmod(0o750)
    with pytest.raises(LiveDirError, match="found mode 750"):
        ensure_live_dir(made)
    link = tmp_path / "planted"
    made.chmod(0o700)
    link.symlink_to(made)  # a planted link to a private directory is not followed
    with pytest.raises(LiveDirError, match="must be a directory"):
        ensure_live_dir(link)
    (tmp_path / "file").write_text("")
    with pytest.raises(LiveDirError, match="cannot use live directory"):
        ensure_live_dir(tmp_path / "file")


def test_a_live_dir_of_another_real_user_is_refused(other_user: OtherUser) -> None:
    from ddptop.remote.live import LiveDirError, ensure_live_dir

    theirs = other_user.home / "live-theirs"
    theirs.mkdir(mode=0o700)
    os.chown(theirs, other_user.uid, other_user.gid)
    with pytest.raises(LiveDirError, match=f"owned by uid {os.getuid()} .*uid {other_user.uid}\\)"):
        ensure_live_dir(theirs)
    res = other_user.ddptop("ls", env={LIVE_ENV: str(theirs)})  # its owner: fine
    assert res.returncode == 0 and "no live ddptop runs" in res.stdout, res


# --- who stopped the run ---------------------------------------------------------------------


def audited_supervisor(tmp_path: Path):
    """A Supervisor around a stand-in session that records the stops it is asked for."""
    from types import SimpleNamespace

    from ddptop.model.config import RunConfig
    from ddptop.remote.supervisor import Supervisor
    from ddptop.tui.synthetic import synthetic_state

    state = synthetic_state(2)
    stops: list[str] = []
    session = SimpleNamespace(state=state, done=False, run_id=state.run_id, config=RunConfig(nproc=2),
                              run_dir=tmp_path / state.run_id, request_stop=stops.append)
    live = tmp_path / "live"
    live.mkdir(mode=0o700)
    return Supervisor(session, live, detached=False), stops  # type: ignore[arg-type]


def ddptop_lines(sup) -> list[str]:
    return [line for line in sup.session.state.logs.get(-1, []) if " asked by " in line]


def test_a_stop_from_a_viewer_is_logged_with_its_kind_and_the_uid_the_kernel_gives(tmp_path: Path, capsys) -> None:
    from ddptop.viewer_wire import viewer_protocol as vp

    sup, stops = audited_supervisor(tmp_path)

    async def main() -> None:
        path = str(tmp_path / "v.sock")
        server = await asyncio.start_unix_server(sup._serve, path=path, limit=vp.MAX_LINE)
        try:
            reader, writer = await asyncio.open_unix_connection(path, limit=vp.MAX_LINE)

            async def next_kind() -> str:
                head = vp.decode(await reader.readline())
                await reader.readexactly(head.get("size") or 0)  # a state frame's payload
                return head["kind"]

            writer.write(vp.encode("hello", token=sup.token, owner=False))
            assert await next_kind() == "welcome"
            writer.write(vp.encode("stop", reason="settings changed, from a web viewer"))
            writer.write(vp.encode("detach"))
            while await next_kind() != "detached":
                pass
            writer.close()
        finally:
            server.close()

    asyncio.run(main())
    me = f"uid {os.getuid()}, pid {os.getpid()}"
    assert stops == ["settings changed, from a web viewer"]  # a restart: this run stops first
    assert ddptop_lines(sup) == [
        f"[ddptop] stop asked by a web viewer, {me}: settings changed, from a web viewer",
        f"[ddptop] detach asked by a viewer, {me}"]
    # the supervisor's output, which is supervisor.log in the run directory
    assert f"stop asked by a web viewer, {me}: settings changed" in capsys.readouterr().out


VIEWER_AS_OTHER = r"""
import socket, sys
s = socket.socket(socket.AF_UNIX)
s.connect(sys.argv[1])
s.sendall(bytes.fromhex(sys.argv[2]))
f = s.makefile("rb")
while b'"kind":"detached"' not in f.readline():  # (a state payload runs into the next line)
    pass
print("done")
"""


def test_the_uid_in_the_log_is_the_viewers_not_what_it_claims(tmp_path: Path, other_user: OtherUser) -> None:
    """A viewer of another uid (its socket opened to it for this test): the log names that uid,
    from SO_PEERCRED, and the pid of that very process."""
    from ddptop.viewer_wire import viewer_protocol as vp

    sup, stops = audited_supervisor(tmp_path)
    where = Path(tempfile.mkdtemp(prefix="ddptop-peer-", dir="/tmp"))
    try:
        where.chmod(0o711)
        path = str(where / "v.sock")
        lines = (vp.encode("hello", token=sup.token, owner=False, viewer="terminal")
                 + vp.encode("stop", reason="stopped by user, from a terminal viewer, uid 0")  # a claim
                 + vp.encode("capture", count=0, id=1) + vp.encode("detach"))

        async def main() -> tuple[int, bytes]:
            server = await asyncio.start_unix_server(sup._serve, path=path, limit=vp.MAX_LINE)
            os.chmod(path, 0o666)
            try:
                proc = await asyncio.create_subprocess_exec(
                    other_user.python, "-c", VIEWER_AS_OTHER, path, lines.hex(), user=other_user.uid,
                    group=other_user.gid, extra_groups=[], env={"PATH": "/usr/bin:/bin"},
                    stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT, cwd="/")
                out, _ = await asyncio.wait_for(proc.communicate(), 30)
                return proc.pid, out
            finally:
                server.close()

        pid, out = asyncio.run(main())
    finally:
        shutil.rmtree(where, ignore_errors=True)
    assert out.strip() == b"done", out
    them = f"a terminal viewer, uid {other_user.uid}, pid {pid}"
    assert ddptop_lines(sup) == [
        f"[ddptop] stop asked by {them}: stopped by user, from a terminal viewer, uid 0",
        f"[ddptop] capture of 0 step(s) asked by {them}",
        f"[ddptop] detach asked by {them}"]
    assert stops == ["stopped by user, from a terminal viewer, uid 0"]


def test_token_file_must_be_private_and_gives_the_token(tmp_path: Path):
    import pytest

    from ddptop import cli
    from ddptop.model.usage import UsageError

    path = tmp_path / "token"
    path.write_text("s3cret\n")
    args = cli.run_parser().parse_args(["--nnodes", "2", "--node-rank", "1", "--rdzv-endpoint", "h:5",
                                        "--token-file", str(path)])
    path.chmod(0o644)
    with pytest.raises(UsageError, match="can be read by other users"):
        cli.node_options(args, environ={})
    path.chmod(0o600)
    assert cli.node_options(args, environ={}).token == "s3cret"


HUB_UNDER_FLOOD = r"""
import asyncio, json, os, resource, sys, tempfile
from pathlib import Path
sys.path.insert(0, sys.argv[1])
from recording_sink import Sink
import ddptop.run.hub as hub_module
hub_module.HELLO_TIMEOUT_S = float(sys.argv[3])  # the hello deadline, shortened for the test

async def main():
    sink = Sink()
    d = Path(tempfile.mkdtemp(dir="/tmp"))
    hub = hub_module.Hub("s3cret-token", sink, world_size=2)
    path = await hub.start_unix(str(d / "hub.sock"))
    # "tight": a few descriptors above what is open now, so that accept() runs out (EMFILE)
    files = len(os.listdir("/proc/self/fd")) + 8 if sys.argv[2] == "tight" else int(sys.argv[2])
    resource.setrlimit(resource.RLIMIT_NOFILE, (files, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
    print(path.split(":", 1)[1], flush=True)
    while not (sink.steps(0) and sink.steps(1)):
        await asyncio.sleep(0.05)
    print(json.dumps({"steps": [sink.steps(0), sink.steps(1)], "refused": sink.refused,
                      "accept_errors": hub.accept_errors}), flush=True)
    await hub.close()

asyncio.run(main())
"""


class FloodedHub:
    """A hub in a process of its own, limited to `files` open files (or "tight": a few above
    what it has open), with a hello deadline of `hello_s`."""

    def __init__(self, files: int | str, hello_s: float) -> None:
        self.proc = subprocess.Popen([sys.executable, "-c", HUB_UNDER_FLOOD, str(Path(__file__).parents[1]),
                                      str(files), str(hello_s)],
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.path = self.proc.stdout.readline().strip()
        assert self.path, self.proc.communicate(timeout=30)

    def connect(self, frames: bytes = b"") -> socket.socket:
        sock = socket.socket(socket.AF_UNIX)
        sock.connect(self.path)  # blocks while the hub's backlog is full
        if frames:
            sock.sendall(frames)
        return sock

    def result(self) -> tuple[dict, str]:
        out, err = self.proc.communicate(timeout=60)
        assert out.strip(), err[-3000:]
        return json.loads(out.strip().splitlines()[-1]), err

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def wait_closed_by_peer(socks: list[socket.socket], timeout: float) -> float:
    """Seconds until the hub has closed every one of `socks` (each reads EOF)."""
    import selectors

    t0 = time.monotonic()
    open_ = set(socks)
    with selectors.DefaultSelector() as sel:
        for s in socks:
            sel.register(s, selectors.EVENT_READ)
        while open_:
            left = timeout - (time.monotonic() - t0)
            if left <= 0:
                raise AssertionError(f"{len(open_)} of {len(socks)} idle connections still open after {timeout:.0f}s")
            for key, _ in sel.select(min(left, 1.0)):
                if key.fileobj.recv(4096) == b"":
                    sel.unregister(key.fileobj)
                    open_.discard(key.fileobj)
    return time.monotonic() - t0


def reasons(refused: list[str]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for reason in refused:
        key = reason.split(" (", 1)[0].split(";", 1)[0]
        counts[key] = counts.get(key, 0) + 1
    return counts


def raised_file_limit(need: int) -> int:
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < need:
        pytest.skip(f"needs {need} open files for the flood (hard limit {hard})")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, need), hard))
    return soft


def idle_refusals(refused: list[str]) -> int:
    """Connections closed for want of a hello: at the deadline, or as the oldest idle one of a
    process that opened too many (ddptop.run.hub: a flood from one process evicts its own)."""
    return sum(n for why, n in reasons(refused).items()
               if why == "no hello" or why.startswith("too many connections without a hello"))


def test_two_thousand_idle_connections_leave_the_hub_quiet_and_open_to_ranks():
    """The hub limited to 1024 files, 2000 idle connections: a rank that comes meanwhile reports
    (the oldest idle ones make room), the rest are closed at the hello deadline, a rank that comes
    after reports too, and the hub says under 100 lines, no traceback."""
    import resource

    soft = raised_file_limit(2200)
    hub = FloodedHub(1024, hello_s=2.0)
    idle: list[socket.socket] = []
    try:
        t0 = time.monotonic()
        idle = [hub.connect() for _ in range(2000)]
        flood_s = time.monotonic() - t0
        rank0 = hub.connect(hello(0) + steps(0, 0))  # while the idle ones are still there
        closed_s = wait_closed_by_peer(idle, 30)  # the hello deadline: the hub closes them all
        rank1 = hub.connect(hello(1) + steps(1, 0))  # once they are gone
        got, err = hub.result()
        rank0.close()
        rank1.close()
    finally:
        for s in idle:
            s.close()
        hub.kill()
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
    print(f"\n2000 idle connections in {flood_s:.1f}s; all closed by the hub {closed_s:.1f}s later; "
          f"refusals {reasons(got['refused'])}; {len(err.splitlines())} line(s) on stderr")
    assert got["steps"] == [[0], [0]]
    # each idle connection refused once: the oldest closed as newer ones came (all from one
    # process: its own oldest, issue 49), the last ones at their hello deadline
    assert idle_refusals(got["refused"]) == 2000, reasons(got["refused"])
    assert "Traceback" not in err and len(err.splitlines()) < 100, err[-3000:]


def test_out_of_files_at_accept_is_said_once_with_a_count_and_ranks_connect_after_the_deadline():
    """accept() failing with EMFILE (the hub a few files from its limit, 30 idle connections):
    asyncio retries every second; the hub says so once, counts every failure, prints no traceback,
    closes the idle ones at the hello deadline, and then ranks connect as usual."""
    hub = FloodedHub("tight", hello_s=1.0)
    idle: list[socket.socket] = []
    try:
        idle = [hub.connect() for _ in range(30)]  # more than the hub has files for: the rest wait
        closed_s = wait_closed_by_peer(idle, 60)
        rank0 = hub.connect(hello(0) + steps(0, 0))
        rank1 = hub.connect(hello(1) + steps(1, 0))
        got, err = hub.result()
        rank0.close()
        rank1.close()
    finally:
        for s in idle:
            s.close()
        hub.kill()
    counts = reasons(got["refused"])
    print(f"\naccept() failed {got['accept_errors']} time(s); the 30 idle connections closed in {closed_s:.1f}s; "
          f"refusals {counts}; {len(err.splitlines())} line(s) on stderr")
    assert got["steps"] == [[0], [0]]
    said = [r for r in got["refused"] if r.startswith("cannot accept connections")]
    assert len(said) == 1 and "Too many open files" in said[0] and said[0].endswith("; 1 time(s)"), said
    assert got["accept_errors"] >= 2  # retried (and failed) again, without a word each time...
    again = [r for r in got["refused"] if r.startswith("accepting connections again")]
    assert again and f"({got['accept_errors']} accept(s) failed so far" in again[-1], again  # ...counted
    assert idle_refusals(got["refused"]) == 30  # every idle one was let in, then closed (its process's oldest, or at its deadline)
    assert "Traceback" not in err and len(err.splitlines()) < 100, err[-3000:]
