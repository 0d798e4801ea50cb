"""One run of `ddptop cost`'s arms: its command line and environment (both arms carry the same
stamp, ddptop/rank/stamp), starting it in its own session, waiting with a timeout, ending it as
a Ctrl-C would, reaping what it left, and reading its stamps and ddptop's own records into a
RunRecord. Used by commands/cost (ABBA, one run at a time) and commands/cost_lockstep (two at
once). Must not import torch.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ddptop.analysis import cost_pairs
from ddptop.commands.cost_plan import Plan, RunRecord
from ddptop.run.launcher import die_with_parent

STAMP_DIR = Path(__file__).resolve().parents[1] / "rank" / "stamp"
PLAIN, DDPTOP = cost_pairs.PLAIN, cost_pairs.DDPTOP
STOP_GRACE_S = 30.0  # torchrun's own wait for its ranks after a signal


def arm_argv(arm: str, plan: Plan, runs_dir: Path) -> list[str]:
    if arm != DDPTOP:  # plain, or the second plain job of a lock-step A/A
        return [sys.executable, "-m", "torch.distributed.run", "--standalone",
                f"--nproc-per-node={plan.nproc}", "--no-python", "--", *plan.cmd]
    return [sys.executable, "-m", "ddptop", "--nproc", str(plan.nproc), "--headless", "--json",
            "--interval", "3600", "--runs-dir", str(runs_dir), *plan.ddptop_args, "--", *plan.cmd]


def arm_env(plan: Plan, stamp: Path, base: dict[str, str]) -> dict[str, str]:
    env = dict(base)
    path = env.get("PYTHONPATH", "")
    env["PYTHONPATH"] = os.pathsep.join([str(STAMP_DIR), *([path] if path else [])])
    env["DDPTOP_STAMP"] = str(stamp)
    env["DDPTOP_STAMP_CPUS"] = ";".join(",".join(map(str, c)) for c in plan.cpus)
    return env


@dataclass
class Running:
    """One run of an arm, started: its process and where its records go."""
    pair: int
    arm: str
    proc: subprocess.Popen[bytes]
    out_dir: Path
    started: float
    files: tuple[Any, Any]


def launch(pair: int, arm: str, plan: Plan, where: Path, env: dict[str, str], tag: str | None = None,
           more_env: dict[str, str] | None = None) -> Running:
    out_dir = where / (tag or f"{pair:02d}-{arm}")
    out_dir.mkdir(mode=0o700)
    argv = arm_argv(arm, plan, out_dir / "runs")
    out, err = open(out_dir / "stdout.log", "wb"), open(out_dir / "stderr.log", "wb")
    # its own session (a terminal's Ctrl-C reaches this process first, which stops the run
    # as torchrun would); SIGTERM to it if this process dies, so no run outlives it
    proc = subprocess.Popen(argv, env={**arm_env(plan, out_dir / "stamp", env), **(more_env or {})}, stdout=out,
                            stderr=err, stdin=subprocess.DEVNULL, start_new_session=True,
                            preexec_fn=die_with_parent if sys.platform == "linux" else None)
    return Running(pair, arm, proc, out_dir, time.monotonic(), (out, err))


def collect(run: Running, rc: int, plan: Plan) -> RunRecord:
    """The run's record once it ended (rc): its stamps, the ranks' stderr, ddptop's own summary."""
    for f in run.files:
        f.close()
    reap(str(run.out_dir / "stamp"))
    wall = time.monotonic() - run.started
    ranks, starts = read_stamps(run.out_dir)
    ddptop_arm = run.arm == DDPTOP
    summary = _last_json(run.out_dir / "stdout.log") if ddptop_arm else None
    stderr = (run.out_dir / "stderr.log").read_text(errors="replace").splitlines()
    if ddptop_arm:
        stderr = [line for f in sorted((run.out_dir / "runs").glob("*/logs/**/stderr.log"))
                  for line in f.read_text(errors="replace").splitlines()]
    record = RunRecord(run.pair, run.arm, rc, wall, ranks, stderr, summary, starts=starts)
    record.step_ms = cost_pairs.run_step_ms(ranks, plan.warmup) if rc == 0 and len(ranks) == plan.nproc else None
    if ddptop_arm:
        record.allreduces, record.every, record.nccl_timing, sent = _ddptop_counts(run.out_dir / "runs")
        stamped = len(ranks.get(0, []))
        record.timed = min(1.0, sent / stamped) if stamped and sent else None
    return record


