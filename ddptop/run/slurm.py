"""Slurm: a ddptop started by `srun --ntasks-per-node 1` (one task per node) takes its place in
the job from SLURM_*: the node count, its node rank, the rendezvous on the step's first host, a
run id and a token every node derives alike. No torch, no UI; flags given on the command line win.

The token is derived, not sent: HMAC-SHA256(a per-user key, "slurm:<job>.<step>"). The key is
made once (0600, ~/.config/ddptop/slurm.key, created atomically), and the home directory is
shared on a Slurm cluster, so every node of the job computes the same token by itself: nothing
goes through argv, the environment of other users, the job's output file or a per-job file
another node would have to wait for. Only this user (who can read the key) can compute it.
"""

from __future__ import annotations

import argparse
import hashlib
import hmac
import os
import re
import secrets
import shutil
import stat
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from ddptop.wire import protocol

MAX_HOSTS = 100_000  # a host list that expands past this is a typo, not a cluster
PORT_BASE, PORT_SLOTS = 20000, 6000  # rendezvous ports 20000-31998 (+1 for the hub): below Linux's ephemeral range
KEY_ENV = "DDPTOP_SLURM_KEY"  # where the per-user key lives (default: $XDG_CONFIG_HOME/ddptop/slurm.key)
KEY_FINGERPRINT = "DDPTOP_SLURM_KEY_FINGERPRINT"  # set only in the dict apply_slurm fills, never exported
NOT_STEPS = {"batch", "extern", "interactive", "4294967291", "4294967292", "4294967293", "4294967294"}
_RANGE = re.compile(r"^(\d+)(?:-(\d+))?$")


@dataclass(frozen=True)
class SlurmStep:
    """This task's place in a Slurm job step."""

    job_id: str
    step_id: str
    nnodes: int
    node_id: int
    nodelist: str  # compressed, as Slurm gives it
    ntasks: int
    restarts: int = 0

    @property
    def name(self) -> str:
        return f"{self.job_id}.{self.step_id}"

    @property
    def rdzv_port(self) -> int:
        """The same port on every node (from the job and step ids), even, with the hub on +1."""
        digest = hashlib.sha256(self.name.encode()).digest()
        return PORT_BASE + 2 * (int.from_bytes(digest[:4], "big") % PORT_SLOTS)

    def run_id(self, preset: str) -> str:
        """One run id for the whole job step (node 0's; the others add -node<R>)."""
        again = f"-r{self.restarts}" if self.restarts else ""
        return f"slurm-{self.name}{again}-{preset}"


def expand_hostlist(text: str) -> list[str]:
    """Slurm's compressed host list -> host names, in order: `node[01-04,07]`, `a[1-2]-ib,b3`,
    `r[1-2]n[1-2]` (every combination), zero padding kept. ValueError with a one-line reason."""
    hosts: list[str] = []
    for item in _split_top(text.strip()):
        hosts += _expand_one(item, text)
        if len(hosts) > MAX_HOSTS:
            raise ValueError(f"host list {text!r} expands to more than {MAX_HOSTS} hosts")
    if not hosts:
        raise ValueError(f"empty host list {text!r}")
    return hosts


def _split_top(text: str) -> list[str]:
    """Split on the commas outside brackets."""
    items, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        depth += (ch == "[") - (ch == "]")
        if depth not in (0, 1):
            raise ValueError(f"host list {text!r}: unbalanced brackets")
        if ch == "," and depth == 0:
            items.append(text[start:i])
            start = i + 1
    if depth:
        raise ValueError(f"host list {text!r}: unbalanced brackets")
    items.append(text[start:])
    return [i.strip() for i in items if i.strip()]


def _expand_one(item: str, whole: str) -> list[str]:
    head, bracket, rest = item.partition("[")
    if not bracket:
        if "]" in item:
            raise ValueError(f"host list {whole!r}: unbalanced brackets")
        return [item]
    inner, _, tail = rest.partition("]")
    out = []
    for piece in inner.split(","):
        m = _RANGE.match(piece.strip())
        if not m:
            raise ValueError(f"host list {whole!r}: {piece!r} is not a number or a range")
        lo, hi = m.group(1), m.group(2) or m.group(1)
        if int(hi) < int(lo) or int(hi) - int(lo) > MAX_HOSTS:
            raise ValueError(f"host list {whole!r}: bad range {piece!r}")
        width = len(lo) if lo.startswith("0") else 0
        out += [f"{head}{n:0{width}d}" for n in range(int(lo), int(hi) + 1)]
    tails = _expand_one(tail, whole) if tail else [""]
    return [h + t for h in out for t in tails]


def hostnames(nodelist: str) -> list[str]:
    """The step's hosts: `scontrol show hostnames` when Slurm's own tool is here (it knows
    every form the site uses), else our own expansion."""
    scontrol = shutil.which("scontrol")
    if scontrol:
        try:
            out = subprocess.run([scontrol, "show", "hostnames", nodelist], capture_output=True,
                                 text=True, timeout=10, check=True).stdout.split()
            if out:
                return out
        except (OSError, subprocess.SubprocessError):
            pass
    return expand_hostlist(nodelist)


