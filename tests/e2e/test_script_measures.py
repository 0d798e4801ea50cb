"""What a script is measured as (issue 32): forwards without grad shown apart from the step's
phases, samples counted once per micro-batch (or said to be unknown), and composable
replicate(). Each script of our own runs under `ddptop --nproc 2 --headless --json` on gloo,
and under plain torchrun with the same output on every rank."""

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ddptop.model.report import final_report
from ddptop.model.snapshot import snapshot
from ddptop.tui.screens.rank_detail import detail_lines
from ddptop.tui.synthetic import synthetic_state
from ddptop.tui.widgets.rank_table import eval_key

pytestmark = pytest.mark.e2e
SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"


def ddptop_run(tmp_path: Path, script: str, *args: str, compare: bool = True) -> dict:
    """The script's summary under ddptop; with `compare`, the script also runs under plain
    torchrun and every rank's stdout and stderr must be the same (apart from timing)."""
    if compare:
        from test_script_truth import assert_same_output, run_both

        ours, our_out, theirs, their_out = run_both(tmp_path, script, list(args))
        assert ours.returncode == theirs.returncode == 0, ours.stdout[-3000:] + ours.stderr[-3000:] + theirs.stderr[-2000:]
        assert_same_output(our_out, their_out)
        return json.loads(ours.stdout.strip().splitlines()[-1])
    cmd = [sys.executable, "-m", "ddptop", "--headless", "--json", "--runs-dir", str(tmp_path / "runs"),
           "--nproc", "2", "--", sys.executable, str(SCRIPTS / script), *args]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    return json.loads(res.stdout.strip().splitlines()[-1])


@pytest.mark.slow  # the suite stays under 10 min on 2 cores: `pytest -m slow` runs it (covered: test_script_truth's eval run and the views test below)
def test_validation_forwards_are_shown_apart_from_the_phases(tmp_path):
    s = ddptop_run(tmp_path, "eval_loop.py", "--steps", "30", "--every", "10", compare=False)  # test_script_truth does
    assert [r["steps"] for r in s["ranks"]] == [30, 30]
    for r in s["ranks"]:
        # two validations of 8 batches x 5 ms fall in the 25 measured steps: ~3.2 ms a step
        assert 1.5 < r["eval_ms_mean"] < 30, r
        assert r["phases_ms"]["forward"] < 5, r  # not charged to the training forward
    report = final_report(s, str(tmp_path))
    assert "validation/no-grad forwards:" in report and "ms a step (not in the phases" in report


def test_no_eval_adds_nothing_to_the_report_or_the_views():
    state = synthetic_state(2)
    snap = snapshot(state, time.time())
    assert eval_key(snap).plain == ""
    assert "no-grad" not in "\n".join(t.plain for t in detail_lines(snap, 0, 120))
    assert "no-grad" not in final_report(state.summary(), "/tmp/x")
    for rec in state.ranks[1].recent:
        rec["eval_ms"] = 4.0
    state.ranks[1].extra_ms["eval_ms"] = 4.0 * state.ranks[1].measured
    snap = snapshot(state, time.time())
    assert "no-grad fwd 4.0 ms/step" in eval_key(snap).plain
    assert "validation/no-grad forwards 4.0 ms a step" in "\n".join(t.plain for t in detail_lines(snap, 1, 120))


def samples_per_step(s: dict) -> list[float]:
    """Each rank's samples a step: samples/s over steps/s (both over the same measured steps)."""
    return [round(r["samples_per_s"] / r["steps_per_s"], 1) for r in s["ranks"]]


@pytest.mark.slow  # the canonical DCGAN below has the same shape (D on real and fake, G through D)
def test_a_gan_counts_its_batch_once_a_step_not_once_per_model(tmp_path):
    s = ddptop_run(tmp_path, "gan_two_ddp.py", "--steps", "20", "--batch", "32")
    assert [r["steps"] for r in s["ranks"]] == [20, 20]
    assert samples_per_step(s) == [32.0, 32.0], s["ranks"]


