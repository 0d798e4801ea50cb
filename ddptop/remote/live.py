"""Live runs on this machine: the private live directory (viewer sockets, the
registry of running supervisors), reading and cleaning that registry, and
starting a supervisor process. File and process plumbing only: no asyncio, no
UI, no torch.

    <live>/<run_id>.json   registry entry (0600), rewritten about once a second
    <live>/<short>.sock    the supervisor's viewer socket (0600)
    <live>/<run_id>.log    the supervisor's output until its run directory exists
"""

from __future__ import annotations

import functools
import json
import os
import re
import secrets
import stat
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from ddptop.model.config import RunConfig
from ddptop.model.options import CaptureOptions
from ddptop.wire import protocol

LIVE_ENV = "DDPTOP_LIVE_DIR"  # override (tests, or a node whose /tmp is odd)
SOCKET_PATH_MAX = 100  # sun_path holds 108 bytes with its NUL; keep a margin
PACKAGE_ROOT = Path(__file__).resolve().parents[2]
SUPERVISOR_MODULE = "ddptop.remote.supervisor"
TMP_ROOT = Path("/tmp")  # where the default live directory goes without $XDG_RUNTIME_DIR


class LiveDirError(Exception):
    """The live directory is missing, not ours, or not private; one line."""


def live_dir() -> Path:
    """$DDPTOP_LIVE_DIR, else $XDG_RUNTIME_DIR/ddptop, else /tmp/ddptop-<uid>. A default that
    someone else made (any user can `mkdir /tmp/ddptop-<your uid>` first) is passed over for a
    private directory of ours beside it, said in one line; one given in $DDPTOP_LIVE_DIR is not."""
    env = os.environ.get(LIVE_ENV)
    if env:
        return Path(env)
    xdg = os.environ.get("XDG_RUNTIME_DIR")
    # Not tempfile.gettempdir(): a long $TMPDIR would overflow the socket path limit.
    default = Path(xdg) / "ddptop" if xdg else TMP_ROOT / f"ddptop-{os.getuid()}"
    why = not_private(default)
    return default if not why else _fallback(default, why)


def not_private(path: Path) -> str:
    """Why `path` cannot be our live directory ('' when it can, or does not exist yet)."""
    try:
        st = path.lstat()  # lstat: a planted symlink is refused, not followed
    except FileNotFoundError:
        return ""
    except OSError as exc:
        return f"cannot be read ({exc.strerror or exc})"
    if not stat.S_ISDIR(st.st_mode):
        return "is not a directory"
    if st.st_uid != os.getuid():
        return f"belongs to uid {st.st_uid}"
    if st.st_mode & 0o077:
        return f"can be entered by others (mode {stat.S_IMODE(st.st_mode):o})"
    return ""


def _fallback(default: Path, why: str) -> Path:
    """Our private directory beside the default: the one made before (so ls and attach find
    the runs of a --detach), else a fresh one (random name: none can be made for us first)."""
    prefix = f"ddptop-{os.getuid()}."
    ours = sorted(p for p in TMP_ROOT.glob(prefix + "*") if not not_private(p))
    path = ours[0] if ours else Path(tempfile.mkdtemp(prefix=prefix, dir=TMP_ROOT))  # 0700
    _say_once(f"ddptop: {default} {why}: live runs are kept in {path} instead "
              f"(set {LIVE_ENV} to choose the directory)")
    return path


