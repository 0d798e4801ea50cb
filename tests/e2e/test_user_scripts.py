"""Users' own scripts, unchanged, under `ddptop --nproc 2 --headless --json -- python SCRIPT`:
2 gloo ranks on the CPU, measured by the rank-side instrument alone (none of these scripts
mentions ddptop)."""

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import psutil
import pytest
from waiting import poll

from ddptop.commands.trace import read_trace

pytestmark = pytest.mark.e2e
SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"
PHASES = ("data", "forward", "backward", "optimizer")

SLOW = ["--slow-rank", "1", "--slow-ms", "25"]  # rank 1's data loader sleeps 25 ms per batch
# script, its arguments, whether it runs DDP (so has gradient communication). The single-
# process script has no straggler case: its two processes never wait for each other (no
# collective), so a slow one holds nobody up and there is no straggler to name.
CASES = {
    "plain": ("plain_ddp.py", SLOW, True),
    "accum": ("accum_ddp.py", ["--accum", "3", *SLOW], True),
    "lightning": ("lightning_ddp.py", SLOW, True),
    "two_optimizers": ("two_optimizers.py", SLOW, True),
    "single": ("single_process.py", [], False),
}
STEPS = 14
# a straggler is named once 3 checks 10 steps apart agree, the first after 20 measured steps
# (ddptop.model.straggler): the DDP scripts run long enough for that, captured steps aside
DDP_STEPS = 70  # past the first 50 (every step timed), one in K after: a 3rd check still comes


def ddptop(args, runs_dir, script, script_args):
    return [sys.executable, "-m", "ddptop", "--headless", "--json", "--runs-dir", str(runs_dir), "--nproc", "2",
            "--warmup", "2", *args, "--", sys.executable, str(SCRIPTS / script), *script_args]


def summary_of(stdout: str) -> dict:
    return json.loads(stdout.strip().splitlines()[-1])


def rank_logs(runs_dir: Path) -> str:
    return "\n".join(p.read_text(errors="replace") for p in runs_dir.glob("*/logs/*/attempt_0/*/*.log"))


def assert_nothing_left(summary: dict, script: str) -> None:
    def ours() -> list:
        return [p for p in psutil.process_iter(["cmdline"])
                if script in " ".join(p.info["cmdline"] or []) and p.pid != os.getpid()]

    poll(lambda: not ours(), 10)
    left = ours()
    assert not left, [p.info["cmdline"] for p in left]
    for r in summary["ranks"]:
        assert r["pid"] and not psutil.pid_exists(r["pid"]) or psutil.Process(r["pid"]).status() == "zombie"


# two_optimizers and single: -m slow (the step rule's unit tests cover several optimizers)
# accum is slow-marked too: its SIGINT case below and test_user_settings' no_sync run cover its loop
@pytest.mark.parametrize("case", [pytest.param(c, marks=pytest.mark.slow) if c in ("two_optimizers", "single", "accum") else c
                                  for c in CASES])
