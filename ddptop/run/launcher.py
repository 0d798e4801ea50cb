"""Builds and runs the `torchrun` command for a run, and stops its whole process tree.

torchrun does the real launching (rendezvous, per-rank env, log redirection,
failure reports); we only choose its arguments and environment. Nothing here
imports torch: torchrun is a child process.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import os
import re
import shutil
import signal
import stat
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import psutil

from ddptop.model.config import RunConfig
from ddptop.model.options import NodeOptions
from ddptop.run.keeper import start_ticks
from ddptop.run.nsys import profile_command
from ddptop.wire import protocol

PACKAGE_ROOT = Path(__file__).resolve().parents[2]  # holds ddptop/ and trainer/
BOOT_DIR = Path(__file__).resolve().parents[1] / "rank" / "boot"  # the ranks' sitecustomize
# torchrun's grace for the ranks after it forwards a stop signal (TORCH_ELASTIC_SHUTDOWN_TIMEOUT):
# the run's --stop-grace and this, so that ddptop, knowing what it kills, ends those left itself
TORCHRUN_MARGIN_S = 10


@dataclass(frozen=True)
class LaunchPlan:
    argv: list[str]
    env: dict[str, str]
    log_path: Path  # torchrun's own stdout+stderr

    def describe(self) -> str:
        return " ".join(self.argv)


def build_plan(
    config: RunConfig,
    run_dir: Path,
    hub_addr: str,
    token: str,
    run_id: str,
    user_cmd: list[str] | None = None,
    python: str = sys.executable,
    base_env: dict[str, str] | None = None,
    nsys: str | None = None,
    node: NodeOptions | None = None,
    nccl_plugin: tuple[Path | None, str] = (None, ""),
) -> LaunchPlan:
    """The torchrun command line and environment for this run (pure). `nccl_plugin`: ddptop's
    NCCL profiler plugin as built for the run (ddptop.run.nccl_plugin.build), or why there is none."""
    node = node or NodeOptions()
    argv = [python, "-m", "torch.distributed.run", *rendezvous_args(node)]
    argv += [
        f"--nproc-per-node={config.world_size}",  # per node: torchrun adds up the nodes
        f"--log-dir={run_dir / 'logs'}",
        "--redirects=3",  # each rank's stdout/stderr to files under logs/
        "--max-restarts=0",
        # how soon torchrun sees its ranks gone; 0.1 s lost torchrun's report of a SIGKILLed
        # rank in one CI run, so the value every earlier CI run passed with
        "--monitor-interval=0.5",
    ]
    rank_cmd = user_cmd or [python, "-m", "trainer"]
    if nsys:
        # every rank inside nsys; recording only between cudaProfilerStart/Stop (our
        # capture windows), one report per window per rank (asks `nsys profile --help` once)
        out = run_dir / "captures" / "nsys_rank%q{RANK}"
        rank_cmd = [*profile_command(nsys, out, os.environ if base_env is None else base_env), *rank_cmd]
    if user_cmd or nsys:
        # `--`: the command's own arguments are never torchrun's (`--nproc 99` in them read as
        # an ambiguous torchrun option)
        argv += ["--no-python", "--", *rank_cmd]
    else:
        argv += ["-m", "trainer"]
    env = dict(os.environ if base_env is None else base_env)
    env.update({
        protocol.ENV_ADDR: hub_addr,
        protocol.ENV_TOKEN: token,
        protocol.ENV_RUN_ID: run_id,
        protocol.ENV_CONFIG: str(run_dir / "config.json"),
        protocol.ENV_NODE: str(node.node_rank),
        "PYTHONUNBUFFERED": "1", "TORCH_ELASTIC_SHUTDOWN_TIMEOUT": str(config.stop_grace + TORCHRUN_MARGIN_S),
        "NCCL_DEBUG_FILE": str(run_dir / "nccl" / "nccl.%h.%p.log"),
    })
    env.setdefault("NCCL_DEBUG", "INFO")
    # NCCL flight recorder, dumped through its pipe on a stall (named for the rank's torch by rank.attach)
    env.setdefault(protocol.ENV_FR_BUFFER_SIZE, "2000")
    env.setdefault(protocol.ENV_FR_DUMP_FILE, str(run_dir / "stacks" / "nccl_trace_rank_"))
    env.setdefault("TORCH_NCCL_DEBUG_INFO_PIPE_FILE", str(run_dir / "stacks" / "nccl_pipe_rank_"))
    if config.comm_timing and config.nccl_timing:
        nccl_timing_env(env, *nccl_plugin)
    if config.world_size > 1:  # torchrun's default, only where it sets it (one process a node: torch's own)
        env.setdefault("OMP_NUM_THREADS", "1")
    env.update(config.nccl_env)
    boot_path(env)
    return LaunchPlan(argv=argv, env=env, log_path=run_dir / "torchrun.log")


def boot_path(env: dict[str, str]) -> None:
    """The boot dir first on the ranks' PYTHONPATH: its sitecustomize attaches ddptop's instrument
    to every rank (and runs the one it shadows) and appends this ddptop's root to sys.path, last:
    on PYTHONPATH the root would shadow a script's own `trainer` and change the paths torch's
    logging prints (issue 43)."""
    user = env.pop(protocol.ENV_USER_PYTHONPATH, None)  # a supervisor runs with the root on its own path
    path = env.get("PYTHONPATH", "") if user is None else user
    env["PYTHONPATH"] = os.pathsep.join([str(BOOT_DIR), *([path] if path else [])])
    env[protocol.ENV_PACKAGE_ROOT] = str(PACKAGE_ROOT)


def nccl_timing_env(env: dict[str, str], plugin: Path | None, why: str) -> None:
    """NCCL times each collective itself (CUDA events around its kernels): the instrument
    reads those times from a completion hook while DDP keeps its C++ all-reduce; and the
    plugin, where built, the kernels' own start and end (NCCL >= 2.28)."""
    env.setdefault("TORCH_NCCL_ENABLE_TIMING", "1")
    if plugin is not None:
        env.setdefault(protocol.ENV_NCCL_PROFILER_PLUGIN, str(plugin))
    elif why:
        env[protocol.ENV_NCCL_PLUGIN_WHY] = why


