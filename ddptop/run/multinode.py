"""Multi-node runs through torchrun's own c10d rendezvous: the command that joins node 0,
where node 0's hub listens, and the runner of every other node.

Node 0 runs a normal Session (its hub on TCP, the full views); a node with rank > 0 only
launches its local torchrun, whose ranks report straight to node 0's hub, and keeps its own
run directory. No torch here: torchrun is a child process.
"""

from __future__ import annotations

import asyncio
import dataclasses
import ipaddress
import os
import shlex
import socket
import sys
import time
from pathlib import Path
from typing import TextIO

from ddptop.model.config import PRESETS, RunConfig, preset_config
from ddptop.model.options import WILDCARDS, NodeOptions
from ddptop.model.run_ids import new_run_id
from ddptop.run import nccl_plugin
from ddptop.run.launcher import Launcher, build_plan
from ddptop.run.logtail import LogTail
from ddptop.run.recorder import new_run_dir, write_json
from ddptop.run.signals import STOP_SIGNALS, on_signals
from ddptop.run.slurm import current_step
from ddptop.run.untrusted import read_text
from ddptop.wire import protocol

STOPPED_EXIT = 130  # as a headless run stopped by a signal
TAIL_ON_FAILURE = 20  # torchrun.log lines printed when the local torchrun fails


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def hub_bind_host(node: NodeOptions) -> str:
    """Where node 0's hub listens: what --hub-host said (0.0.0.0 or :: for every interface),
    else the rendezvous endpoint's own address, never every interface unasked. A loopback
    endpoint stays on loopback; an address of this machine is used as it is; a hostname is
    resolved to this machine's address for it. A name that resolves here only to a loopback
    alias (the machine's own name is 127.0.1.1 on Debian), which no other node could reach,
    gives the address this machine's default route leaves from. ValueError (one line) when
    the endpoint is no address of this machine: node 0 runs where the endpoint points, or
    --hub-host says where to listen."""
    if node.hub_host:
        if node.hub_host not in WILDCARDS and not bindable(node.hub_host):
            raise ValueError(f"--hub-host {node.hub_host} is not an address of this machine")
        return node.hub_host
    host = node.rdzv_host
    if is_loopback(host):
        return host
    addrs = resolve(host)
    local = [a for a in addrs if bindable(a)]
    routable = [a for a in local if not ipaddress.ip_address(a).is_loopback]
    if routable:
        return routable[0]
    hint = "; give --hub-host ADDR (the address the other nodes reach, or 0.0.0.0 for every interface)"
    if local:
        out = default_route_address(ipv6=":" in local[0])
        if out is None:
            raise ValueError(f"{host} resolves here to {local[0]}, a loopback address the other nodes "
                             f"cannot reach{hint}")
        return out
    if not addrs:
        raise ValueError(f"cannot resolve the rendezvous host {host!r} on this machine{hint}")
    raise ValueError(f"the rendezvous endpoint {host} ({addrs[0]}) is not an address of this machine, "
                     f"where node 0 hosts the rendezvous{hint}")


def resolve(host: str) -> list[str]:
    """`host`'s addresses as this machine resolves them, in order, without repeats ([] when
    it does not resolve)."""
    try:
        infos = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError):
        return []
    out: list[str] = []
    for family, *_, sockaddr in infos:
        if family in (socket.AF_INET, socket.AF_INET6) and sockaddr[0] not in out:
            out.append(str(sockaddr[0]))
    return out


def bindable(host: str) -> bool:
    """`host` is an address of this machine (a socket can be bound to it)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        with socket.socket(family, socket.SOCK_STREAM) as sock:
            sock.bind((host, 0))
    except (OSError, UnicodeError):
        return False
    return True


def default_route_address(ipv6: bool = False) -> str | None:
    """The non-loopback address this machine's default route leaves from (a UDP socket
    "connected" to a documentation address: no packet is sent), or None."""
    family, probe = (socket.AF_INET6, "2001:db8::1") if ipv6 else (socket.AF_INET, "192.0.2.1")
    try:
        with socket.socket(family, socket.SOCK_DGRAM) as sock:
            sock.connect((probe, 9))
            addr = str(sock.getsockname()[0])
    except OSError:
        return None
    return None if ipaddress.ip_address(addr.split("%")[0]).is_loopback else addr


def port_free(host: str, port: int) -> bool:
    """True if `port` can be bound here now (a taken hub port is a usage error, not a
    run that fails after its ranks have started)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def run_args(config: RunConfig, user_cmd: list[str] | None = None) -> list[str]:
    """ddptop arguments that rebuild `config` exactly on another node: the preset, then
    every field that differs from it. Every node must run the same settings (each
    trainer reads its own node's config.json), so the join command carries them all."""
    preset = config.preset if config.preset in PRESETS else "baseline"
    base = preset_config(preset, RunConfig(nproc=config.nproc))
    args = ["--nproc", str(config.nproc), "--preset", preset]
    for f in dataclasses.fields(RunConfig):
        if f.name in ("preset", "nproc", "nccl_env"):
            continue
        value = getattr(config, f.name)
        if value != getattr(base, f.name):
            args += ["--set", f"{f.name}={str(value).lower() if isinstance(value, bool) else value}"]
    for key, value in sorted(config.nccl_env.items()):
        if base.nccl_env.get(key) != value:
            args += ["--set", f"nccl_env.{key}={value}"]
    if user_cmd:
        args += ["--", *user_cmd]
    return args


