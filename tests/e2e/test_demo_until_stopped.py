"""Issue 46 point 9: the demo in a terminal (the TUI, no --steps) trains until stopped: it was
`[finished]` in ~10 s, before a newcomer had found a key. `--steps` still bounds it, and
headless (CI, scripts, no terminal) keeps its default."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from waiting import wait_until as until

from ddptop import cli


def config_for(argv: list[str], tty: bool, monkeypatch: pytest.MonkeyPatch):  # noqa: ANN201
    monkeypatch.setattr(sys.stdout, "isatty", lambda: tty, raising=False)
    return cli.build_config(cli.run_parser().parse_args(argv))


def test_a_terminals_demo_runs_until_stopped_unless_steps_bound_it(monkeypatch: pytest.MonkeyPatch) -> None:
    assert config_for(["--nproc", "2"], True, monkeypatch).until_stopped
    assert not config_for(["--nproc", "2", "--steps", "50"], True, monkeypatch).until_stopped
    assert not config_for(["--nproc", "2", "--headless"], True, monkeypatch).until_stopped
    headless = config_for(["--nproc", "2"], False, monkeypatch)  # no terminal: headless, its default
    assert not headless.until_stopped and headless.steps == 200


@pytest.mark.e2e
def test_a_run_until_stopped_goes_past_its_steps_and_stops_cleanly(tmp_path: Path) -> None:
    cmd = [sys.executable, "-m", "ddptop", "--headless", "--json", "--runs-dir", str(tmp_path), "--nproc", "2",
           "--steps", "3", "--warmup", "1", "--interval", "0.5", "--set", "until_stopped=true", "--set", "workers=0"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    out: list[str] = []
    threading.Thread(target=lambda: out.extend(proc.stdout), daemon=True).start()
    try:
        until(lambda: any(" step 1" in line and "running" in line and
                          int(line.split(" step ")[1].split()[0].split("/")[0]) >= 12 for line in out),
              120, "the run past step 12 (its --steps was 3)")
        proc.send_signal(signal.SIGINT)  # as a user's Ctrl-C
        proc.wait(60)
    finally:
        if proc.poll() is None:
            proc.kill()
    summary = json.loads(out[-1])
    assert summary["status"] == "stopped" and min(r["steps"] for r in summary["ranks"]) >= 12, "".join(out[-20:])
    assert proc.returncode == 130
