"""The run directory: everything a run produced, written as it arrives so that a
crash leaves a readable record.

    <runs-dir>/<run-id>/config.json   the RunConfig (+ launch facts)
                        steps.jsonl   one line per rank-step
                        torchrun.log  the launcher's own output
                        logs/         each rank's stdout/stderr (torchrun --log-dir)
                        nccl/         NCCL_DEBUG_FILE per process
                        stacks/       rank stacks and NCCL flight-recorder dumps on a stall
                        summary.json  at the end
"""

from __future__ import annotations

import contextlib
import json
import os
import resource
import stat
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO, Any

LOW_SPACE_BYTES = 256 << 10  # less free than this: stop the run while its records and summary still fit


def new_run_dir(runs_dir: Path, run_id: str) -> Path:
    """Create the run's directory (raises OSError if it cannot be written)."""
    run_dir = runs_dir / run_id
    # private: the records hold the user's command line, hostnames, pids and logs; share a run
    # on purpose (chmod) rather than by default
    run_dir.mkdir(parents=True, exist_ok=False, mode=0o700)
    (run_dir / "nccl").mkdir()
    (run_dir / "logs").mkdir()
    (run_dir / "stacks").mkdir()
    return run_dir


def check_writable(runs_dir: Path) -> str | None:
    """None if runs can be recorded under `runs_dir` (creating it), else why not."""
    try:
        runs_dir.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=runs_dir):
            pass
    except OSError as exc:
        return f"runs directory {runs_dir} is not writable ({exc.strerror or exc})"
    return None


def write_json(path: Path, data: Any) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    try:
        tmp.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
        tmp.replace(path)
    except OSError:
        tmp.unlink(missing_ok=True)  # never a half-written file next to the last good one
        raise


def disk_error(path: Path, exc: OSError) -> str:
    """One line naming what went wrong with the run's disk, and how much room is left."""
    import errno
    import shutil

    try:
        free_mb = f"{shutil.disk_usage(path).free / 2**20:.1f} MB free"
    except OSError:
        free_mb = ""
    free = f" ({free_mb})" if free_mb else ""
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return f"no space left on {path}{free}"
    if exc.errno == errno.EFBIG:
        # `ulimit -f` (Python ignores SIGXFSZ, so the write fails): no room for a larger file
        limit = resource.getrlimit(resource.RLIMIT_FSIZE)[0]
        cap = "the file size limit" if limit == resource.RLIM_INFINITY else f"{limit / 2**20:.1f} MB"
        return f"no space left on {path} (a file may not exceed {cap}: ulimit -f" + (
            f"; {free_mb} on the disk)" if free_mb else ")")
    return f"cannot write the run's records in {path}: {exc.strerror or exc}{free}"


def low_space(path: Path) -> str:
    """"no space left on PATH (N MB free)" when the disk under `path` has less than
    LOW_SPACE_BYTES left for this user, else "" (also when it cannot tell: a file system
    that reports no size at all)."""
    import shutil

    try:
        usage = shutil.disk_usage(path)
    except OSError:
        return ""
    if usage.total <= 0 or usage.free >= LOW_SPACE_BYTES:
        return ""
    return f"no space left on {path} ({usage.free / 2**20:.1f} MB free)"


# one encoder for every record: ~2x faster than json.dumps per call on the hub's hot path
_ENCODE = json.JSONEncoder(separators=(",", ":"), check_circular=False).encode


def runs_dir_warning(runs_dir: Path) -> str:
    """'' unless other users may rename or replace what is in `runs_dir` (writable by them,
    without the sticky bit /tmp has): then one line saying so."""
    try:
        st = os.stat(runs_dir)
    except OSError:
        return ""
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH) and not st.st_mode & stat.S_ISVTX:
        return (f"runs directory {runs_dir} is writable by others (mode {stat.S_IMODE(st.st_mode):o}, no "
                "sticky bit): they can move a run's directory aside; ddptop stops a run if they do")
    return ""


_NEW = os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC


