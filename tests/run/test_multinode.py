"""Multi-node through torchrun's c10d rendezvous: the torchrun argv, the join command,
usage errors, the views' node grouping, and two "nodes" on this machine for real."""

from __future__ import annotations

import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from waiting import hold, poll
from waiting import wait_until as wait_for

from ddptop import cli
from ddptop.analysis.advisor import advise
from ddptop.model.config import RunConfig, preset_config
from ddptop.model.nodes import node_figures
from ddptop.model.options import NodeOptions
from ddptop.model.state import RunState
from ddptop.run.launcher import build_plan
from ddptop.run.multinode import join_command, run_args
from ddptop.tui.widgets.node_rows import group_header
from ddptop.tui.widgets.wiring_panel import NETWORK, wiring_pairs
from ddptop.wire import protocol

TOKEN = "0123456789abcdef0123456789abcdef"


def node(rank: int, token: str = TOKEN, nnodes: int = 2) -> NodeOptions:
    return NodeOptions(nnodes=nnodes, node_rank=rank, rdzv_host="10.0.0.1", rdzv_port=29500,
                       hub_port=29501, token=token)


# ---------------------------------------------------------------------------- the plan


def test_multi_node_plan_uses_c10d_rendezvous_with_node0_hosting_the_store(tmp_path):
    config = RunConfig(nproc=4)
    plans = [build_plan(config, tmp_path, node(r).hub_addr, TOKEN, "run", node=node(r), base_env={})
             for r in (0, 1)]
    for r, plan in enumerate(plans):
        argv = plan.argv
        assert "--standalone" not in argv
        assert "--nnodes=2" in argv and "--nproc-per-node=4" in argv  # per node
        assert "--rdzv-backend=c10d" in argv and "--rdzv-endpoint=10.0.0.1:29500" in argv
        assert f"--rdzv-conf=is_host={1 - r}" in argv
        assert not any(a.startswith("--node-rank") for a in argv)  # c10d ignores it, with a warning
        assert plan.env[protocol.ENV_ADDR] == "tcp:10.0.0.1:29501"
        assert plan.env[protocol.ENV_TOKEN] == TOKEN and plan.env[protocol.ENV_NODE] == str(r)
        assert not any(TOKEN in a for a in argv)  # argv is visible in ps; the token is not
    ids = [next(a for a in p.argv if a.startswith("--rdzv-id=")) for p in plans]
    assert ids[0] == ids[1]  # the same rendezvous on both nodes, from the shared token
    other = build_plan(config, tmp_path, "tcp:x:1", "other", "run", node=node(0, token="other"), base_env={})
    assert next(a for a in other.argv if a.startswith("--rdzv-id=")) != ids[0]


def test_single_node_plan_is_unchanged(tmp_path):
    plan = build_plan(RunConfig(nproc=2), tmp_path, "unix:/x/hub.sock", "t", "run", base_env={})
    assert plan.argv[3:5] == ["--standalone", "--nproc-per-node=2"]
    assert not any(a.startswith(("--rdzv", "--nnodes")) for a in plan.argv)
    assert plan.env[protocol.ENV_NODE] == "0"


def test_ipv6_endpoint_is_bracketed_for_torchrun():
    n = NodeOptions(nnodes=2, rdzv_host="fd00::1", rdzv_port=29500, hub_port=29501, token="t")
    assert n.endpoint == "[fd00::1]:29500" and n.hub_addr == "tcp:fd00::1:29501"
    assert protocol.parse_addr(n.hub_addr) == ("tcp", ("fd00::1", 29501))


# ---------------------------------------------------------------------------- join command


