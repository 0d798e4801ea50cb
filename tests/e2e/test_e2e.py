"""Real runs: ddptop launches torchrun, 2 gloo ranks on the CPU, through the real socket."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

pytestmark = pytest.mark.e2e
HERE = Path(__file__).resolve().parents[1]


def run_ddptop(args, runs_dir, timeout=240, cwd=None):
    cmd = [sys.executable, "-m", "ddptop", "--headless", "--runs-dir", str(runs_dir), *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=cwd)


def only_run_dir(runs_dir: Path) -> Path:
    dirs = [d for d in runs_dir.iterdir() if d.is_dir()]
    assert len(dirs) == 1, dirs
    return dirs[0]


def test_bf16_run_end_to_end(tmp_path):
    res = run_ddptop(["--nproc", "2", "--preset", "bf16", "--steps", "30", "--json"], tmp_path)
    assert res.returncode == 0, res.stdout + res.stderr
    summary = json.loads(res.stdout.strip().splitlines()[-1])
    assert summary["status"] == "completed" and summary["world_size"] == 2
    assert summary["backend"] == "gloo" and summary["config"]["comm_hook"] == "bf16"
    assert summary["steps_per_s"] > 0 and summary["step_ms_p50"] > 0
    assert [r["steps"] for r in summary["ranks"]] == [30, 30]
    for r in summary["ranks"]:
        assert all(v > 0 for v in r["phases_ms"].values()), r
        assert r["pid"] and r["host"] and r["device"] == "cpu"
    run_dir = only_run_dir(tmp_path)
    lines = (run_dir / "steps.jsonl").read_text().splitlines()
    assert len(lines) == 60
    assert {(json.loads(x)["rank"], json.loads(x)["step"]) for x in lines} == {
        (r, s) for r in (0, 1) for s in range(30)
    }
    assert json.loads((run_dir / "summary.json").read_text())["run_id"] == summary["run_id"]
    assert json.loads((run_dir / "config.json").read_text())["preset"] == "bf16"
    logs = list((run_dir / "logs").glob("*/attempt_0/*/stdout.log"))
    assert len(logs) == 2 and all("[trainer] rank" in p.read_text() for p in logs)
    assert "status" not in res.stderr.lower() or res.stderr == ""


# Presets differ only in the DDP arguments and the comm hook the trainer registers; these
# cover each different path through the rank-side layer: no DDP, a stateless hook it wraps
# (bf16 runs in test_bf16_run_end_to_end), a stateful one (PowerSGD), autocast, static graph +
# bucket view + small buckets. Every preset's settings are checked in test_config.
@pytest.mark.parametrize("preset", ["single", "powersgd", "amp", "overlap"])
def test_presets_run_on_cpu(tmp_path, preset):
    res = run_ddptop(
        ["--nproc", "2", "--preset", preset, "--steps", "4", "--warmup", "1", "--set", "workers=0", "--json"],
        tmp_path,
    )
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    summary = json.loads(res.stdout.strip().splitlines()[-1])
    expected_world = 1 if preset == "single" else 2
    assert summary["world_size"] == expected_world
    assert [r["steps"] for r in summary["ranks"]] == [4] * expected_world
    assert summary["backend"] == ("none" if preset == "single" else "gloo")
    # steps were measured through torch.optim: no note may say they cannot be (single read the
    # loss module's lack of parameters as an update, issue 47)
    assert not [n for n in summary.get("notes") or [] if "torch.optim" in n], summary["notes"]


@pytest.mark.parametrize(
    "args, fragment",
    [
        (["--preset", "nosuch"], "valid: single, baseline"),
        (["--nproc", "0"], "nproc must be at least 1"),
        (["--set", "unknown=1"], "unknown setting 'unknown'"),
        (["--steps", "-5"], "steps must be at least 1"),
        (["--set", "bucket_cap_mb=lots"], "not a valid float"),
        (["--model", "resnet9000"], "model must be one of"),
        (["--bogus-flag"], "unrecognized arguments"),
        (["--nproc", "two"], "invalid int value"),
        (["--"], "nothing to run"),
        (["--set", "bucket_cap_mb=inf"], "finite number"),
        (["--set", "bucket_cap_mb=1e309"], "finite number"),
        (["--set", "delay_ms=1e400"], "finite number"),
        (["--set", "lr=inf"], "finite number"),
        (["--interval", "nan"], "--interval must be"),
        (["--interval", "0"], "--interval must be"),
        (["--steps", "20", "--capture", "30:2"], "past the run"),
        (["--capture", "ten"], "STEP:COUNT"),
        # found after the checks of the run itself: still before the runs dir is made
        (["--token", "abc"], "--token is for multi-node runs"),
        (["--nnodes", "2"], "needs --rdzv-endpoint"),
        (["--nnodes", "2", "--node-rank", "1", "--rdzv-endpoint", "127.0.0.1:29400"], "needs the run's --token"),
        (["--preset", "single", "--nnodes", "2", "--rdzv-endpoint", "127.0.0.1:29400"], "cannot span nodes"),
        (["--detach"], "--detach runs without a terminal"),
    ],
)
def test_bad_usage_exits_2_with_one_line_and_starts_nothing(tmp_path, args, fragment):
    runs = tmp_path / "runs"
    res = run_ddptop(args, runs, timeout=30, cwd=tmp_path)
    assert res.returncode == 2
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("ddptop: error:") and fragment in lines[0], res.stderr
    assert res.stdout == ""
    assert not runs.exists()  # not even `mkdir -p` of the runs dir (issue 17, item 10)
    assert list(tmp_path.iterdir()) == []  # nor anything else where it ran


@pytest.mark.parametrize("args, fragment", [
    (["presets", "extra"], "presets takes no arguments"),
    (["nccl", "--bogus", "x.log"], "unrecognized arguments"),
    (["nccl"], "LOGFILE"),
    (["nccl", "--max-mb", "0", "x.log"], "--max-mb must be above 0"),
    (["trace"], "error"),
    (["sweep", "--bogus"], "unrecognized arguments"),
    (["sweep", "--presets", "nosuch"], "unknown preset(s) nosuch"),
    (["tune", "--budget", "-1"], "--budget must be positive"),
    (["ls", "extra"], "unrecognized arguments"),
    (["attach", "a", "b"], "unrecognized arguments"),
])
def test_subcommand_usage_errors_are_one_line_exit_2(tmp_path, args, fragment):
    # in an empty directory, with the live-run registry there too: a usage error creates
    # nothing (no ddptop-runs/ where it ran, no live dir)
    env = {**os.environ, "DDPTOP_LIVE_DIR": str(tmp_path / "live")}
    res = subprocess.run([sys.executable, "-m", "ddptop", *args], capture_output=True, text=True, timeout=30,
                         cwd=tmp_path, env=env)
    lines = res.stderr.strip().splitlines()
    assert res.returncode == 2 and len(lines) == 1 and lines[0].startswith("ddptop") and "error:" in lines[0], res.stderr
    assert fragment in lines[0] and res.stdout == ""
    assert list(tmp_path.iterdir()) == []


def test_nccl_on_an_endless_file_reads_the_default_bound_and_says_so(tmp_path):
    """`ddptop nccl /dev/zero` with no --max-mb: it stops at the default bound (256 MB), says
    so, and holds one chunk at a time, not the file (peak RSS measured by a parent of its own)."""
    default_mb = 256  # the nccl command's MAX_FILE_BYTES, as its --help says
    measure = ("import resource, subprocess, sys;"
               "res = subprocess.run([sys.executable, '-m', 'ddptop', 'nccl', '/dev/zero'], capture_output=True, text=True);"
               "sys.stderr.write(res.stderr); sys.stdout.write(res.stdout);"
               "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss); sys.exit(res.returncode)")
    t0 = time.monotonic()
    res = subprocess.run([sys.executable, "-c", measure], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    took = time.monotonic() - t0
    peak_mb = int(res.stdout.strip().splitlines()[-1]) / 1024
    print(f"\nddptop nccl /dev/zero: {took:.1f}s, peak RSS {peak_mb:.0f} MB")
    assert res.returncode == 1, res.stderr  # read, nothing found: not a usage error, no traceback
    assert "Traceback" not in res.stderr and "MemoryError" not in res.stderr
    err = res.stderr.strip().splitlines()
    assert f"ddptop nccl: /dev/zero: read the first {default_mb} MB only (--max-mb)" in err, err
    assert "no NCCL_DEBUG lines found" in res.stdout + res.stderr
    assert peak_mb < default_mb / 2, peak_mb  # well under the bytes it read
    assert list(tmp_path.iterdir()) == []


def test_unwritable_runs_dir_is_a_usage_error(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    res = run_ddptop(["--steps", "3"], blocker, timeout=30)
    assert res.returncode == 2 and "not writable" in res.stderr


def test_users_own_script_through_probe(tmp_path):
    res = run_ddptop(["--nproc", "2", "--json", "--", sys.executable, str(HERE / "user_script.py")], tmp_path)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr
    summary = json.loads(res.stdout.strip().splitlines()[-1])
    assert [r["steps"] for r in summary["ranks"]] == [25, 25]
    assert summary["status"] == "completed"


def test_rank_failure_is_reported_and_exit_1(tmp_path):
    res = run_ddptop(
        ["--nproc", "2", "--steps", "40", "--warmup", "1", "--set", "fail_rank=1", "--set", "fail_step=8",
         "--set", "workers=0", "--json"],
        tmp_path,
    )
    assert res.returncode == 1, res.stdout[-2000:]
    summary = json.loads(res.stdout.strip().splitlines()[-1])
    assert summary["status"] == "failed" and summary["failed_rank"] == 1
    assert "injected failure" in summary["error"]
    steps = (only_run_dir(tmp_path) / "steps.jsonl").read_text().splitlines()
    assert len(steps) >= 8  # what arrived before the crash is kept


def test_a_crash_at_exit_after_every_step_keeps_the_run_completed_and_says_so(tmp_path):
    # gloo has aborted in teardown ("terminate called without an active exception") after a
    # rank's last step: the training is done, the crash is still reported
    res = run_ddptop(
        ["--nproc", "2", "--steps", "6", "--warmup", "1", "--set", "fail_rank=1", "--set", "fail_step=6",
         "--set", "workers=0", "--json"],
        tmp_path,
    )
    assert res.returncode == 0, res.stdout[-2000:]
    summary = json.loads(res.stdout.strip().splitlines()[-1])
    assert summary["status"] == "completed" and summary["failed_rank"] is None
    assert summary["error"].startswith("every rank completed; then at exit rank 1: ")
    assert "SIGABRT" in summary["error"]
    assert [r["steps"] for r in summary["ranks"]] == [6, 6]


# SIGTERM is -m slow: tests/e2e/test_cleanup.py's test_sigterm_leaves_nothing_of_the_run stops a
# headless run so too (the agreed step, exit 130, nothing left)
@pytest.mark.parametrize("sig", [signal.SIGINT, pytest.param(signal.SIGTERM, marks=pytest.mark.slow), signal.SIGHUP])
def test_signal_stops_every_rank_cleanly(tmp_path, sig):
    cmd = [sys.executable, "-m", "ddptop", "--headless", "--runs-dir", str(tmp_path), "--nproc", "2",
           "--steps", "100000", "--set", "workers=0", "--interval", "0.5", "--json"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    tree: list[psutil.Process] = []
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        tree = psutil.Process(proc.pid).children(recursive=True)
        if " running " in line and "step" in line:
            break
    else:
        proc.kill()
        raise AssertionError("run never started")
    assert len(tree) >= 3  # torchrun + 2 ranks
    t0 = time.monotonic()
    proc.send_signal(sig)
    out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 130
    summary = json.loads(out.strip().splitlines()[-1])
    assert summary["status"] == "stopped"
    last = [r["last_step"] for r in summary["ranks"]]
    assert last[0] == last[1]  # both ranks left the loop at the agreed step
    gone, alive = psutil.wait_procs(tree, timeout=5)
    assert alive == []  # torchrun, both ranks: no orphans
    print(f"\n{sig.name}: every rank gone {time.monotonic() - t0:.2f}s after the signal")
    assert time.monotonic() - t0 < 10


def test_more_ranks_than_visible_gpus_is_a_usage_error(tmp_path, monkeypatch, capsys):
    import ddptop.cli

    monkeypatch.setattr(ddptop.cli, "visible_gpus", lambda: 2)
    runs = tmp_path / "runs"
    assert ddptop.cli.main(["--headless", "--nproc", "4", "--runs-dir", str(runs)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--nproc 4" in err[0] and "2 visible GPU" in err[0]
    assert not runs.exists()
    # on gloo the GPU count does not limit the ranks
    args = ddptop.cli.run_parser().parse_args(["--nproc", "4", "--set", "backend=gloo", "--runs-dir", str(runs)])
    ddptop.cli.check_runnable(ddptop.cli.build_config(args), args)
