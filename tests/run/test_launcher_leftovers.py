"""What a ddptop killed outright (with its keeper) leaves in /tmp: its hub's socket
directory. The next ddptop removes only what is surely stale (issue 17)."""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path

from ddptop.run.launcher import STALE_AFTER_S, remove_stale_socket_dirs


def make(tmp: Path, name: str, files: tuple[str, ...] = (), age_s: float = 2 * STALE_AFTER_S) -> Path:
    d = tmp / name
    d.mkdir(mode=0o700)
    for f in files:
        (d / f).write_text("")
    then = time.time() - age_s
    os.utime(d, (then, then))
    return d


def test_only_old_unbound_socket_dirs_of_mkdtemps_shape_are_removed(tmp_path: Path) -> None:
    stale = make(tmp_path, "ddptop-ab_c12x9", ("hub.sock",))  # a socket file nobody listens on
    empty = make(tmp_path, "ddptop-0k1l2m3n")  # killed before it bound
    young = make(tmp_path, "ddptop-youngone", ("hub.sock",), age_s=1)  # may be starting now
    live_dir = make(tmp_path, f"ddptop-{os.getuid()}")  # the registry of live runs: other shape
    other = make(tmp_path, "ddptop-shared-x1")  # not mkdtemp's
    foreign = make(tmp_path, "ddptop-zzzzzzzz", ("notes.txt",))  # holds something else
    listening = make(tmp_path, "ddptop-listens1")
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(listening / "hub.sock"))
    server.listen()
    then = time.time() - 2 * STALE_AFTER_S
    os.utime(listening, (then, then))
    try:
        removed = remove_stale_socket_dirs(tmp_path)
    finally:
        server.close()
    assert sorted(removed) == sorted([stale, empty])
    assert not stale.exists() and not empty.exists()
    assert all(d.exists() for d in (young, live_dir, other, foreign, listening))


def test_an_unreadable_tmp_is_no_error(tmp_path: Path) -> None:
    assert remove_stale_socket_dirs(tmp_path / "missing") == []