def join_command(config: RunConfig, node: NodeOptions, user_cmd: list[str] | None = None,
                 node_rank: str = "R") -> str:
    """What to run on every other node (like `kubeadm join`). The token goes in the
    environment (`DDPTOP_TOKEN=... ddptop ...`): a process's environment is private to its
    user, its argv is in every user's `ps`."""
    args = ["ddptop", "--nnodes", str(node.nnodes), "--node-rank", node_rank,
            "--rdzv-endpoint", node.endpoint]
    if node.hub_port != node.rdzv_port + 1:
        args += ["--hub-port", str(node.hub_port)]
    args += run_args(config, user_cmd)
    env = f"{protocol.ENV_TOKEN}={shlex.quote(node.token)} "
    return env + " ".join(shlex.quote(a) if a != node_rank else a for a in args)


def join_instructions(config: RunConfig, node: NodeOptions, user_cmd: list[str] | None = None) -> str:
    """What node 0 prints at start: where it listens and the exact join command; under srun,
    whose other tasks join by themselves, no command (and no token: the job's output file
    may be readable by others)."""
    step = current_step(os.environ)
    if step is not None and step.nnodes == node.nnodes:
        return (f"ddptop: node 0 of {node.nnodes}: rendezvous at {node.endpoint}, hub at {node.rdzv_host}:"
                f"{node.hub_port}; the other nodes of Slurm step {step.name} join by themselves")
    many = node.nnodes > 2
    cmd = join_command(config, node, user_cmd, node_rank="R" if many else "1")
    where = "on each other node, R = 1.." + str(node.nnodes - 1) if many else "on the other node"
    listening = ""
    if node.hub_host and node.hub_host != node.rdzv_host:
        listening = " (every interface)" if node.hub_host in WILDCARDS else f" (listening on {node.hub_host})"
    lines = [f"ddptop: node 0 of {node.nnodes}: rendezvous at {node.endpoint}, hub at "
             f"{node.rdzv_host}:{node.hub_port}{listening}; {where}, run:", f"    {cmd}"]
    if is_loopback(node.rdzv_host):
        lines.append(f"ddptop: note: {node.rdzv_host} is a loopback address: only this machine can join")
    return "\n".join(lines)


def _tree_size(launcher: Launcher) -> int:
    return max(len(launcher.tree()) - 1, 0)  # torchrun's descendants: ranks and their workers


async def run_worker_node(config: RunConfig, node: NodeOptions, runs_dir: Path,
                          user_cmd: list[str] | None = None, interval: float = 3.0,
                          out: TextIO = sys.stdout, run_id: str | None = None) -> int:
    """Node `node.node_rank` > 0: its torchrun joins the rendezvous and its ranks report to
    node 0's hub. Returns torchrun's exit code (130 when a signal here stopped it)."""

    run_id = f"{run_id or new_run_id(config.preset)}-node{node.node_rank}"  # run_id: node 0's (Slurm)
    run_dir = new_run_dir(Path(runs_dir), run_id)
    plan = build_plan(config, run_dir, node.hub_addr, node.token, run_id, user_cmd, node=node,
                      nccl_plugin=nccl_plugin.build_for(config, run_dir))
    write_json(run_dir / "config.json", {**config.to_dict(), "_launch": {
        "run_id": run_id, "argv": plan.argv, "host": socket.gethostname(), "user_cmd": user_cmd,
        "nnodes": node.nnodes, "node_rank": node.node_rank, "rdzv_endpoint": node.endpoint,
        "rdzv_id": node.rdzv_id, "hub": f"{node.rdzv_host}:{node.hub_port}"}})
    launcher = Launcher(plan)
    stopping = asyncio.Event()
    tail = LogTail()
    where = f"node {node.node_rank}/{node.nnodes}"
    print(f"ddptop: {where}: run {run_id}, {config.world_size} local rank(s), records in {run_dir}; "
          f"the live view is on node 0 (hub {node.rdzv_host}:{node.hub_port})", file=out, flush=True)
    started = time.monotonic()
    with on_signals(dict.fromkeys(STOP_SIGNALS, lambda _: stopping.set())):
        try:
            await launcher.start()
            waiter = asyncio.create_task(launcher.wait())
            stop_wait = asyncio.create_task(stopping.wait())
            while not waiter.done():
                await asyncio.wait({waiter, stop_wait}, timeout=interval, return_when=asyncio.FIRST_COMPLETED)
                for line in tail.read(plan.log_path):
                    print(f"torchrun: {line}", file=out, flush=True)
                if stopping.is_set() and not waiter.done():
                    print(f"ddptop: {where}: stopping the local ranks", file=out, flush=True)
                    await launcher.stop()
                    break
                if not waiter.done():
                    print(f"[{time.monotonic() - started:6.1f}s] {where}: torchrun running, "
                          f"{_tree_size(launcher)} process(es) under it; the live view is on node 0",
                          file=out, flush=True)
            stop_wait.cancel()
            rc = await waiter
        finally:
            # cancelled, failed, or completed with a script's daemon left: nothing outlives this node
            await launcher.sweep(grace_s=2.0)
    lines = tail.read(plan.log_path)
    if rc != 0 and not stopping.is_set():
        lines = _last_lines(plan.log_path, TAIL_ON_FAILURE)
    for line in lines:
        print(f"torchrun: {line}", file=out, flush=True)
    if stopping.is_set():
        print(f"ddptop: {where}: stopped by a signal; logs in {run_dir}", file=out, flush=True)
        return STOPPED_EXIT
    print(f"ddptop: {where}: torchrun exited with code {rc}; logs in {run_dir}", file=out, flush=True)
    return rc


def _last_lines(path: Path, n: int) -> list[str]:
    return (read_text(path, 64 << 20) or "").splitlines()[-n:]