def test_join_command_rebuilds_the_same_run_on_the_other_node():
    base = RunConfig(nproc=2, steps=50, warmup=3, batch_size=8, model="tiny_vit")
    config = preset_config("bf16", base).with_changes(bucket_cap_mb=50.0, workers=0, comm_timing=False,
                                                      nccl_env={"NCCL_SOCKET_IFNAME": "eth0"})
    cmd = join_command(config, node(0), ["python", "my train.py", "--lr", "0.1"], node_rank="1")
    argv = shlex.split(cmd)
    assert argv[0] == f"{protocol.ENV_TOKEN}={TOKEN}"  # in the environment, never in argv (ps)
    argv = argv[1:]
    assert argv[0] == "ddptop" and "--token" not in argv and TOKEN not in " ".join(argv)
    cut = argv.index("--")
    assert argv[cut + 1:] == ["python", "my train.py", "--lr", "0.1"]
    args = cli.run_parser().parse_args(argv[1:cut])
    assert cli.build_config(args) == config
    joined = cli.node_options(args, environ={protocol.ENV_TOKEN: TOKEN})
    assert joined == NodeOptions(nnodes=2, node_rank=1, rdzv_host="10.0.0.1", rdzv_port=29500,
                                 hub_port=29501, token=TOKEN)
    assert "--hub-port" not in argv  # the default (rendezvous port + 1) needs no flag


def test_join_command_carries_a_custom_hub_port_and_settings_screen_configs():
    n = NodeOptions(nnodes=3, node_rank=0, rdzv_host="h", rdzv_port=29500, hub_port=40000, token=TOKEN)
    config = RunConfig(nproc=1, preset="custom", static_graph=True)
    argv = shlex.split(join_command(config, n, node_rank="2"))
    args = cli.run_parser().parse_args(argv[2:])
    assert cli.build_config(args).with_changes(preset="custom") == config
    assert cli.node_options(args, environ={protocol.ENV_TOKEN: TOKEN}).hub_port == 40000
    assert run_args(RunConfig(nproc=2)) == ["--nproc", "2", "--preset", "baseline", "--set", "bucket_cap_mb=25.0"]


def test_token_comes_from_the_environment_and_node0_makes_one():
    args = cli.run_parser().parse_args(["--nnodes", "2", "--node-rank", "1", "--rdzv-endpoint", "h:5"])
    assert cli.node_options(args, environ={protocol.ENV_TOKEN: "s3cret"}).token == "s3cret"
    args0 = cli.run_parser().parse_args(["--nnodes", "2", "--rdzv-endpoint", "h:5"])
    made = {cli.node_options(args0, environ={}).token for _ in range(2)}
    assert len(made) == 2 and all(len(t) == 32 for t in made)


# ---------------------------------------------------------------------------- usage errors


@pytest.mark.parametrize(
    "args, fragment",
    [
        (["--nnodes", "0"], "--nnodes must be at least 1"),
        (["--nnodes", "2", "--node-rank", "2", "--rdzv-endpoint", "h:5"], "--node-rank must be in 0..1"),
        (["--nnodes", "2", "--node-rank", "-1", "--rdzv-endpoint", "h:5"], "--node-rank must be in 0..1"),
        (["--nnodes", "2"], "needs --rdzv-endpoint"),
        (["--nnodes", "2", "--rdzv-endpoint", "nohost"], "expected HOST:PORT"),
        (["--nnodes", "2", "--rdzv-endpoint", "h:70000"], "expected HOST:PORT"),
        (["--nnodes", "2", "--node-rank", "1", "--rdzv-endpoint", "h:5"], "needs the run's --token"),
        (["--nnodes", "2", "--rdzv-endpoint", "h:5", "--hub-port", "5"], "not the rendezvous port"),
        (["--token", "abc"], "--token is for multi-node runs"),
        (["--nnodes", "2", "--rdzv-endpoint", "h:5", "--preset", "single"], "cannot span nodes"),
        (["--nnodes", "2", "--rdzv-endpoint", "h:5", "--token", "a b"], "without spaces"),
    ],
)
def test_bad_multi_node_usage_exits_2_with_one_line(tmp_path, args, fragment):
    runs = tmp_path / "runs"
    env = {k: v for k, v in os.environ.items() if k != protocol.ENV_TOKEN}
    res = subprocess.run([sys.executable, "-m", "ddptop", "--headless", "--runs-dir", str(runs), *args],
                         capture_output=True, text=True, timeout=30, env=env)
    lines = res.stderr.strip().splitlines()
    assert res.returncode == 2, res.stderr
    assert len(lines) == 1 and lines[0].startswith("ddptop: error:") and fragment in lines[0], res.stderr
    assert res.stdout == "" and (not runs.exists() or not any(runs.iterdir()))