def _int(env: Mapping[str, str], *keys: str) -> int | None:
    for key in keys:
        value = env.get(key, "").strip()
        if value:
            m = re.match(r"^\d+", value)  # SLURM_TASKS_PER_NODE-like "2(x3)" forms: the leading count
            if m:
                return int(m.group())
    return None


def current_step(env: Mapping[str, str]) -> SlurmStep | None:
    """This process's Slurm step when it is a task that srun started on more than one node
    (SLURM_STEP_* where srun sets them, the job's SLURM_* otherwise), else None. The batch
    script itself (no step id, or the batch/extern step) is no step: it runs on one node."""
    job, step = env.get("SLURM_JOB_ID", "").strip(), env.get("SLURM_STEP_ID", "").strip()
    if not job or not step or step in NOT_STEPS:
        return None
    nnodes = _int(env, "SLURM_STEP_NUM_NODES", "SLURM_NNODES", "SLURM_JOB_NUM_NODES")
    node_id = _int(env, "SLURM_NODEID")
    nodelist = next((env[k] for k in ("SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST")
                     if env.get(k, "").strip()), "")
    if nnodes is None or nnodes < 2 or node_id is None or not nodelist:
        return None
    ntasks = _int(env, "SLURM_STEP_NUM_TASKS", "SLURM_NTASKS") or nnodes
    return SlurmStep(job_id=job, step_id=step, nnodes=nnodes, node_id=node_id, nodelist=nodelist.strip(),
                     ntasks=ntasks, restarts=_int(env, "SLURM_RESTART_COUNT") or 0)


def key_path(env: Mapping[str, str]) -> Path:
    if env.get(KEY_ENV):
        return Path(env[KEY_ENV])
    config = env.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(config) / "ddptop" / "slurm.key"


def read_or_make_key(path: Path) -> bytes:
    """The per-user key: made once, 0600, published with link() so that nodes starting at the
    same moment all end up reading the one that won (link is atomic, on NFS too)."""
    if not path.exists():
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{secrets.token_hex(6)}")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.write(fd, (secrets.token_hex(32) + "\n").encode())
        finally:
            os.close(fd)
        try:
            os.link(tmp, path)
        except FileExistsError:
            pass
        finally:
            tmp.unlink(missing_ok=True)
    st = path.stat()
    if st.st_uid != os.getuid() or st.st_mode & 0o077 or not stat.S_ISREG(st.st_mode):
        raise ValueError(f"{path} must be a file of yours that only you can read (chmod 600 {path})")
    key = path.read_bytes().strip()
    if len(key) < 32:
        raise ValueError(f"{path} is too short to be a key: remove it and a new one is made")
    return key


def derived_token(step: SlurmStep, key: bytes) -> str:
    return hmac.new(key, f"slurm:{step.name}".encode(), hashlib.sha256).hexdigest()[:32]


def fingerprint(key: bytes) -> str:
    """Says whether two nodes read the same key, and gives nothing of it away."""
    return hashlib.sha256(b"ddptop-key-fingerprint:" + key).hexdigest()[:8]


def apply_slurm(args: argparse.Namespace, env: dict[str, str]) -> SlurmStep | None:
    """Fill what the command line left out from this Slurm step: --nnodes, --node-rank,
    --rdzv-endpoint (the step's first host) and the token ($DDPTOP_TOKEN in `env`, derived;
    one given already wins). ValueError (one line) for a step ddptop cannot serve. An
    explicit --nnodes (1 included) means the user chose: Slurm is not consulted."""
    step = current_step(env)
    if step is None or args.nnodes is not None:
        return None
    if step.ntasks > step.nnodes:
        raise ValueError(f"srun started {step.ntasks} tasks on {step.nnodes} nodes: run one ddptop per node "
                         f"(srun --ntasks-per-node 1); it starts the node's ranks itself (--nproc)")
    if not 0 <= step.node_id < step.nnodes:
        raise ValueError(f"SLURM_NODEID {step.node_id} is not in 0..{step.nnodes - 1}")
    args.nnodes = step.nnodes
    if args.node_rank is None:
        args.node_rank = step.node_id
    if args.rdzv_endpoint is None:
        first = hostnames(step.nodelist)[0]
        args.rdzv_endpoint = f"[{first}]:{step.rdzv_port}" if ":" in first else f"{first}:{step.rdzv_port}"
    if args.token is None and args.token_file is None and not env.get(protocol.ENV_TOKEN):
        path = key_path(env)
        try:
            key = read_or_make_key(path)
        except OSError as exc:
            raise ValueError(f"the Slurm token key {path}: {exc.strerror or exc} (or export "
                             f"{protocol.ENV_TOKEN} before srun)") from None
        env[protocol.ENV_TOKEN] = derived_token(step, key)
        env[KEY_FINGERPRINT] = fingerprint(key)
    return step


def describe(step: SlurmStep, node_rank: int, env: dict[str, str]) -> str:
    """One line every node prints: where it stands and where the token came from."""
    fp = env.get(KEY_FINGERPRINT)
    token = (f"token derived from the job id and your key (fingerprint {fp}: the same on every node)"
             if fp else f"token from {protocol.ENV_TOKEN} or the command line")
    return (f"ddptop: Slurm job {step.name}: node {node_rank} of {step.nnodes} ({step.nodelist}); "
            f"the other nodes join by themselves; {token}")