@functools.cache
def _say_once(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def ensure_live_dir(path: Path | None = None) -> Path:
    """Create the live directory (0700) or check an existing one. Refuses a
    directory someone else owns or can enter: its socket and tokens give full
    control of a run."""
    path = Path(path or live_dir())
    try:
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
        st = path.lstat()  # lstat: a planted symlink is refused, not followed
    except OSError as exc:
        raise LiveDirError(f"cannot use live directory {path} ({exc.strerror or exc})") from None
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o077:
        raise LiveDirError(f"live directory {path} must be a directory owned by uid {os.getuid()} "
                           f"with mode 0700 (found mode {stat.S_IMODE(st.st_mode):o}, uid {st.st_uid})")
    return path


def new_socket_path(live: Path) -> Path:
    """A short socket name (the run id would make paths too long under deep dirs)."""
    path = live / f"{secrets.token_hex(4)}.sock"
    if len(os.fsencode(path)) > SOCKET_PATH_MAX:
        raise LiveDirError(f"live directory path {live} is too long for a Unix socket "
                           f"(set {LIVE_ENV} to a shorter directory)")
    return path


# --- registry ------------------------------------------------------------------------


@dataclass(frozen=True)
class LiveRun:
    """One registry entry: a supervisor and the run it holds."""

    run_id: str
    pid: int
    socket: str
    token: str
    run_dir: str
    runs_dir: str
    preset: str
    world_size: int
    detached: bool
    started_at: float
    status: str = "starting"
    step: int = -1
    steps_per_s: float | None = None
    updated_at: float = 0.0
    viewers: int = 0
    config: dict[str, Any] = field(default_factory=dict)
    user_cmd: list[str] | None = None

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> LiveRun:
        names = cls.__dataclass_fields__
        return cls(**{k: v for k, v in data.items() if k in names})

    def to_dict(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self.__dataclass_fields__}

    def public(self) -> dict[str, Any]:
        """What `ddptop ls --json` prints: everything but the token."""
        out = self.to_dict()
        del out["token"]
        return out


def entry_path(live: Path, run_id: str) -> Path:
    return live / f"{run_id}.json"


def write_entry(live: Path, entry: LiveRun) -> None:
    """Atomically (re)write a registry entry, 0600 from the first byte: it holds the token."""
    path = entry_path(live, entry.run_id)
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(entry.to_dict(), f)
    os.replace(tmp, path)


def remove_entry(live: Path, run_id: str, socket_path: str = "") -> None:
    """Remove what a supervisor made: its entry and its socket, both inside `live`, never
    a path an entry merely names."""
    paths = [entry_path(live, run_id)] if valid_run_id(run_id) else []
    if socket_path and socket_inside(live, socket_path):
        paths.append(Path(socket_path))
    for path in paths:
        try:
            kind = path.lstat().st_mode
            if stat.S_ISREG(kind) or stat.S_ISSOCK(kind):
                path.unlink()
        except OSError:
            pass


# --- registry entries are data: read without trusting them ---------------------------

ENTRY_MAX = 1 << 16  # bytes: an entry is a few hundred
_RUN_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
_FIELD_TYPES: dict[str, tuple[type, ...]] = {
    "run_id": (str,), "pid": (int,), "socket": (str,), "token": (str,), "run_dir": (str,),
    "runs_dir": (str,), "preset": (str,), "world_size": (int,), "detached": (bool,),
    "started_at": (int, float), "status": (str,), "step": (int,), "steps_per_s": (int, float, type(None)),
    "updated_at": (int, float), "viewers": (int,), "config": (dict,), "user_cmd": (list, type(None)),
}


def valid_run_id(run_id: object) -> bool:
    """A run id names files in the live directory: no separator, no `..`."""
    return isinstance(run_id, str) and _RUN_ID.fullmatch(run_id) is not None and ".." not in run_id


def socket_inside(live: Path, socket_path: str) -> bool:
    """`socket_path` is a socket name directly in the live directory (as supervisors make)."""
    path = Path(socket_path)
    return path.parent == Path(live) and path.suffix == ".sock" and ".." not in path.parts


def read_entry(path: Path) -> LiveRun | None:
    """The entry at `path`, or None for anything that is not one of ours: not a regular file
    (a FIFO would block a plain open, a link to /dev/zero never end), another uid's, too big,
    not JSON, fields of the wrong type, a run id that does not name this file, a socket
    outside the live directory."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.getuid() or st.st_size > ENTRY_MAX:
            return None
        data = os.read(fd, ENTRY_MAX + 1)
    except OSError:
        return None
    finally:
        os.close(fd)
    try:
        raw = json.loads(data) if len(data) <= ENTRY_MAX else None
    except (ValueError, RecursionError):
        return None
    if not isinstance(raw, dict) or any(k in raw and type(raw[k]) not in types for k, types in _FIELD_TYPES.items()):
        return None
    try:
        entry = LiveRun.from_dict(raw)
    except TypeError:  # a field missing
        return None
    ok = (valid_run_id(entry.run_id) and path.name == f"{entry.run_id}.json" and entry.pid > 1
          and (not entry.socket or socket_inside(path.parent, entry.socket)))
    return entry if ok else None


def supervisor_alive(pid: int) -> bool:
    """`pid` is a running ddptop supervisor (not a reused pid, not a zombie)."""
    try:
        proc = psutil.Process(pid)
        return proc.status() != psutil.STATUS_ZOMBIE and SUPERVISOR_MODULE in " ".join(proc.cmdline())
    except psutil.Error:
        return False


def live_runs(live: Path | None = None, clean: bool = True) -> list[LiveRun]:
    """Registry entries whose supervisor is alive, oldest first. Entries of dead
    supervisors (killed with SIGKILL, a crashed node) are removed when `clean`."""
    live = Path(live or live_dir())
    if not live.is_dir():
        return []
    runs = []
    for path in sorted(live.glob("*.json")):
        entry = read_entry(path)
        if entry is None:
            continue  # not an entry of ours: not ours to judge or delete
        if supervisor_alive(entry.pid):
            runs.append(entry)
        elif clean:
            remove_entry(live, entry.run_id, entry.socket)
    return sorted(runs, key=lambda e: e.started_at)


def find_run(run_id: str | None, live: Path | None = None) -> LiveRun:
    """The live run named `run_id` (or by a unique prefix); without one, the
    latest. LookupError with a one-line reason."""
    runs = live_runs(live)
    if not runs:
        raise LookupError("no live ddptop run on this machine (start one with `ddptop ... --detach`)")
    if run_id is None:
        return runs[-1]
    exact = [e for e in runs if e.run_id == run_id]
    matches = exact or [e for e in runs if e.run_id.startswith(run_id)]
    if len(matches) == 1:
        return matches[0]
    if not matches:
        raise LookupError(f"no live run {run_id!r} (see `ddptop ls`)")
    raise LookupError(f"{run_id!r} matches {len(matches)} live runs: give more of the id")


# --- starting a supervisor -----------------------------------------------------------


def start_supervisor(spec: dict[str, Any], live: Path) -> subprocess.Popen[bytes]:
    """Start `python -m ddptop.remote.supervisor SPEC` in its own session (a closed
    terminal never signals it), stdin from /dev/null, output to a log file.
    Returns at once; `wait_ready` says when it can take viewers."""
    log = live / f"{spec['run_id']}.log"
    env = dict(os.environ)
    env[LIVE_ENV] = str(live)
    path = env.get("PYTHONPATH", "")
    env.setdefault(protocol.ENV_USER_PYTHONPATH, path)  # the ranks get the user's own, not this one
    env["PYTHONPATH"] = str(PACKAGE_ROOT) + (os.pathsep + path if path else "")
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        return subprocess.Popen(
            [sys.executable, "-m", SUPERVISOR_MODULE, json.dumps(spec)],
            stdin=subprocess.DEVNULL, stdout=fd, stderr=fd, env=env, start_new_session=True,
            close_fds=True,
        )
    finally:
        os.close(fd)


def poll_ready(proc: subprocess.Popen[bytes], live: Path, run_id: str) -> LiveRun | str | None:
    """One look: the registry entry once the supervisor listens, a one-line
    reason if it exited first, or None while it is still starting."""
    entry = read_entry(entry_path(live, run_id))
    if entry is not None and entry.pid == proc.pid:
        return entry
    if proc.poll() is not None:
        return f"the supervisor exited with code {proc.returncode} before the run started: " \
               + early_log_tail(live, run_id)
    return None


def wait_ready(proc: subprocess.Popen[bytes], live: Path, run_id: str, timeout: float = 30.0) -> LiveRun:
    """Block until the supervisor takes viewers; RuntimeError (one line) if it
    exits first or takes longer than `timeout` (then it is killed)."""
    deadline = time.monotonic() + timeout
    while True:
        got = poll_ready(proc, live, run_id)
        if isinstance(got, LiveRun):
            return got
        if isinstance(got, str):
            raise RuntimeError(got)
        if time.monotonic() > deadline:
            proc.kill()
            proc.wait()
            raise RuntimeError(f"the supervisor did not start within {timeout:.0f}s: "
                               + early_log_tail(live, run_id))
        time.sleep(0.05)


def early_log_tail(live: Path, run_id: str) -> str:
    """The last line of what a supervisor said before its run directory existed."""
    try:
        lines = (live / f"{run_id}.log").read_text(errors="replace").strip().splitlines()
    except OSError:
        return "(no output)"
    return lines[-1] if lines else "(no output)"


def supervisor_spec(config: RunConfig, runs_dir: Path, run_id: str, live: Path, detached: bool,
                    user_cmd: list[str] | None = None, capture: CaptureOptions | None = None) -> dict[str, Any]:
    """Everything a supervisor needs to run, as JSON-able data (its one argument)."""
    capture = capture or CaptureOptions()
    return {
        "run_id": run_id, "runs_dir": str(Path(runs_dir).resolve()), "config": config.to_dict(),
        "user_cmd": user_cmd, "live_dir": str(live), "detached": detached,
        "capture": {"windows": [list(w) for w in capture.windows], "profiler": capture.profiler,
                    "nsys": capture.nsys},
    }