def test_script_is_measured_unchanged(tmp_path, case):
    script, args, ddp = CASES[case]
    steps = DDP_STEPS if ddp else STEPS
    res = subprocess.run(ddptop(["--capture", "6:2"], tmp_path, script, ["--steps", str(steps), *args]),
                         capture_output=True, text=True, timeout=300)
    logs = rank_logs(tmp_path)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-2000:] + logs[-3000:]
    s = summary_of(res.stdout)
    assert s["status"] == "completed" and s["world_size"] == 2
    assert s["command"][-len(args) - 3] == str(SCRIPTS / script)
    # nothing of ddptop's own trainer in a user script's summary
    assert "model" not in s["config"] and "batch_size" not in s["config"] and "steps" not in s["config"]
    assert s["backend"] == ("gloo" if ddp else "none") and s["model"] and s["params"] > 0
    for r in s["ranks"]:
        assert r["status"] == "done", r
        assert r["steps"] == steps, (r["steps"], logs[-2000:])  # one per optimizer step (cycle)
        phases = r["phases_ms"]
        assert all(phases[p] > 0 for p in PHASES), phases
        step_mean = 1000.0 / r["steps_per_s"]
        assert sum(phases.values()) == pytest.approx(step_mean, rel=0.10), (phases, step_mean)
        if ddp:
            # gloo's default: DDP's C++ all-reduce (a Python comm hook costs ~60 us a bucket), so
            # the exposed wait from backward's marks, and no total (gloo_timing off)
            assert r["exposed_comm_ms_p50"] > 0 and r["comm_ms_p50"] is None, r
            assert "gloo_timing=true" in r["info"]["comm_timing"], r["info"]  # how to time it, said
            assert r["info"]["ddp"] is True and r["info"]["bucket_cap_mb"] > 0
        else:
            assert "comm_ms_p50" not in r
    if ddp:  # every DDP script here has a slow data loader on rank 1
        assert "--slow-rank" in args
        assert s["straggler"] and s["straggler"]["rank"] == 1 and s["straggler"]["phase"] == "data", s["straggler"]
    cap = s["captures"][0]
    assert cap["status"] == "done", cap
    assert sorted(int(r) for r in cap["files"]) == [0, 1]
    for files in cap["files"].values():
        trace = read_trace(files[0])
        assert trace["traceEvents"], files
    assert f"optimizer steps: {steps * (2 if case == 'two_optimizers' else 1)}" in logs or case == "lightning"


def ranks_stepping(runs_dir: Path) -> set[int]:
    """Ranks with records in the run's steps.jsonl once it holds 2000 bytes (an empty set before)."""
    files = [p for p in runs_dir.glob("*/steps.jsonl") if p.stat().st_size > 2000]
    if not files:
        return set()
    lines = files[0].read_text().splitlines()[:-1]  # the last may be half-written
    return {json.loads(line).get("rank") for line in lines if line.startswith("{")}


# lightning and two_optimizers: -m slow (tests/e2e/test_script_truth.py stops scripts as Ctrl-C does)
@pytest.mark.parametrize("case", [pytest.param(c, marks=pytest.mark.slow) if c in ("lightning", "two_optimizers") else c
                                  for c in CASES])