def run_one(pair: int, arm: str, plan: Plan, where: Path, env: dict[str, str]) -> RunRecord:
    run = launch(pair, arm, plan, where, env)
    rc = -1
    try:
        rc = _wait(run.proc, plan.timeout)
    finally:
        record = collect(run, rc, plan)
    return record


def _ddptop_counts(runs: Path) -> tuple[float | None, int, bool, int]:
    """All-reduces a step (the mean of rank 0's `buckets`: none where nothing timed them),
    comm_timing_every, nccl_timing and rank 0's records (its timed steps), from the ddptop arm's own records."""
    counts: list[float] = []
    every, nccl_timing, sent = 10, False, 0
    for run in runs.glob("*/"):
        try:
            config = json.loads((run / "config.json").read_text())
            every = int(config.get("comm_timing_every", every))
            nccl_timing = bool(config.get("comm_timing", True) and config.get("nccl_timing", nccl_timing))
            with open(run / "steps.jsonl") as f:
                for line in f:
                    rec = json.loads(line)
                    sent += rec.get("rank") == 0
                    if rec.get("rank") == 0 and isinstance(rec.get("buckets"), (int, float)):
                        counts.append(float(rec["buckets"]))
        except (OSError, ValueError, TypeError, AttributeError):
            continue
    return (sum(counts) / len(counts) if counts else None), every, nccl_timing, sent


def _wait(proc: subprocess.Popen[bytes], timeout: float) -> int:
    """The run's exit code; past `timeout`, or on Ctrl-C, its group gets SIGINT, then SIGKILL
    after torchrun's own grace."""
    try:
        return proc.wait(timeout)
    except subprocess.TimeoutExpired:
        stop(proc)
        return -1
    except KeyboardInterrupt:
        stop(proc)
        raise


def stop(proc: subprocess.Popen[bytes]) -> None:
    """Ends a run's process group as a Ctrl-C would: SIGINT, SIGKILL after torchrun's own grace."""
    for sig, wait in ((signal.SIGINT, STOP_GRACE_S), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(proc.pid, sig)
            proc.wait(wait)
            return
        except ProcessLookupError:
            return
        except subprocess.TimeoutExpired:
            continue


def reap(stamp: str) -> list[int]:
    """Ends what is left of one run: any process of this user whose environment carries the
    run's DDPTOP_STAMP (a rank torchrun left behind when it died first, in either arm), with
    what it started, as the keeper ends a run (SIGTERM, SIGKILL after 5 s). Returns their pids."""
    import psutil

    from ddptop.run.keeper import end_all, start_ticks

    told: dict[int, int] = {}
    for p in psutil.process_iter(["uids"]):
        try:
            if p.info["uids"] and p.info["uids"].real == os.getuid() and p.environ().get("DDPTOP_STAMP") == stamp:
                started = start_ticks(p.pid)
                if started is not None:
                    told[p.pid] = started
        except psutil.Error:
            continue
    if told:
        end_all(told, wait_s=5.0)
    return list(told)


def read_stamps(out_dir: Path) -> tuple[dict[int, list[float]], dict[int, list[float]]]:
    """Each rank's step ends and (`--lockstep`) the times its turns came back."""
    ranks: dict[int, list[float]] = {}
    starts: dict[int, list[float]] = {}
    for f in out_dir.glob("stamp.rank*.json"):
        try:
            data = json.loads(f.read_text())
            rank = int(data["rank"])
            ranks[rank] = [float(x) for x in data["stamps"]]
            starts[rank] = [float(x) for x in data.get("starts", [])]
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            continue
    return ranks, starts


def _last_json(path: Path) -> dict[str, Any] | None:
    for line in reversed(path.read_text(errors="replace").splitlines()):
        if line.startswith("{"):
            try:
                return json.loads(line)
            except ValueError:
                return None
    return None