def test_taken_hub_port_on_node0_is_a_usage_error(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        hub_port = taken.getsockname()[1]
        res = subprocess.run(
            [sys.executable, "-m", "ddptop", "--headless", "--runs-dir", str(tmp_path / "runs"), "--nnodes", "2",
             "--rdzv-endpoint", f"127.0.0.1:{free_port_pair()}", "--hub-port", str(hub_port)],
            capture_output=True, text=True, timeout=30)
    assert res.returncode == 2 and f"hub port {hub_port} is already in use" in res.stderr, res.stderr


# ---------------------------------------------------------------------------- views


def two_node_state(nccl_log: list[str] | None = None) -> RunState:
    state = RunState(run_id="r", config=RunConfig(nproc=2).to_dict(), world_size=4, nnodes=2)
    # c10d numbered the nodes its own way: node 1 got ranks 0-1 (as on this machine's runs)
    for rank, n, host in ((0, 1, "b"), (1, 1, "b"), (2, 0, "a"), (3, 0, "a")):
        state.apply(protocol.Hello(rank=rank, local_rank=rank % 2, world_size=4, host=host, pid=100 + rank,
                                   token="", device=f"cuda:{rank % 2}", backend="nccl", node=n), 1.0)
    if nccl_log:
        from ddptop.analysis.nccl import parse_lines

        state.nccl = parse_lines(nccl_log)
    return state


def test_rank_table_groups_ranks_by_node_with_a_header_each():
    state = two_node_state()
    status = {r: rs.status for r, rs in state.ranks.items()}
    nodes = node_figures(state, state.rank_figures(), status, None)
    assert [(group_header(nf).plain, nf.ranks) for nf in nodes] == [
        ("node 0 · a · 2 ranks", (2, 3)), ("node 1 · b · 2 ranks", (0, 1))]
    single = RunState(run_id="r", config=RunConfig(), world_size=2)
    assert node_figures(single, {}, {}, None) == ()  # one node: the table is as it always was


def test_tui_rank_table_with_64_ranks_on_8_nodes_groups_them_within_budget(tmp_path):
    """The real app (pilot): a header per node above its ranks, the header line says the
    world spans nodes, and a refresh stays under the UI budget (50 ms, CPU time)."""
    import asyncio

    from ddptop.tui.app import DdpTopApp
    from ddptop.tui.synthetic import synthetic_state, synthetic_workbench
    from ddptop.tui.widgets.rank_table import RankTable
    from ddptop.tui.widgets.run_header import RunHeader

    state = synthetic_state(64, nodes=8)
    app = DdpTopApp(synthetic_workbench(state, tmp_path), autostart=False, refresh_s=3600)

    async def main() -> float:
        async with app.run_test(size=(120, 40)) as pilot:
            app.refresh_views()
            await pilot.pause()
            rows = app.query_one(RankTable).row_texts()
            assert len(rows) == 64 + 8
            assert rows[0].startswith("node 0 · node0 · 8 ranks") and rows[9].startswith("node 1 · node1")
            assert rows[1].split()[0].lstrip("▲") == "0" and rows[10].split()[0].lstrip("▲") == "8"
            assert "world 64 on 8 nodes" in " ".join(str(app.query_one(RunHeader).render()).split())
            costs = []
            for step in range(5):
                for r in state.ranks:  # every row changes, as in bench/bench_ui.py
                    state.apply(protocol.Steps(rank=r, records=[{"step": 1000 + step, "step_ms": 90.0 + r % 7,
                                                                  "forward_ms": 30.0, "samples": 32.0}]),
                                time.time())
                c0 = time.process_time()
                app.refresh_views()
                costs.append(time.process_time() - c0)
                await pilot.pause()
            return sorted(costs)[len(costs) // 2] * 1000

    median_ms = asyncio.run(main())
    print(f"refresh with 64 ranks on 8 nodes: {median_ms:.1f} ms CPU")
    assert median_ms < 50


def test_wiring_marks_cross_node_pairs_as_network_and_does_not_flag_net_there(tmp_path):
    log = [
        "a:1:1 [0] NCCL INFO Channel 00/0 : 3[1] -> 0[0] [send] via NET/IB/0/GDRDMA",
        "a:1:1 [0] NCCL INFO Channel 00/0 : 2[0] -> 3[1] via P2P/CUMEM/read",
        "a:1:1 [0] NCCL INFO Channel 00/0 : 1[1] -> 2[0] [receive] via NET/Socket/0",
    ]
    state = two_node_state(log)
    _, pairs, _ = wiring_pairs(state)
    assert pairs[(3, 0)].transport == "NET/IB" and pairs[(3, 0)].hw == NETWORK
    assert pairs[(1, 2)].transport == "NET/Socket" and pairs[(1, 2)].hw == NETWORK
    assert pairs[(3, 0)].verdict == "" and pairs[(1, 2)].verdict == ""
    assert pairs[(0, 1)].hw is None  # node 1's own link: node 0's NVML cannot say


def test_advisor_does_not_blame_nvlink_for_network_between_nodes():
    summary = {"config": RunConfig(nproc=2).to_dict(), "world_size": 4, "backend": "nccl", "nnodes": 2,
               "ranks": [{"comm_share": 0.5, "exposed_comm_share": 0.4}]}
    across = advise(summary, {"net", "nvlink"}, {"nvlink"})
    assert "NVLink but" not in across.reason
    one_node = advise({**summary, "nnodes": 1}, {"net", "nvlink"}, {"nvlink"})
    assert "NVLink but" in one_node.reason  # on one node the same picture is a misconfiguration


# ---------------------------------------------------------------------------- real runs


def free_port_pair() -> int:
    """A port P with P+1 free too (rendezvous and hub)."""
    for _ in range(50):
        with socket.socket() as a:
            a.bind(("127.0.0.1", 0))
            port = a.getsockname()[1]
            if port >= 65535:
                continue
            with socket.socket() as b:
                try:
                    b.bind(("127.0.0.1", port + 1))
                except OSError:
                    continue
            return port
    raise AssertionError("no free port pair")


def start_node(args: list[str], runs_dir: Path, env: dict[str, str] | None = None) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "ddptop", "--headless", "--runs-dir", str(runs_dir), "--interval", "1", *args]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)