def test_sigint_stops_every_rank_at_one_step(tmp_path, case):
    script, args, _ = CASES[case]
    args = [a for a in args if a not in SLOW]
    proc = subprocess.Popen(ddptop([], tmp_path, script, ["--steps", "100000", *args]),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        # every rank has stepped (ranks without a process group start apart: one still importing
        # torch under load has no step to stop at, as under torchrun) and the run is some way in
        steps = poll(lambda: ranks_stepping(tmp_path) == {0, 1}, 120)
        assert steps, "the run never got going"
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130, out[-2000:] + err[-2000:]
    s = summary_of(out)
    assert s["status"] == "stopped"
    last = {r["rank"]: r["last_step"] for r in s["ranks"]}
    # ranks without a process group step apart: one far behind gets the SIGINT (as under
    # torchrun) before it reaches the agreed step, which is a refinement of the stop, not a wait
    assert (last[0] == last[1] or case == "single") and min(last.values()) > 0, last
    assert all(r["status"] == "stopped" for r in s["ranks"]), [r["status"] for r in s["ranks"]]
    assert_nothing_left(s, str(SCRIPTS / script))


def test_a_script_that_exits_with_an_error_before_any_step_is_a_failed_run(tmp_path):
    res = subprocess.run(ddptop([], tmp_path, "plain_ddp.py", ["--no-such-flag"]), capture_output=True, text=True,
                         timeout=120)
    assert res.returncode == 1, res.stdout[-2000:]
    s = summary_of(res.stdout)
    assert s["status"] == "failed" and "exit code 2" in s["error"], s["error"]
    assert all(r["steps"] == 0 and r["status"] == "failed" for r in s["ranks"]), [r["status"] for r in s["ranks"]]


CRASHING = """
import os, torch, torch.distributed as dist, torch.nn as nn
dist.init_process_group("gloo")
model = nn.parallel.DistributedDataParallel(nn.Linear(32, 4))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(1000):
    if step == 6 and dist.get_rank() == 1:
        raise RuntimeError("boom in the user's own loop")
    model(torch.randn(8, 32)).sum().backward()
    opt.step()
    opt.zero_grad()
"""


def test_a_crash_in_the_users_loop_names_the_rank_and_its_error(tmp_path):
    script = tmp_path / "crashing.py"
    script.write_text(CRASHING)
    argv = ddptop([], tmp_path / "runs", "crashing.py", [])
    argv[argv.index(str(SCRIPTS / "crashing.py"))] = str(script)
    res = subprocess.run(argv, capture_output=True, text=True, timeout=180)
    assert res.returncode == 1, res.stdout[-2000:]
    s = summary_of(res.stdout)
    assert s["status"] == "failed" and s["failed_rank"] == 1, (s["failed_rank"], s["error"])
    assert "boom in the user's own loop" in s["error"]
    assert s["ranks"][1]["status"] == "failed" and s["ranks"][0]["steps"] >= 6
    assert_nothing_left(s, str(script))


# --- torch.distributed without DDP: what cannot be measured is said, the rest is kept -----

NOT_DDP = {  # the script's flag, what the one note names
    "allreduce": ([], "no DistributedDataParallel module"),
    "fsdp": (["--fsdp"], "FSDP"),
}
NOT_MEASURED = "gradient communication is not measured (ddptop times DDP's all-reduce); steps and phases are"


@pytest.mark.parametrize("case", list(NOT_DDP))
def test_distributed_without_ddp_says_what_is_not_measured_and_keeps_the_rest(tmp_path, case):
    flags, what = NOT_DDP[case]
    res = subprocess.run(ddptop([], tmp_path, "allreduce_no_ddp.py", ["--steps", str(STEPS), *flags]),
                         capture_output=True, text=True, timeout=300)
    logs = rank_logs(tmp_path)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-2000:] + logs[-3000:]
    s = summary_of(res.stdout)
    # one line, once for the run (not once per rank), in the summary and the final report
    said = [n for n in s["notes"] if "not measured" in n]
    assert len(said) == 1 and said[0].endswith(f"{what}: {NOT_MEASURED}"), s["notes"]
    assert f"note: {said[0]}" in res.stdout.splitlines()
    # everything else as for a DDP script: steps, phases, facts
    assert s["status"] == "completed" and s["world_size"] == 2 and s["backend"] == "gloo"
    assert s["model"] and s["params"] > 0
    for r in s["ranks"]:
        assert r["status"] == "done" and r["steps"] == STEPS, (r["status"], r["steps"])
        assert all(r["phases_ms"][p] > 0 for p in PHASES), r["phases_ms"]
        assert sum(r["phases_ms"].values()) == pytest.approx(1000.0 / r["steps_per_s"], rel=0.10)
        assert "comm_ms_p50" not in r and r["info"]["ddp"] is False
    assert logs.count(f"optimizer steps: {STEPS}") == 2


def test_distributed_without_ddp_note_is_on_the_tui(tmp_path):
    """The same note in the TUI's alert rows, from a real run of the script in the app."""
    import asyncio

    from test_tui import START_TIMEOUT, screen_text, wait_for

    import ddptop.cli
    from ddptop.tui.factory import build_app

    config = ddptop.cli.build_config(ddptop.cli.run_parser().parse_args(["--nproc", "2", "--warmup", "2"]),
                                     script=True)
    cmd = [sys.executable, str(SCRIPTS / "allreduce_no_ddp.py"), "--steps", str(STEPS)]

    async def main() -> str:
        app = build_app(config, tmp_path, user_cmd=cmd, in_process=True)
        async with app.run_test(size=(200, 50)) as pilot:
            state = app.workbench.current.state
            await wait_for(pilot, lambda: state.status == "completed", START_TIMEOUT + 60, "the run to complete")
            await wait_for(pilot, lambda: NOT_MEASURED in screen_text(app), 5, "the note on screen")
            shown = screen_text(app)
            await pilot.press("q")
        return shown

    shown = asyncio.run(main())
    lines = [line for line in shown.splitlines() if NOT_MEASURED in line]
    assert len(lines) == 1 and "no DistributedDataParallel module" in lines[0], lines
