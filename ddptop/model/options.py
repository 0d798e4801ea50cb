"""Small option records the CLI hands to a Session (pure data)."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field


@dataclass(frozen=True)
class CaptureOptions:
    windows: list[tuple[int, int]] = field(default_factory=list)  # (start step, count), from --capture
    profiler: str = "torch"  # torch | nsys
    nsys: str | None = None  # nsys binary when profiler == "nsys"


WILDCARDS = ("0.0.0.0", "::")  # --hub-host values meaning every interface


@dataclass(frozen=True)
class NodeOptions:
    """Where this ddptop stands in a run: one node (the default), or node `node_rank` of
    `nnodes`, all joining torchrun's c10d rendezvous at rdzv_host:rdzv_port. Node 0 hosts
    the rendezvous store and the hub every rank reports to (at rdzv_host:hub_port).
    Per invocation, so not in RunConfig (which every node shares and records)."""

    nnodes: int = 1
    node_rank: int = 0
    rdzv_host: str = ""
    rdzv_port: int = 0
    hub_port: int = 0
    token: str = field(default="", repr=False)  # the run's secret: never printed by accident
    # where node 0's hub listens: "" until resolved (ddptop.run.multinode.hub_bind_host: the
    # endpoint's own address), or what --hub-host said (0.0.0.0 / :: for every interface)
    hub_host: str = ""

    @property
    def multi(self) -> bool:
        return self.nnodes > 1

    @property
    def hosts_hub(self) -> bool:
        return self.node_rank == 0

    @property
    def endpoint(self) -> str:
        return f"{_bracket(self.rdzv_host)}:{self.rdzv_port}"

    @property
    def hub_addr(self) -> str:
        """DDPTOP_ADDR for the ranks of this node: the endpoint, as every node names node 0;
        on node 0 itself the very address its hub listens on (the endpoint's name may resolve
        here to a loopback alias the hub does not listen on)."""
        host = self.rdzv_host
        if self.node_rank == 0 and self.hub_host and self.hub_host not in WILDCARDS:
            host = self.hub_host
        return f"tcp:{host}:{self.hub_port}"

    @property
    def rdzv_id(self) -> str:
        """The rendezvous id: from the token, which every node already shares, so joining
        needs no extra flag; a hash, so the id (in torchrun's logs and argv) gives the
        token away to nobody."""
        return "ddptop-" + hashlib.sha256(self.token.encode()).hexdigest()[:16]


def _bracket(host: str) -> str:
    return f"[{host}]" if ":" in host else host


def parse_endpoint(text: str) -> tuple[str, int]:
    """HOST:PORT (IPv6 as [addr]:PORT) -> (host, port); ValueError with a one-line reason."""
    host, sep, port = text.strip().rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"--rdzv-endpoint {text!r}: expected HOST:PORT with a port in 1-65535")
    return host, int(port)


def python_ignores_pythonpath(cmd: list[str] | None) -> str:
    """Why no rank of `cmd` can be measured: `python -I` (isolated) or `-E` ignores PYTHONPATH,
    the way ddptop's layer enters a rank, so the run would read `completed` with every figure
    n/a and nothing saying why; '' when the command is not such a Python."""
    if not cmd or not cmd[0].rsplit("/", 1)[-1].startswith("python"):
        return ""
    args = iter(cmd[1:])
    for arg in args:
        if arg.startswith("--"):
            continue  # --version, --help, --check-hash-based-pycs VALUE (rare): no I/E in them
        if not arg.startswith("-") or arg == "-":
            break  # the script (or stdin): its own flags are not Python's
        flags = arg[1:]
        for flag in flags:
            if flag in "IE":
                return (f"the ranks run `{cmd[0].rsplit('/', 1)[-1]} -{flag}`, which ignores PYTHONPATH: ddptop's "
                        "layer cannot load in them, so nothing of the ranks is measured (drop -I/-E to measure)")
            if flag in "cmWX":
                break  # an option with a value: the rest of the argument, or the next one
        else:
            continue
        if flag in "cm":
            break  # -c CODE, -m MODULE: what follows is theirs
        if arg == f"-{flag}" or arg.endswith(flag):
            next(args, None)  # -W VALUE, -X VALUE
    return ""