def rendezvous_args(node: NodeOptions) -> list[str]:
    """One node: torchrun's standalone store on a free port. Several: torchrun's own c10d
    rendezvous at node 0's endpoint; node 0 hosts the store (is_host says so outright, so
    two "nodes" on one machine do not both try to), and c10d assigns node and global
    ranks itself (no --node-rank: torchrun ignores it there, with a warning)."""
    if not node.multi:
        return ["--standalone"]
    return [
        f"--nnodes={node.nnodes}",
        "--rdzv-backend=c10d",
        f"--rdzv-endpoint={node.endpoint}",
        f"--rdzv-id={node.rdzv_id}",
        f"--rdzv-conf=is_host={1 if node.hosts_hub else 0}",
    ]


PR_SET_CHILD_SUBREAPER = 36
CENSUS_S = 1.0  # how often the keeper hears of the run's new processes


def become_subreaper() -> bool:
    """Orphans of the run (a rank whose torchrun was killed, a script's own daemon) are
    re-parented to this process instead of init, so the last sweep of a run finds them."""
    if sys.platform != "linux":
        return False
    try:
        return ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def die_with_parent() -> None:
    """In the child: get SIGTERM if ddptop dies, so no run outlives a killed monitor."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


class Launcher:
    """Runs one LaunchPlan as ddptop's single child, in its own session so a
    terminal's Ctrl-C reaches ddptop first and ddptop stops the ranks in order."""

    def __init__(self, plan: LaunchPlan, leftovers: tuple[str, ...] = ()) -> None:
        self.plan = plan
        self.leftovers = leftovers  # paths to remove should ddptop be killed (the hub's socket dir)
        self.proc: asyncio.subprocess.Process | None = None
        self.started_at = 0.0
        self._before: set[int] = set()  # our children before the run: not the run's to sweep
        self._seen: dict[int, psutil.Process] = {}  # every process of the run seen so far
        self._keeper: subprocess.Popen[bytes] | None = None  # ends the run if ddptop is killed
        self._told: set[int] = set()  # pids the keeper knows of
        self._census: asyncio.Task[None] | None = None

    async def start(self) -> int:
        become_subreaper()
        self._keeper = _start_keeper()
        if self._keeper is not None and self._keeper.stdin is not None:
            with contextlib.suppress(OSError):
                self._keeper.stdin.write("".join(f"rm {path}\n" for path in self.leftovers).encode())
        self._before = {p.pid for p in psutil.Process().children()}
        with open(self.plan.log_path, "ab") as log:
            self.proc = await asyncio.create_subprocess_exec(
                *self.plan.argv,
                env=self.plan.env,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=log,
                stderr=asyncio.subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=die_with_parent if sys.platform == "linux" else None,
            )
        self.started_at = time.monotonic()
        self.run_processes()  # torchrun, to the keeper at once
        self._census = asyncio.create_task(self._take_census())
        return self.proc.pid

    async def _take_census(self) -> None:
        """Every CENSUS_S, what the run has started since goes to the keeper."""
        while True:
            await asyncio.sleep(CENSUS_S)
            await asyncio.to_thread(self.run_processes)

    def _tell_keeper(self, procs: list[psutil.Process]) -> None:
        if self._keeper is None or self._keeper.stdin is None:
            return
        lines = []
        for p in procs:
            if p.pid not in self._told:
                ticks = start_ticks(p.pid)  # boot-relative: a wall-clock step does not move it
                if ticks is not None:
                    lines.append(f"{p.pid} {ticks}\n")
                    self._told.add(p.pid)
        if lines:
            try:
                self._keeper.stdin.write("".join(lines).encode())
                self._keeper.stdin.flush()
            except (OSError, ValueError):  # the keeper is gone: nothing to be done about it here
                self._keeper = None

    async def _dismiss_keeper(self) -> None:
        """At the end of the sweep: nothing it knows of is alive, so it just leaves."""
        if self._census is not None:
            self._census.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._census
            self._census = None
        keeper, self._keeper = self._keeper, None
        if keeper is not None:
            with contextlib.suppress(OSError, ValueError):
                keeper.stdin.close()  # type: ignore[union-attr]
            with contextlib.suppress(subprocess.TimeoutExpired):
                await asyncio.to_thread(keeper.wait, 10)

    async def wait(self) -> int:
        assert self.proc is not None
        return await self.proc.wait()

    def send(self, sig: int) -> None:
        """`sig` to torchrun, which forwards a stop signal to every rank's process group."""
        if self.running:
            assert self.proc is not None
            with contextlib.suppress(ProcessLookupError):
                self.proc.send_signal(sig)

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.returncode is None

    def tree(self) -> list[psutil.Process]:
        """torchrun and every descendant (ranks, DataLoader workers)."""
        if self.proc is None:
            return []
        try:
            root = psutil.Process(self.proc.pid)
            return [root, *root.children(recursive=True)]
        except psutil.NoSuchProcess:
            return []

    def run_processes(self) -> list[psutil.Process]:
        """Everything of the run still alive: torchrun's tree, plus what was orphaned from it
        and came back to us as their subreaper (ranks of a killed torchrun, a script's own
        children and daemons), with their descendants."""
        procs = self.tree()
        try:
            for child in psutil.Process().children():
                if child.pid in self._before or (self.proc is not None and child.pid == self.proc.pid):
                    continue
                procs += [child, *child.children(recursive=True)]
        except psutil.Error:
            pass
        for p in procs:
            self._seen.setdefault(p.pid, p)
        self._tell_keeper(procs)
        return procs

    async def sweep(self, grace_s: float = 2.0) -> int:
        """The last step of every ending: nothing of the run is left. SIGTERM what is alive
        (torchrun first, through stop()), SIGKILL it after `grace_s`. Returns how many
        processes had to be ended."""
        if self.proc is None:
            return 0
        await self.stop(grace_s=grace_s)
        left = [p for p in self.run_processes() if _alive(p)]
        for p in left:
            try:
                p.terminate()
            except psutil.Error:
                pass
        if left:
            _, alive = await asyncio.to_thread(psutil.wait_procs, left, grace_s)
            for p in alive:
                try:
                    p.kill()
                except psutil.Error:
                    pass
            await asyncio.to_thread(psutil.wait_procs, alive, 3)
        await self._dismiss_keeper()
        return len(left)

    async def stop(self, grace_s: float = 5.0) -> None:
        """SIGTERM torchrun (it forwards to the ranks), then SIGKILL whatever of the
        tree is left after `grace_s`. Returns when nothing of the tree is alive."""
        if self.proc is None:
            return
        procs = self.run_processes()
        if self.running:
            try:
                self.proc.send_signal(signal.SIGTERM)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline:
            procs += [p for p in self.run_processes() if p not in procs]
            if not any(_alive(p) for p in procs):
                break
            await asyncio.sleep(0.1)
        for p in procs:
            if _alive(p):
                try:
                    p.kill()
                except psutil.Error:
                    pass
        # torchrun itself is reaped by asyncio (wait_procs would steal its exit status)
        others = [p for p in procs if p.pid != self.proc.pid]
        await asyncio.to_thread(psutil.wait_procs, others, 3)
        if self.running:
            await self.proc.wait()


