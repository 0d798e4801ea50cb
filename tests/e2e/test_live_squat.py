"""Another user squats the default live directory (issue 33.4): with no XDG_RUNTIME_DIR,
`mkdir -m700 /tmp/ddptop-<victim's uid>` by another uid must not lock the victim out. The
victim's ddptop says in one line where its live runs go instead (naming DDPTOP_LIVE_DIR),
runs detached there, and `ls` and attach find the run. /tmp itself is left alone: the
default's parent is a directory of this test."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import psutil
import pytest

from ddptop.remote import live as live_module
from ddptop.remote.viewer import RemoteSession

OTHER_UID = 1001
SLEEPER = "import time\nwhile True:\n    time.sleep(0.1)\n"
# The CLI, with the default live directory's parent moved to the test's own directory.
CLI = ("import sys; from pathlib import Path; import ddptop.remote.live as live; "
       "live.TMP_ROOT = Path(sys.argv[1]); from ddptop.cli import main; sys.exit(main(sys.argv[2:]))")


def ddptop(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in (live_module.LIVE_ENV, "XDG_RUNTIME_DIR")}
    return subprocess.run([sys.executable, "-c", CLI, str(root), *args], capture_output=True, text=True,
                          env=env, timeout=60)


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root, to make a directory another uid owns (os.chown)")
@pytest.mark.e2e
def test_a_squatted_default_live_dir_falls_back_to_a_private_one_that_ls_and_attach_find(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = Path(tempfile.mkdtemp(prefix="dq", dir="/tmp"))  # short: socket paths are limited
    squat = root / f"ddptop-{os.getuid()}"
    squat.mkdir(mode=0o700)
    os.chown(squat, OTHER_UID, OTHER_UID)  # another user got there first
    script = tmp_path / "sleeper.py"
    script.write_text(SLEEPER)
    try:
        res = ddptop(root, "--detach", "--nproc", "1", "--runs-dir", str(tmp_path / "runs"), "--",
                     sys.executable, str(script))
        assert res.returncode == 0, res.stdout + res.stderr
        notes = [line for line in res.stderr.splitlines() if "live runs are kept in" in line]
        assert len(notes) == 1 and "Traceback" not in res.stderr, res.stderr
        fallback = Path(notes[0].split("live runs are kept in ")[1].split(" ")[0])
        assert notes[0] == (f"ddptop: {squat} belongs to uid {OTHER_UID}: live runs are kept in {fallback} "
                            "instead (set DDPTOP_LIVE_DIR to choose the directory)")
        assert fallback.parent == root and fallback.stat().st_uid == os.getuid()
        assert fallback.stat().st_mode & 0o777 == 0o700 and list(squat.iterdir()) == []

        listed = ddptop(root, "ls", "--json")  # a later process finds the same directory
        assert listed.returncode == 0, listed.stderr
        runs = json.loads(listed.stdout)
        assert len(runs) == 1 and Path(runs[0]["socket"]).parent == fallback
        assert listed.stderr.count("live runs are kept in") == 1

        # attach: as `ddptop attach` finds it (the default, passed over), then stop it from there
        monkeypatch.setattr(live_module, "TMP_ROOT", root)
        monkeypatch.delenv(live_module.LIVE_ENV, raising=False)
        monkeypatch.delenv("XDG_RUNTIME_DIR", raising=False)
        entry = live_module.find_run(runs[0]["run_id"])

        async def stop() -> str:
            session = RemoteSession.attach(entry)
            runner = asyncio.create_task(session.run())
            session.request_stop("test")  # sent once connected
            return (await asyncio.wait_for(runner, 40)).status

        assert asyncio.run(stop()) == "stopped"
    finally:
        for fallback_dir in root.glob(f"ddptop-{os.getuid()}.*"):
            for left in live_module.live_runs(fallback_dir, clean=False):  # a failed test's run
                with contextlib.suppress(psutil.Error):
                    psutil.Process(left.pid).terminate()
        shutil.rmtree(root, ignore_errors=True)
