"""Issue 49, case 7: a script's flags never reach torchrun's parser (`--nproc 99 --log x`), and a
launcher's own usage error is named as such; a capture the run ended before it was written ends
failed, never `recording` in the final summary; ranks run under `python -I`/`-E` (which ignore
PYTHONPATH, the way ddptop enters a rank) get a note saying so; Ctrl-C before ddptop's own
handlers exits 130 without a traceback."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from ddptop.model.config import RunConfig
from ddptop.model.failures import launcher_usage_error
from ddptop.model.options import CaptureOptions, python_ignores_pythonpath
from ddptop.model.state import RunState
from ddptop.run.capture_pipeline import CapturePipeline
from ddptop.run.launcher import build_plan

ECHO = "import sys\nprint('ARGS', sys.argv[1:], flush=True)\n"


def test_the_users_command_comes_after_torchruns_end_of_options(tmp_path: Path) -> None:
    cmd = [sys.executable, "train.py", "--nproc", "99", "--log", "x"]
    plan = build_plan(RunConfig(nproc=1), tmp_path, "unix:/x", "t", "r", user_cmd=cmd, base_env={})
    at = plan.argv.index("--no-python")
    assert plan.argv[at + 1:] == ["--", *cmd]


@pytest.mark.e2e
def test_a_scripts_flags_that_look_like_torchruns_reach_the_script(tmp_path: Path) -> None:
    script = tmp_path / "echo.py"
    script.write_text(ECHO)
    done = subprocess.run([sys.executable, "-m", "ddptop", "--headless", "--json", "--runs-dir", str(tmp_path / "runs"),
                           "--nproc", "1", "--", sys.executable, str(script), "--nproc", "99", "--log", "x"],
                          capture_output=True, text=True, timeout=120)
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    assert summary["status"] == "completed", summary["error"]  # was: rank 0 failed before connecting
    logs = "".join(p.read_text() for p in (tmp_path / "runs").glob("*/logs/*/attempt_0/0/stdout.log"))
    assert "ARGS ['--nproc', '99', '--log', 'x']" in logs


def test_torchruns_own_usage_error_is_named_as_the_launchers() -> None:
    log = ["usage: run.py [-h] [--nnodes NNODES] [--nproc-per-node NPROC_PER_NODE]",
           "              training_script ...",
           "run.py: error: ambiguous option: --nproc could match --nproc-per-node, --nproc_per_node"]
    assert launcher_usage_error(log) == "ambiguous option: --nproc could match --nproc-per-node, --nproc_per_node"
    assert launcher_usage_error(["train.py: error: the script's own argparse"]) == ""


def test_a_capture_the_run_ended_before_is_failed_not_recording(tmp_path: Path) -> None:
    state = RunState("r", RunConfig(), world_size=2)
    pipeline = CapturePipeline(state, CaptureOptions(), tmp_path)
    cap, _ = pipeline.schedule(3, start=10)
    cap.status, cap.ranks = "recording", {0: "written", 1: "recording"}
    pipeline.settle()  # SIGUSR1 asked for it, SIGTERM ended the run before it was written
    assert cap.status == "failed"
    assert cap.error == "the run ended before steps 10-12 were recorded (1/2 rank(s) wrote theirs)"


@pytest.mark.parametrize("cmd, said", [
    (["python", "-I", "train.py"], True), (["/usr/bin/python3", "-E", "train.py"], True),
    (["python3.11", "-uI", "train.py"], True), (["python", "-W", "ignore", "-E", "x.py"], True),
    (["python", "train.py", "-I"], False), (["python", "-c", "-I"], False), (["torchrun", "-I"], False),
    (["python", "-Wignore", "x.py", "-E"], False), (["python", "-m", "pkg", "-E"], False),
])
def test_python_that_ignores_pythonpath_is_named(cmd: list[str], said: bool) -> None:
    assert bool(python_ignores_pythonpath(cmd)) == said


@pytest.mark.e2e
def test_ranks_under_python_I_say_why_nothing_was_measured(tmp_path: Path) -> None:
    script = tmp_path / "echo.py"
    script.write_text(ECHO)
    done = subprocess.run([sys.executable, "-m", "ddptop", "--headless", "--json", "--runs-dir", str(tmp_path / "runs"),
                           "--nproc", "1", "--", sys.executable, "-I", str(script)],
                          capture_output=True, text=True, timeout=120)
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    assert any("ignores PYTHONPATH" in note for note in summary["notes"]), summary["notes"]


def test_ctrl_c_before_ddptops_handlers_exits_130_without_a_traceback(monkeypatch: pytest.MonkeyPatch) -> None:
    import ddptop.__main__ as entry_point
    import ddptop.cli

    def interrupted() -> int:
        raise KeyboardInterrupt

    monkeypatch.setattr(ddptop.cli, "main", interrupted)
    assert entry_point.entry() == 130
