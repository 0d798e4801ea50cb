"""Ctrl-C never costs a checkpoint (issue 43): ddptop stops a run as torchrun does. The ranks
get SIGINT at once unless the agreed-step stop has ended the run first, then torchrun's grace
(30 s, `--stop-grace`) to run their handlers; SIGKILL only after it, and then the summary names
the ranks killed, where they were and the files they had open for writing. A second Ctrl-C
sends SIGTERM, as torchrun's second one does. Each case is run against plain torchrun too
where the difference is the point; tests/scripts/slow_save.py writes its checkpoint in 20
pieces to a .partial file, renamed once whole (the 12 s save of the issue, 5 s here)."""

import signal
import subprocess
import sys

import pytest
from test_script_truth import ddptop_cmd, interrupted, rank_outputs, summary_of, torchrun_cmd
from waiting import poll

pytestmark = pytest.mark.e2e


def with_options(cmd: list[str], *opts: str) -> list[str]:
    cut = cmd.index("--")
    return [*cmd[:cut], *opts, *cmd[cut:]]


def checkpoints(ckpt) -> list[int]:
    """The steps each rank's checkpoint holds (it loads), rank by rank; no .partial left."""
    import torch

    assert sorted(p.name for p in ckpt.iterdir()) == ["rank0.pt", "rank1.pt"], list(ckpt.iterdir())
    return [torch.load(ckpt / f"rank{r}.pt")["steps"] for r in (0, 1)]


def saved_after_ctrl_c(tmp_path, where: str, cmd: list[str]) -> tuple[subprocess.CompletedProcess, list[int]]:
    ckpt = tmp_path / where / "ckpt"
    ckpt.mkdir(parents=True)
    res, outs = interrupted([*cmd, "--ckpt-dir", str(ckpt)], tmp_path / where)
    steps = checkpoints(ckpt)
    assert steps[0] == steps[1] > 0, (where, steps)
    for rank, (out, _) in outs.items():
        assert f"rank {rank}: saved" in out, (where, out)
    return res, steps


def test_ctrl_c_during_a_slow_save_lets_every_rank_finish_it(tmp_path):
    """The issue's case: ddptop killed the ranks 6.7 s after Ctrl-C, two .partial files left
    (a 7 s save is enough to show it). Now both write it whole, as under plain torchrun."""
    res, _ = saved_after_ctrl_c(tmp_path, "runs", ddptop_cmd(tmp_path / "runs", "slow_save.py", ["--save-s", "7"]))
    s = summary_of(res.stdout)
    assert res.returncode == 130 and s["status"] == "stopped", res.stdout[-2000:]
    assert [r["status"] for r in s["ranks"]] == ["stopped", "stopped"] and s["notes"] == [], s


@pytest.mark.slow
def test_plain_torchrun_lets_every_rank_finish_a_slow_save_too(tmp_path):
    """The reference for the test above."""
    saved_after_ctrl_c(tmp_path, "plain", torchrun_cmd(tmp_path / "plain", "slow_save.py", ["--save-s", "7"]))


def test_ctrl_c_during_a_validation_pass_without_steps_saves_on_every_rank(tmp_path):
    """No optimizer step for 60 s: no agreed step comes, the SIGINT does at once."""
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    cmd = ddptop_cmd(tmp_path / "runs", "slow_save.py", ["--save-s", "1", "--validate-s", "60", "--ckpt-dir", str(ckpt)])
    res, outs = interrupted(cmd, tmp_path / "runs")
    assert res.returncode == 130, res.stdout[-2000:]
    assert checkpoints(ckpt) == [20, 20]
    assert all(f"rank {r}: validating" in out for r, (out, _) in outs.items()), outs


BUSY_BEFORE_ANY_STEP = """
import time, torch, torch.distributed as dist
dist.init_process_group("gloo")
print("training", flush=True)
t = time.time()
while time.time() - t < 60:  # a long preparation in Python before any step: it holds the GIL
    sum(range(1000))
"""


def test_ctrl_c_before_any_step_reads_stopped_on_every_rank(tmp_path):
    """No step yet, so the SIGINT follows the stop command at once, and a rank's KeyboardInterrupt
    can come before its probe's thread has read the command (a rank still importing torch on the
    GPU host read "crashed", its peer "stopped", session 17). Uncaught, as under plain torchrun:
    each rank is stopped, none crashed."""
    script = tmp_path / "busy.py"
    script.write_text(BUSY_BEFORE_ANY_STEP)
    cmd = [sys.executable, "-m", "ddptop", "--headless", "--json", "--runs-dir", str(tmp_path / "runs"), "--nproc", "2",
           "--", sys.executable, str(script)]
    res, outs = interrupted(cmd, tmp_path / "runs")
    s = summary_of(res.stdout)
    assert res.returncode == 130 and s["status"] == "stopped", res.stdout[-2000:]
    assert [r["status"] for r in s["ranks"]] == ["stopped", "stopped"], [(r["rank"], r["status"]) for r in s["ranks"]]
    assert all("KeyboardInterrupt" in err for _, err in outs.values()), outs  # the script's own, as under torchrun