def test_an_lbfgs_closure_counts_its_batch_once_a_step(tmp_path):
    s = ddptop_run(tmp_path, "lbfgs_closure.py", "--steps", "15", "--batch", "24")
    assert [r["steps"] for r in s["ranks"]] == [15, 15]
    assert samples_per_step(s) == [24.0, 24.0], s["ranks"]
    for r in s["ranks"]:  # the time between closure calls is the optimizer's, not data (issue 43: 11-14 ms);
        # 0.36-0.59 ms on the loaded 2-core VM (the bar of issue 43 is 0.5 ms), 1.1-2.0 ms on a day it
        # ran ~2.5x slower (2026-11-28): data stays a fraction of the optimizer's phase, whatever the speed
        phases = r["phases_ms"]
        assert 1.0 < phases["optimizer"] and phases["data"] <= max(1.0, phases["optimizer"] / 4), phases


@pytest.mark.slow  # the canonical word LM below is time-major too ([bptt, B], no DataLoader)
def test_a_time_major_batch_counts_its_batch_dimension(tmp_path):
    """A GRU without batch_first fed [T, B, F]: B, checked against the DataLoader's batch size."""
    s = ddptop_run(tmp_path, "time_major.py", "--steps", "20", "--batch", "16", "--time", "24")
    assert [r["steps"] for r in s["ranks"]] == [20, 20]
    assert samples_per_step(s) == [16.0, 16.0] and s["batch_size"] == 16, s["ranks"]
    assert not [n for n in s["notes"] if "samples/s" in n], s["notes"]


# the canonical loops of issue 43, each with its true batch a step (and steps where they are not
# one iteration: the WGAN's 15 critic steps; its generator's fall inside them) and whether
# its optimizers step at different rates (said in a note)
CANONICAL = {"dcgan.py": (["--steps", "8", "--batch", "16"], 8, 16.0, False),
             "word_lm.py": (["--steps", "8", "--batch", "8", "--bptt", "35"], 7, 8.0, False),  # the last slice is short
             "wgan.py": (["--iters", "3", "--batch", "16"], 15, 16.0, True),
             "teacher_student.py": (["--steps", "12", "--batch", "16"], 12, 16.0, True)}


@pytest.mark.parametrize("script", [pytest.param(c, marks=pytest.mark.slow) if c == "teacher_student.py" else c
                                    for c in CANONICAL])
def test_canonical_loops_count_their_true_batch(tmp_path, script):
    """DCGAN (D on real and fake, G through D), the word language model ([bptt, B], no
    DataLoader), WGAN (5 critic steps a generator step: it read 16 steps of 15.0 samples, the
    generator's last step counted as a step of its own, and no note), teacher/student (the
    teacher steps every 4th batch): the samples a step are the real batch's, the header's
    batch agrees, and optimizers at different rates are said to be."""
    args, steps, per_step, rates_differ = CANONICAL[script]
    s = ddptop_run(tmp_path, script, *args, compare=False)
    assert [r["steps"] for r in s["ranks"]] == [steps, steps], s["ranks"]
    assert samples_per_step(s) == [per_step, per_step], s["ranks"]
    assert s["batch_size"] == int(args[args.index("--batch") + 1]), s["batch_size"]
    said = [n for n in s["notes"] if "optimizers step at different rates" in n]
    assert bool(said) == rates_differ, s["notes"]


def test_composable_replicate_is_measured_like_ddp(tmp_path):
    """replicate() builds a DDP around a ParameterList inside the module's forward pre-hook:
    its module's forwards are timed, the wait for its all-reduces too (gloo's default: DDP's C++
    all-reduce, exposed comm from backward's marks), and the model is the script's."""
    s = ddptop_run(tmp_path, "replicate_composable.py", "--steps", "20", "--batch", "32")
    assert [r["steps"] for r in s["ranks"]] == [20, 20]
    for r in s["ranks"]:
        ph = r["phases_ms"]
        assert ph["forward"] > 0 and ph["backward"] > 0, r
        assert ph["data"] < ph["forward"] + ph["backward"], r  # not the whole step
        assert r["exposed_comm_ms_p50"] > 0 and r.get("comm_ms_mean") is None, r
        assert r["info"]["model"] == "Net", r["info"]
    assert samples_per_step(s) == [32.0, 32.0]
    assert not any("replicate" in n or "DistributedDataParallel" in n for n in s["notes"]), s["notes"]