class Recorder:
    """Writes through a descriptor of the run directory held from the start: a rename of
    the directory, or a symlink put in its place, cannot redirect a write, and `check`
    notices it (the run stops and says so)."""

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = run_dir
        self._dir = os.open(run_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        st = os.fstat(self._dir)
        self._identity = (st.st_dev, st.st_ino)
        fd = os.open("steps.jsonl", _NEW | os.O_APPEND, 0o600, dir_fd=self._dir)
        self._steps: IO[bytes] = open(fd, "ab", buffering=0)
        self._good = self._steps.tell()  # steps.jsonl ends on a whole line up to here
        self.records_written = 0
        self.error = ""  # set once a write failed (a full disk): the run must stop

    def write_config(self, config: dict[str, Any], **facts: Any) -> None:
        self._write_json("config.json", {**config, "_launch": facts})

    def _write_json(self, name: str, data: Any) -> None:
        """`write_json` inside the held directory (whatever path it has now)."""
        tmp = name + ".tmp"
        try:
            with open(os.open(tmp, _NEW | os.O_TRUNC, 0o600, dir_fd=self._dir), "w") as f:
                f.write(json.dumps(data, indent=2, sort_keys=True) + "\n")
            os.replace(tmp, name, src_dir_fd=self._dir, dst_dir_fd=self._dir)
        except OSError:
            with contextlib.suppress(OSError):
                os.unlink(tmp, dir_fd=self._dir)
            raise

    def record_steps(self, rank: int, records: list[dict[str, float]],
                     spans: dict[int, tuple[tuple[float, float], ...]] | None = None) -> None:
        """Append whole lines (a record whose step has bucket `spans` keeps them as
        `comm_spans`); a failed write is cut back to the last whole line and remembered in
        `error` (what follows is not written)."""
        if self.error:
            return
        head = f'{{"rank":{int(rank)},'
        lines: Sequence[Mapping[str, Any]] = records
        if spans:
            lines = [{**rec, "comm_spans": spans[step]} if (step := int(rec["step"])) in spans else rec
                     for rec in records]
        data = ("\n".join(head + _ENCODE(rec)[1:] for rec in lines) + "\n").encode()
        try:
            view = memoryview(data)
            while view:
                view = view[self._steps.write(view):]
        except OSError as exc:
            self.error = disk_error(self.run_dir, exc)
            try:
                self._steps.truncate(self._good)
            except OSError:
                pass
            return
        self._good += len(data)
        self.records_written += len(records)

    def check(self) -> str:
        """Notices the run's directory removed under it (steps.jsonl unlinked, or the
        directory gone): what is written from then on would be lost, so it is a records
        error like a full disk; and a disk about full (less than LOW_SPACE_BYTES free), even
        before a write of ours fails: the script's own output may be what fills it, and the
        summary should still fit. Returns `error`."""
        if not self.error:
            try:
                gone = os.fstat(self._steps.fileno()).st_nlink == 0 or not self.run_dir.is_dir()
            except ValueError:  # closed: nothing more is written
                return self.error
            except OSError:
                gone = True
            if gone:
                self.error = f"the run's directory {self.run_dir} was removed: its records cannot be kept"
            elif self._replaced():
                self.error = (f"the run's directory {self.run_dir} was moved aside or replaced (a link or "
                              "another directory in its place): stopping; nothing was written through it")
            else:
                self.error = low_space(self.run_dir)
        return self.error

    def reading_dir(self) -> Path:
        """Where to read the run's own files (its logs) from: the directory this recorder
        holds, by its descriptor (/proc/self/fd/N), so that a link put in its place by whoever
        may write the runs dir is never read through; the path once closed or without /proc."""
        if self._dir >= 0 and os.path.isdir(f"/proc/self/fd/{self._dir}"):
            return Path(f"/proc/self/fd/{self._dir}")
        return self.run_dir

    def _replaced(self) -> bool:
        try:
            st = os.stat(self.run_dir, follow_symlinks=False)
        except OSError:
            return True
        return (st.st_dev, st.st_ino) != self._identity

    def write_summary(self, summary: dict[str, Any]) -> str:
        """Write summary.json; returns why it could not be written ("" when it was)."""
        try:
            self._write_json("summary.json", summary)
        except OSError as exc:
            return disk_error(self.run_dir, exc)
        return ""

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self._steps.close()
        if self._dir >= 0:  # once: a second close would close whatever reused the number
            with contextlib.suppress(OSError):
                os.close(self._dir)
            self._dir = -1


def read_summary(run_dir: Path) -> dict[str, Any] | None:
    try:
        return json.loads((run_dir / "summary.json").read_text())
    except (OSError, ValueError):
        return None