def read_until(proc: subprocess.Popen, predicate, timeout: float = 60) -> list[str]:
    seen = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        seen.append(line)
        if predicate(line):
            return seen
    raise AssertionError("never saw the line; output:\n" + "".join(seen))


def refused_by_hub(port: int, timeout: float = 20) -> bytes:
    """Say hello to the hub with a wrong token; return what came back (b'' = closed on us)."""
    def connect() -> socket.socket | None:
        try:
            return socket.create_connection(("127.0.0.1", port), timeout=5)
        except OSError:
            return None

    sock = wait_for(connect, timeout, "the hub to listen", every=0.2)
    with sock:
        hello = protocol.Hello(rank=0, local_rank=0, world_size=4, host="intruder", pid=1, token="wrong")
        sock.sendall(protocol.encode(hello))
        sock.settimeout(10)
        return sock.recv(1024)


def tree(proc: subprocess.Popen) -> list[psutil.Process]:
    try:
        return [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def alive(procs: list[psutil.Process]) -> list[psutil.Process]:
    return [p for p in procs if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]


RUN = ["--nproc", "2", "--set", "workers=0", "--set", "batch_size=8"]


def start_two_nodes(tmp_path: Path) -> tuple[subprocess.Popen, subprocess.Popen]:
    """Node 0 (headless, --json) and node 1 of a long two-node run on this machine."""
    port = free_port_pair()
    common = ["--nnodes", "2", "--rdzv-endpoint", f"127.0.0.1:{port}", "--steps", "100000", *RUN]
    env = {**os.environ, protocol.ENV_TOKEN: TOKEN}
    return (start_node(["--node-rank", "0", "--json", *common], tmp_path / "n0", env),
            start_node(["--node-rank", "1", *common], tmp_path / "n1", env))


def assert_gone(procs: list[psutil.Process], timeout: float = 10) -> None:
    poll(lambda: not alive(procs), timeout, every=0.2)
    assert alive(procs) == [], [p.cmdline() for p in alive(procs)]


@pytest.mark.e2e
@pytest.mark.slow  # the suite stays under 10 min on 2 cores: `pytest -m slow` runs it (covered: test_forged_hellos' two real nodes)
def test_two_nodes_on_one_machine_report_four_ranks_to_node0(tmp_path):
    port = free_port_pair()
    t0 = time.monotonic()
    node0 = start_node(["--nnodes", "2", "--node-rank", "0", "--rdzv-endpoint", f"127.0.0.1:{port}",
                        "--steps", "12", "--json", *RUN], tmp_path / "n0")
    node1 = None
    try:
        head = read_until(node0, lambda line: line.startswith(f"    {protocol.ENV_TOKEN}="))
        join = shlex.split(head[-1])  # exactly what node 0 told the user to run
        token_env, join = join[0], join[1:]
        assert token_env.startswith(protocol.ENV_TOKEN + "=")
        assert join[:7] == ["ddptop", "--nnodes", "2", "--node-rank", "1", "--rdzv-endpoint",
                            f"127.0.0.1:{port}"] and "--token" not in join
        # node 0's hub is live (its torchrun waits for node 1): a wrong token is refused
        assert refused_by_hub(port + 1) == b""
        env = {**os.environ, protocol.ENV_TOKEN: token_env.split("=", 1)[1]}
        node1 = start_node(join[1:], tmp_path / "n1", env)
        secret = token_env.split("=", 1)[1]
        hold(3, "both nodes' trees come up: then no process may show the token in its argv (ps)")
        shown = [p.info["cmdline"] for p in psutil.process_iter(["cmdline"]) if secret in " ".join(p.info["cmdline"] or [])]
        assert shown == []
        out1, _ = node1.communicate(timeout=240)
        out0, _ = node0.communicate(timeout=60)
    finally:
        for p in (node0, node1):
            if p is not None and p.poll() is None:
                p.kill()
    print(f"two-node run: {time.monotonic() - t0:.1f} s")
    assert node0.returncode == 0, "".join(head) + out0[-3000:]
    assert node1.returncode == 0, out1[-3000:]
    summary = json.loads(out0.strip().splitlines()[-1])
    assert summary["status"] == "completed" and summary["world_size"] == 4 and summary["nnodes"] == 2
    assert [r["rank"] for r in summary["ranks"]] == [0, 1, 2, 3]
    assert [r["steps"] for r in summary["ranks"]] == [12] * 4
    assert sorted(r["node"] for r in summary["ranks"]) == [0, 0, 1, 1]
    assert summary["refused_connections"] >= 1
    assert "the live view is on node 0" in out1 and "torchrun exited with code 0" in out1
    # each node keeps its own records: node 1's rank logs are on node 1
    (run0,) = (tmp_path / "n0").iterdir()
    (run1,) = (tmp_path / "n1").iterdir()
    assert len((run0 / "steps.jsonl").read_text().splitlines()) == 48
    assert len(list(run1.glob("logs/*/attempt_0/*/stdout.log"))) == 2
    launch = json.loads((run1 / "config.json").read_text())["_launch"]
    assert launch["node_rank"] == 1 and launch["rdzv_id"] == json.loads(
        (run0 / "config.json").read_text())["_launch"]["rdzv_id"]


@pytest.mark.e2e
@pytest.mark.slow
def test_sigint_on_node0_stops_every_rank_on_both_nodes(tmp_path):
    node0, node1 = start_two_nodes(tmp_path)
    procs: list[psutil.Process] = []
    try:
        read_until(node0, lambda line: " running " in line and "step" in line, timeout=120)
        procs = tree(node0) + tree(node1)
        assert len(procs) >= 6  # 2 ddptops, 2 torchruns, 4 ranks
        t0 = time.monotonic()
        node0.send_signal(signal.SIGINT)
        out0, _ = node0.communicate(timeout=60)
        out1, _ = node1.communicate(timeout=60)
        stop_s = time.monotonic() - t0
    finally:
        for p in (node0, node1):
            if p.poll() is None:
                p.kill()
    print(f"stop across two nodes: {stop_s:.1f} s")
    assert node0.returncode == 130, out0[-3000:]
    assert node1.returncode == 0, out1[-3000:]  # its ranks left at the agreed step: torchrun exits 0
    summary = json.loads(out0.strip().splitlines()[-1])
    assert summary["status"] == "stopped" and summary["world_size"] == 4
    assert [r["status"] for r in summary["ranks"]] == ["stopped"] * 4
    assert len({r["last_step"] for r in summary["ranks"]}) == 1  # one agreed step on every node
    assert_gone(procs)


@pytest.mark.e2e
@pytest.mark.slow
def test_sigterm_on_another_node_stops_its_local_tree(tmp_path):
    node0, node1 = start_two_nodes(tmp_path)
    procs: list[psutil.Process] = []
    try:
        read_until(node0, lambda line: " running " in line and "step" in line, timeout=120)
        procs = tree(node0) + tree(node1)
        node1.send_signal(signal.SIGTERM)
        out1, _ = node1.communicate(timeout=60)
        out0, _ = node0.communicate(timeout=120)
    finally:
        for p in (node0, node1):
            if p.poll() is None:
                p.kill()
    assert node1.returncode == 130 and "stopped by a signal" in out1, out1[-3000:]
    assert node0.returncode == 1, out0[-3000:]  # node 0 lost half its world: a failed run
    assert json.loads(out0.strip().splitlines()[-1])["status"] == "failed"
    assert_gone(procs)


# ---------------------------------------------------------------------------- where the hub listens


def this_machines_address() -> str:
    from ddptop.run.multinode import default_route_address

    address = default_route_address()
    if address is None:
        pytest.skip("this machine has no non-loopback address")
    return address


def at(host: str, hub_host: str = "", node_rank: int = 0) -> NodeOptions:
    return NodeOptions(nnodes=2, node_rank=node_rank, rdzv_host=host, rdzv_port=29500, hub_port=29501,
                       token=TOKEN, hub_host=hub_host)


def test_hub_binds_the_endpoints_own_address_and_every_interface_only_when_told(monkeypatch):
    from ddptop.run import multinode
    from ddptop.run.multinode import hub_bind_host

    ip = this_machines_address()
    assert hub_bind_host(at("127.0.0.1")) == "127.0.0.1" and hub_bind_host(at("localhost")) == "localhost"
    assert hub_bind_host(at(ip)) == ip  # an address of this machine: that one, not 0.0.0.0
    assert hub_bind_host(at(ip, hub_host="0.0.0.0")) == "0.0.0.0"  # told: every interface
    assert hub_bind_host(at(ip, hub_host="::")) == "::"
    with pytest.raises(ValueError, match="--hub-host 203.0.113.9 is not an address of this machine"):
        hub_bind_host(at(ip, hub_host="203.0.113.9"))
    # a hostname: resolved to this machine's address for it
    names = {"node0.example": [ip], "debian-own-name": ["127.0.1.1"], "elsewhere.example": ["203.0.113.9"],
             "nowhere.example": []}
    monkeypatch.setattr(multinode, "resolve", lambda host: names[host])
    assert hub_bind_host(at("node0.example")) == ip
    # resolves here only to a loopback alias (no other node reaches that): where the default route leaves
    assert hub_bind_host(at("debian-own-name")) == ip
    with pytest.raises(ValueError, match="endpoint elsewhere.example .203.0.113.9. is not an address of this machine"):
        hub_bind_host(at("elsewhere.example"))
    with pytest.raises(ValueError, match="cannot resolve the rendezvous host 'nowhere.example'.*--hub-host"):
        hub_bind_host(at("nowhere.example"))


def test_node0s_own_ranks_report_to_the_address_its_hub_listens_on():
    assert at("debian-own-name", hub_host="192.0.2.7").hub_addr == "tcp:192.0.2.7:29501"
    assert at("h", hub_host="0.0.0.0").hub_addr == "tcp:h:29501"  # every interface: the name will do
    assert at("h", hub_host="192.0.2.7", node_rank=1).hub_addr == "tcp:h:29501"  # other nodes: the endpoint
    assert at("h").hub_addr == "tcp:h:29501"


def test_a_hub_on_the_endpoints_address_is_not_on_loopback():
    """For real: the hub of an endpoint at this machine's address takes connections there and
    none on 127.0.0.1 (the old default listened on every interface)."""
    import asyncio

    from recording_sink import Sink

    from ddptop.run.hub import Hub
    from ddptop.run.multinode import hub_bind_host

    ip = this_machines_address()

    async def main() -> None:
        hub = Hub(TOKEN, Sink(), world_size=2)
        address = await hub.start_tcp(hub_bind_host(at(ip)), 0)
        port = int(address.rsplit(":", 1)[1])
        try:
            socket.create_connection((ip, port), timeout=5).close()
            with pytest.raises(ConnectionRefusedError):
                socket.create_connection(("127.0.0.1", port), timeout=5)
        finally:
            await hub.close()

    asyncio.run(main())


def test_cli_resolves_the_hub_host_and_says_where_it_listens():
    from ddptop.run.multinode import join_instructions

    ip = this_machines_address()
    args = cli.run_parser().parse_args(["--nnodes", "2", "--rdzv-endpoint", f"{ip}:{free_port_pair()}"])
    node0 = cli.check_node(cli.node_options(args, environ={}), RunConfig(nproc=2), args)
    assert node0.hub_host == ip
    args = cli.run_parser().parse_args(["--nnodes", "2", "--rdzv-endpoint", f"{ip}:{free_port_pair()}",
                                        "--hub-host", "0.0.0.0"])
    node0 = cli.check_node(cli.node_options(args, environ={}), RunConfig(nproc=2), args)
    assert node0.hub_host == "0.0.0.0"
    said = join_instructions(RunConfig(nproc=2), node0)
    assert "(every interface)" in said and "--hub-host" not in said  # the join command does not carry it
    said = join_instructions(RunConfig(nproc=2), at("debian-own-name", hub_host="192.0.2.7"))
    assert "hub at debian-own-name:29501 (listening on 192.0.2.7)" in said


@pytest.mark.parametrize(
    "args, fragment",
    [
        (["--hub-host", "0.0.0.0"], "--hub-host is for multi-node runs"),
        (["--nnodes", "2", "--node-rank", "1", "--rdzv-endpoint", "h:5", "--hub-host", "0.0.0.0"],
         "give it on node 0 only"),
        (["--nnodes", "2", "--rdzv-endpoint", "203.0.113.9:29500"], "is not an address of this machine"),
        (["--nnodes", "2", "--rdzv-endpoint", "127.0.0.1:29500", "--hub-host", "203.0.113.9"],
         "--hub-host 203.0.113.9 is not an address of this machine"),
    ],
)
def test_bad_hub_host_usage_exits_2_with_one_line(tmp_path, args, fragment):
    test_bad_multi_node_usage_exits_2_with_one_line(tmp_path, args, fragment)


# ---------------------------------------------------------------------------- forged ranks


def forge(hub: tuple[str, int], frame: bytes) -> bytes:
    """`frame` as the first of a connection to node 0's hub; what came back (b"": hung up on)."""
    with socket.create_connection(hub, timeout=10) as sock:
        sock.sendall(frame)
        return sock.recv(1024)  # a hello let in would leave the connection open: a timeout here


def forged_hello(rank: int, pid: int, world: int = 4) -> bytes:
    return protocol.encode(protocol.Hello(rank=rank, local_rank=rank % 2, world_size=world, host="forger",
                                          pid=pid, token=TOKEN, node=0))


@pytest.mark.e2e
def test_forged_hellos_with_the_token_are_refused_counted_and_signal_nobody(tmp_path):
    """Two nodes on this machine, node 0's hub on this machine's address (not on loopback), and a
    token holder who forges hellos: a foreign process's pid, pid 0, ddptop's and torchrun's own
    pids, rank 10**9, a 10**400 number, a second hello for a live rank. Each is hung up on and
    counted; the honest ranks report every step; the foreign process is never signalled; the
    run completes."""
    host = this_machines_address()
    port = free_port_pair()
    hub = (host, port + 1)
    common = ["--nnodes", "2", "--rdzv-endpoint", f"{host}:{port}", "--steps", "40", *RUN]
    env = {**os.environ, protocol.ENV_TOKEN: TOKEN}
    stranger = subprocess.Popen(["sleep", "600"])  # no process of the run: must never be signalled
    node0 = start_node(["--node-rank", "0", "--json", *common], tmp_path / "n0", env)
    node1 = None
    try:
        read_until(node0, lambda line: line.startswith(f"    {protocol.ENV_TOKEN}="))
        # node 0's torchrun is up (so its hub listens), waiting for node 1 at the rendezvous: no
        # rank has said hello yet
        torchrun = wait_for(lambda: next((p for p in tree(node0)[1:] if "torch" in " ".join(p.cmdline())), None),
                            30, "node 0's torchrun")
        with pytest.raises(ConnectionRefusedError):  # the endpoint's address, not every interface
            socket.create_connection(("127.0.0.1", hub[1]), timeout=5)
        early = {
            "a foreign pid": forged_hello(0, stranger.pid),
            "pid 0": forged_hello(1, 0),
            "ddptop's own pid": forged_hello(0, node0.pid),
            "torchrun's pid": forged_hello(1, torchrun.pid),
            "rank 10**9": forged_hello(10**9, stranger.pid),
            "a 10**400 number": forged_hello(0, stranger.pid, world=10**400),
        }
        for what, frame in early.items():
            assert forge(hub, frame) == b"", what
        node1 = start_node(["--node-rank", "1", *common], tmp_path / "n1", env)
        read_until(node0, lambda line: " running " in line and "step" in line, timeout=180)
        late = {
            "a second hello for live rank 0": forged_hello(0, stranger.pid),
            "a second hello for live rank 3, pid 0": forged_hello(3, 0),
            "rank 10**9 while running": forged_hello(10**9, stranger.pid),
            "a 10**400 number while running": forged_hello(2, stranger.pid, world=10**400),
        }
        for what, frame in late.items():
            assert forge(hub, frame) == b"", what
        read_until(node0, lambda line: " running " in line, timeout=60)  # still going after them
        shown = [p.info["cmdline"] for p in psutil.process_iter(["cmdline"]) if TOKEN in " ".join(p.info["cmdline"] or [])]
        assert shown == []  # neither node's processes carry the token in argv
        out0, _ = node0.communicate(timeout=240)
        out1, _ = node1.communicate(timeout=60)
        stranger_alive = stranger.poll() is None
    finally:
        for p in (node0, node1, stranger):
            if p is not None and p.poll() is None:
                p.kill()
                p.wait()
    assert node0.returncode == 0, out0[-3000:]
    assert node1.returncode == 0, out1[-3000:]
    summary = json.loads(out0.strip().splitlines()[-1])
    print(f"\nrefused {summary['refused_connections']} forged hello(s), dropped {summary['dropped_frames']}; "
          f"steps {[r['steps'] for r in summary['ranks']]}")
    assert summary["status"] == "completed" and summary["world_size"] == 4
    assert [r["steps"] for r in summary["ranks"]] == [40] * 4  # the honest ranks reported every step
    assert [r["status"] for r in summary["ranks"]] == ["done"] * 4
    assert summary["refused_connections"] == len(early) + len(late)  # each forgery refused and counted
    assert summary["dropped_frames"] == {}  # ...at its hello: nothing of it got into the run
    assert stranger_alive  # never signalled: SIGUSR1 (stall stacks) or SIGTERM would have ended it