SOCKET_DIR_PREFIX = "ddptop-"  # tempfile.mkdtemp(prefix=...): the hub's private socket dir
_SOCKET_DIR = re.compile(r"ddptop-[a-z0-9_]{8}")  # mkdtemp's 8 characters, nothing else
STALE_AFTER_S = 60.0  # a younger dir may be a ddptop that has not bound its socket yet


def remove_stale_socket_dirs(tmp: Path) -> list[Path]:
    """Hub socket directories left in `tmp` by ddptops killed together with their keeper
    (an OOM kill, a kill of the whole session): this user's, of mkdtemp's shape, holding
    at most a hub.sock that nobody listens on, and older than a minute. Returns those
    removed."""
    removed: list[Path] = []
    try:
        candidates = [d for d in tmp.iterdir()  # ddptop-UID is the live registry (ddptop.remote.live)
                      if _SOCKET_DIR.fullmatch(d.name) and d.name != f"ddptop-{os.getuid()}"]
    except OSError:
        return removed
    for d in candidates:
        try:
            st = d.lstat()
            if (not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid()
                    or time.time() - st.st_mtime < STALE_AFTER_S):
                continue
            names = [e.name for e in d.iterdir()]
            if names not in ([], ["hub.sock"]) or (names and _listening(d / "hub.sock")):
                continue
            shutil.rmtree(d)
            removed.append(d)
        except OSError:
            continue
    return removed


def _listening(path: Path) -> bool:
    """Some process has a socket bound to `path` (from /proc/net/unix: no connection made,
    which a live hub would log as refused). Where that cannot be read: assume so."""
    try:
        with open("/proc/net/unix", encoding="utf-8", errors="replace") as f:
            return any(line.rstrip("\n").endswith(" " + str(path)) for line in f)
    except OSError:
        return True


def _start_keeper() -> subprocess.Popen[bytes] | None:
    """ddptop.run.keeper in a session of its own (a terminal's signals are not for it)."""
    try:
        return subprocess.Popen([sys.executable, "-m", "ddptop.run.keeper"], stdin=subprocess.PIPE,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                start_new_session=True, cwd=PACKAGE_ROOT)
    except OSError:
        return None


def _alive(p: psutil.Process) -> bool:
    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False
