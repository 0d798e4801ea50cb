"""`ddptop cost -- CMD` end to end on gloo: real torchrun runs in both arms, the stamp and
ddptop's own sitecustomize chained with a user's own (each runs once per rank, in both arms),
the ranks' stderr compared with plain torchrun's, cost.json written, bad input refused."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"

USER_SITE = '''
import os
marks = os.environ.get("USER_SITE_MARKS")
if marks and os.environ.get("RANK") is not None:
    open(os.path.join(marks, str(os.getpid())), "a").close()
'''


@pytest.mark.e2e
def test_cost_runs_both_arms_alike_and_compares_stderr(tmp_path: Path) -> None:
    site = tmp_path / "usersite"
    site.mkdir()
    (site / "sitecustomize.py").write_text(USER_SITE)
    marks = tmp_path / "marks"
    marks.mkdir()
    env = {**os.environ, "PYTHONPATH": str(site), "USER_SITE_MARKS": str(marks)}
    cmd = [sys.executable, "-m", "ddptop", "cost", "--pairs", "2", "--nproc", "2", "--runs-dir", str(tmp_path / "runs"),
           "--json", "--", sys.executable, str(SCRIPTS / "plain_ddp.py"), "--steps", "70"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=240, env=env)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    data = json.loads(out.stdout.strip().splitlines()[-1])
    assert data["plain"]["measured"] == 2 and data["ddptop"]["measured"] == 2
    assert data["result"]["pairs_used"] == 2 and data["result"]["ratio"]["n"] == 2
    assert data["stderr_added"] == []  # nothing of ddptop's (or the stamp's) in the ranks' stderr
    # gloo's default keeps DDP's C++ all-reduce (gloo_timing off): nothing counts the all-reduces,
    # and the bill says so rather than guess
    assert data["bill"] is not None and data["bill"]["allreduces"] is None
    # the hooks run: the ddptop arm once more with --cost, on the script's steps less 20; its figure
    # is the bill's hooks part
    assert data["hooks"]["steps"] == 50 and data["bill"]["hooks_measured"] is (data["hooks"]["us"] is not None)
    assert data["hooks"]["us"] is not None or data["hooks"]["why"], data["hooks"]
    assert "the rank-side hooks on this script" in out.stdout
    assert len(list(marks.iterdir())) == 10  # the user's own sitecustomize: once per rank, 2 ranks x 5 runs
    where = Path(data["dir"])
    assert json.loads((where / "cost.json").read_text())["pairs"] == 2
    for run in ("00-plain", "00-ddptop", "01-ddptop", "01-plain"):
        stamps = [json.loads(p.read_text())["stamps"] for p in (where / run).glob("stamp.rank*.json")]
        assert len(stamps) == 2 and all(len(s) == 70 for s in stamps), run  # every optimizer step, once
    summary = json.loads((next((where / "00-ddptop" / "runs").glob("*/summary.json"))).read_text())
    assert summary["ranks"] and all(r["steps"] > 0 for r in summary["ranks"])  # ddptop measured, chained
    assert "ddptop cost of" in out.stdout and "stderr: the ranks' stderr under ddptop holds no line" in out.stdout


@pytest.mark.parametrize("args", [["--pairs", "1", "--", "x"], ["--cpus", "0-1", "--nproc", "2", "--", "x"], [],
                                  ["--preset", "nope"], ["--timeout", "0", "--", "x"], ["--pin-main", "--", "x"]])
def test_bad_input_is_one_line_and_exit_2(tmp_path: Path, args: list[str]) -> None:
    out = subprocess.run([sys.executable, "-m", "ddptop", "cost", "--runs-dir", str(tmp_path / "r"), *args],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and out.stderr.count("\n") == 1 and out.stderr.startswith("ddptop: error:")
    assert not (tmp_path / "r").exists() or not any((tmp_path / "r").iterdir())  # nothing half-started


def _ours(marker: str) -> list[int]:
    import psutil

    found = []
    for p in psutil.process_iter(["pid", "cmdline"]):
        try:
            if any(marker in part for part in p.info["cmdline"] or []):
                found.append(p.info["pid"])
        except psutil.Error:
            continue
    return found


@pytest.mark.e2e
@pytest.mark.parametrize("sig", ["SIGTERM", "SIGKILL"])
def test_a_killed_cost_run_leaves_nothing_running(tmp_path: Path, sig: str) -> None:
    """SIGTERM: the run in hand is stopped as torchrun would, what was measured is printed, exit
    130. SIGKILL: the run's torchrun gets SIGTERM from the kernel (its parent died) and ends."""
    import signal
    import time

    runs = tmp_path / "runs"
    cmd = [sys.executable, "-m", "ddptop", "cost", "--pairs", "2", "--nproc", "2", "--runs-dir", str(runs), "--",
           sys.executable, str(SCRIPTS / "endless_ddp.py")]
    import psutil

    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)

    def run_tree() -> list[psutil.Process]:
        """This cost run's torchrun and ranks (another test's endless_ddp.py is not ours)."""
        try:
            kids = psutil.Process(proc.pid).children(recursive=True)
        except psutil.Error:
            return []
        return [p for p in kids if str(SCRIPTS / "endless_ddp.py") in " ".join(p.cmdline())]

    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and len(run_tree()) < 3:
        time.sleep(0.5)  # torchrun and its two ranks are up
    tree = run_tree()
    assert len(tree) >= 3
    proc.send_signal(getattr(signal, sig))
    out, _ = proc.communicate(timeout=60)
    if sig == "SIGTERM":
        assert proc.returncode == 130 and "interrupted; what was measured so far" in out, out[-2000:]
    gone, alive = psutil.wait_procs(tree, timeout=40)
    assert alive == [] and _ours(str(runs)) == [], alive
