"""Nothing a rank says is trusted beyond its rank (issue 16): with the token, a client still
cannot claim a rank outside the run, take over a connected rank, crash the decoder, get a
foreign process signalled, or crowd out the ranks with idle connections."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import psutil
from test_hostile import TOKEN, good_rank, hung_up, send, steps, until, with_hub

from ddptop.model.config import RunConfig
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
    assert sink.dropped == ["bad-number"]
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

        session.launcher = Launcher()
        deadline = 50
        while not psutil.Process(torchrun.pid).children() and deadline:
            deadline -= 1
            asyncio.run(asyncio.sleep(0.1))
        rank_pid = psutil.Process(torchrun.pid).children()[0].pid
        admitted = []
        for rank, pid in enumerate([rank_pid, stranger.pid, 0, os.getpid()]):
            msg = protocol.Hello(rank=rank, local_rank=rank, world_size=4, host="h", pid=pid, token="")
            admitted.append(session.hub_admit(msg) is None)  # the hub refuses a hello it does not admit
            session.state.apply(msg, 1.0)
        assert admitted == [True, False, False, False]
        assert session._rank_pids() == {0: rank_pid}  # and never signals a claimed pid
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


def other_uid() -> int | None:
    """A second local account to play the other user on a shared server (made when the tests run
    as root, as in CI); None where that is not possible."""
    import pwd
    import shutil

    if os.geteuid() != 0:
        return None
    try:
        return pwd.getpwnam("ddptop-other").pw_uid
    except KeyError:
        pass
    if not shutil.which("useradd"):
        return None
    subprocess.run(["useradd", "--no-create-home", "--shell", "/usr/sbin/nologin", "ddptop-other"],
                   capture_output=True)
    try:
        return pwd.getpwnam("ddptop-other").pw_uid
    except KeyError:
        return None


def test_another_local_user_cannot_read_runs_or_reach_live_runs(tmp_path: Path, private_live_dir: Path):
    import shutil
    import tempfile

    import pytest

    from ddptop.run.recorder import new_run_dir

    uid = other_uid()
    if uid is None:
        pytest.skip("needs root (to act as a second local user), as CI runs")
    shared = Path(tempfile.mkdtemp(prefix="ddptop-shared-", dir="/tmp"))
    try:
        shared.chmod(0o755)  # a runs directory others can traverse, as on a shared /scratch
        run_dir = new_run_dir(shared, "r1")
        (run_dir / "config.json").write_text('{"secret_cmd": "train.py --api-key x"}')
        (private_live_dir / "r1.sock").write_text("")

        def as_other(*argv: str) -> subprocess.CompletedProcess:
            env = {"PATH": os.environ["PATH"], "DDPTOP_LIVE_DIR": str(private_live_dir), "HOME": "/tmp"}
            return subprocess.run(list(argv), capture_output=True, text=True, user=uid, env=env, timeout=60,
                                  cwd="/tmp")

        assert as_other("cat", str(run_dir / "config.json")).returncode != 0
        assert as_other("ls", str(run_dir)).returncode != 0
        assert as_other("ls", str(private_live_dir)).returncode != 0
        if as_other("test", "-x", os.path.realpath(sys.executable)).returncode == 0:  # not under /root
            res = as_other(sys.executable, "-m", "ddptop", "ls")
            assert res.returncode != 0 and "r1" not in res.stdout, res.stdout + res.stderr
    finally:
        shutil.rmtree(shared, ignore_errors=True)


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
import asyncio, resource, sys, tempfile
from pathlib import Path
sys.path.insert(0, sys.argv[1])
from recording_sink import Sink
from ddptop.run.hub import Hub
resource.setrlimit(resource.RLIMIT_NOFILE, (1024, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))

async def main():
    sink = Sink()
    d = Path(tempfile.mkdtemp(dir="/tmp"))
    hub = Hub("s3cret-token", sink, world_size=2)
    path = await hub.start_unix(str(d / "hub.sock"))
    print(path.split(":", 1)[1], flush=True)
    loop = asyncio.get_running_loop()
    while not sink.steps(0):
        await asyncio.sleep(0.05)
    print("steps", sink.steps(0), "refused", len(sink.refused), flush=True)
    await hub.close()

asyncio.run(main())
"""


def test_two_thousand_idle_connections_leave_the_hub_quiet_and_open_to_ranks(tmp_path: Path):
    import resource
    import socket

    import pytest

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 2100:
        pytest.skip(f"needs 2100 open files for the flood (hard limit {hard})")
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(4096, hard) if hard != resource.RLIM_INFINITY else 4096, hard))
    hub = subprocess.Popen([sys.executable, "-c", HUB_UNDER_FLOOD, str(Path(__file__).parent)],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    idle = []
    try:
        path = hub.stdout.readline().strip()
        for _ in range(2000):
            s = socket.socket(socket.AF_UNIX)
            try:
                s.connect(path)
            except OSError:
                s.close()
                continue
            idle.append(s)
        rank = socket.socket(socket.AF_UNIX)
        rank.connect(path)
        rank.sendall(hello(0) + steps(0, 0))
        out, err = hub.communicate(timeout=60)
        rank.close()
    finally:
        for s in idle:
            s.close()
        if hub.poll() is None:
            hub.kill()
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    assert "steps [0]" in out, out + err[-2000:]
    assert len(err.splitlines()) < 100, err[-3000:]