@pytest.mark.slow
def test_hand_written_updates_get_their_keyboard_interrupt(tmp_path):
    """No torch.optim, so no step boundary: the script still gets its KeyboardInterrupt."""
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    cmd = ddptop_cmd(tmp_path / "runs", "slow_save.py", ["--save-s", "1", "--no-optim", "--ckpt-dir", str(ckpt)])
    res, _ = interrupted(cmd, tmp_path / "runs")
    assert res.returncode == 130, res.stdout[-2000:]
    steps = checkpoints(ckpt)
    assert steps[0] == steps[1] > 0, steps


def test_a_kill_after_the_grace_names_the_ranks_where_they_were_and_what_they_wrote(tmp_path):
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    cmd = with_options(ddptop_cmd(tmp_path / "runs", "slow_save.py", ["--save-s", "60", "--ckpt-dir", str(ckpt)]),
                       "--stop-grace", "2")
    res, _ = interrupted(cmd, tmp_path / "runs")
    assert res.returncode == 130, res.stdout[-2000:]
    notes = summary_of(res.stdout)["notes"]
    for rank in (0, 1):
        said = [n for n in notes if n.startswith(f"rank {rank} was killed (SIGKILL) after the 2 s grace (--stop-grace)")]
        assert len(said) == 1, notes
        assert "still running in save_slowly (slow_save.py:" in said[0], said
        assert said[0].endswith(f"it had open for writing: {ckpt / f'rank{rank}.pt.partial'}"), said
        assert f"note: {said[0]}" in res.stdout  # the closing lines say it too


@pytest.mark.slow
def test_a_second_ctrl_c_sends_sigterm_as_torchruns_second_does_and_says_so(tmp_path):
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    cmd = ddptop_cmd(tmp_path / "runs", "slow_save.py", ["--save-s", "60", "--ckpt-dir", str(ckpt)])
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        for said in ("training", "saving"):  # Ctrl-C once training, again once both ranks save
            assert poll(lambda s=said: sum(s in o for o, _ in rank_outputs(tmp_path / "runs").values()) == 2, 60), said
            proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    said = "second Ctrl-C: SIGTERM to ranks 0, 1, as torchrun's second Ctrl-C does"
    assert f"ddptop: {said}" in out and summary_of(out)["notes"] == [said], out[-2000:]
    assert sorted(p.name for p in ckpt.iterdir()) == ["rank0.pt.partial", "rank1.pt.partial"]


@pytest.mark.parametrize("value", ["-1", "3601", "soon"])
def test_a_bad_stop_grace_is_a_one_line_usage_error(tmp_path, value):
    res = subprocess.run([sys.executable, "-m", "ddptop", "--headless", "--runs-dir", str(tmp_path / "runs"),
                          "--stop-grace", value, "--", sys.executable, "-c", "pass"],
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 2 and len(res.stderr.strip().splitlines()) == 1, res.stderr
    assert "--stop-grace" in res.stderr and not (tmp_path / "runs").exists(), res.stderr


SLEEPER = "import time\nwhile True:\n    time.sleep(0.1)\n"  # never imports torch: never says hello


def test_a_ctrl_c_while_torchrun_starts_ends_the_run_at_once(tmp_path):
    """Ctrl-C 0.2 s after torchrun started, its script one that never imports torch (so no
    rank ever says hello): the run ends in seconds, with nothing left. torchrun swallows a
    SIGINT while it imports; tests/run/test_stopping.py has that case itself (a detached run
    stopped by a viewer at its start ran on for good: test_live_squat's CI reruns)."""
    import time

    import psutil

    script = tmp_path / "sleeper.py"
    script.write_text(SLEEPER)
    proc = subprocess.Popen([sys.executable, "-m", "ddptop", "--headless", "--json", "--nproc", "1",
                             "--runs-dir", str(tmp_path / "runs"), "--", sys.executable, str(script)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    runs = tmp_path / "runs"
    poll(lambda: any(p.name == "torchrun.log" for p in runs.glob("*/torchrun.log")), 20, every=0.02)
    time.sleep(0.2)  # torchrun started, still importing
    t0 = time.monotonic()
    proc.send_signal(signal.SIGINT)
    try:
        out, err = proc.communicate(timeout=25)
    finally:
        proc.kill()
    assert time.monotonic() - t0 < 20, "the stop waited for the grace"
    assert proc.returncode == 130, out[-2000:] + err[-2000:]
    assert summary_of(out)["status"] == "stopped"
    left = [p for p in psutil.process_iter(["cmdline"]) if str(script) in " ".join(p.info["cmdline"] or [])]
    assert not left, [p.info["cmdline"] for p in left]
