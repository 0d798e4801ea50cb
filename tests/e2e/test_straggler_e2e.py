"""The straggler verdict on real runs (issue 44, must-show 2 and 3 on CPU): 2 gloo ranks under
`ddptop --headless --json`. A rank made slow on purpose is named with what it costs the job,
within 25% of the step time the job really lost (the same script's own timing, run without the
delay in the same test); a busy-loop process per core beside the demo names no rank and says
the host is contended; the demo alone names no one. Every view says the same words: the
headless lines, the exit summary and summary.json."""

from __future__ import annotations

import fcntl
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from ddptop.model import straggler
from ddptop.model.straggler_work import AFTER_FORWARD


@pytest.fixture(autouse=True)
def alone_among_these(tmp_path_factory: pytest.TempPathFactory):
    """One of this file's tests at a time, whichever xdist worker runs it: the busy-host test's
    busy loops land on the delayed-rank test's runs when the two overlap, and its loss is two
    runs' difference (both tests reran in one CI run, 2026-11-27; the first tries' failures
    were not printed). A lock in the session's shared temp dir."""
    lock = tmp_path_factory.getbasetemp().parent / "straggler-e2e.lock"
    with open(lock, "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        yield


pytestmark = pytest.mark.e2e
ROOT = Path(__file__).resolve().parents[2]
GPT = ROOT / "bench" / "gpt_train.py"
# a small transformer whose own step (~15 ms here) is small beside the delay
TINY = ["--data", "random", "--n-layer", "1", "--n-embd", "32", "--block", "32", "--batch-size", "4",
        "--vocab", "256", "--warmup", "10", "--steps", "90"]


def ddptop(runs: Path, *args: str, timeout: float = 240) -> tuple[dict, str]:
    cmd = [sys.executable, "-m", "ddptop", "--headless", "--json", "--interval", "1", "--runs-dir", str(runs),
           "--nproc", "2", *args]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    summary = json.loads(res.stdout.strip().splitlines()[-1])
    assert summary["straggler_check"]["text"] in res.stdout.splitlines()  # the exit summary says it
    return summary, res.stdout


def own_step_ms(runs: Path) -> float:
    """The script's own median step after its warmup (rank 0's `step median` line): the
    median, because a neighbour on these two cores (another test's busy loops) puts spikes
    into some steps of one run and not the other."""
    for path in runs.glob("*/logs/**/attempt_0/0/stdout.log"):
        found = re.search(r"step median ([0-9.]+) ms", path.read_text())
        if found:
            return float(found.group(1))
    raise AssertionError(f"no step median line under {runs}")


def test_a_delayed_rank_is_named_with_what_it_costs_the_job(tmp_path: Path) -> None:
    """Rank 1's batches come 80 ms late (a sleep in its loader, which nanoGPT's loop calls
    between forward and backward: inside ddptop's forward phase, named by the host's gap there).
    The cost is what the job's step lost
    against the same script run symmetric, as the script itself measures it. On these two
    shared cores the symmetric run's ranks compete for the CPU that the sleeping rank leaves to
    the other, so a job loses less than the sleep (50 ms: 49.0 lost, 53.5 said when quiet; 38.9
    lost, 51.3 said beside the busy-loop test): the delay is large beside a step (~15 ms)."""
    script = ["--warmup", "10", "--", sys.executable, str(GPT), *TINY]
    calm, _ = ddptop(tmp_path / "sym", *script)
    slow, out = ddptop(tmp_path / "slow", *script, "--slow-rank", "1", "--slow-data-ms", "80")
    lost = own_step_ms(tmp_path / "slow") - own_step_ms(tmp_path / "sym")
    s = slow["straggler"]
    assert s is not None and (s["rank"], s["phase"]) == (1, AFTER_FORWARD), slow["straggler_check"]
    assert abs(s["cost_ms"] - lost) <= 0.25 * lost, (s["cost_ms"], lost, s["text"])
    assert s["ci95_ms"][0] <= s["cost_ms"] <= s["ci95_ms"][1] and s["share"] > 0.3
    text = slow["straggler_check"]["text"]
    assert text.startswith(f"rank 1 straggler: {AFTER_FORWARD}, costs the job {s['cost_ms']:.1f} ms/step (")
    # the headless line said the verdict in force, in the same words
    assert any(line.endswith(s["text"]) or s["text"] in line for line in out.splitlines() if line.startswith("["))
    assert calm["straggler"] is None, calm["straggler_check"]["text"]


def busy_loops() -> list[subprocess.Popen]:
    """One process spinning per core the ranks may use."""
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(len(os.sched_getaffinity(0)))]


def test_a_busy_host_is_not_a_straggler(tmp_path: Path) -> None:
    """Issue 44: on a loaded 2-core host the demo named a straggler in 8 episodes over 90 s,
    flipping between rank 0 and rank 1. With a busy loop per core beside it, no rank is named
    and the verdict says the host is contended, in every view."""
    loops = busy_loops()
    try:
        summary, out = ddptop(tmp_path, "--steps", "90")
    finally:
        for p in loops:
            p.kill()
            p.wait()
    check = summary["straggler_check"]
    assert summary["straggler"] is None and check["straggler"] is None, check["text"]
    assert "host CPU contended: " in check["text"] and " runnable on " in check["text"], check["text"]
    host = summary["host_cpu"]
    waits = host["run_queue_wait_share"].values()
    assert host["cores"] >= 1 and sum(waits) / len(waits) >= 0.1, host
    named = [line for line in out.splitlines() if "straggler:" in line and line.startswith("[") and "not named" not in line]
    assert not named, named  # no status line named a rank either


def test_the_demo_alone_has_no_straggler(tmp_path: Path) -> None:
    """The first run of a fresh clone named one (issue 27: 'rank 1 is a straggler: 13.3 ms vs
    10.1 ms' after 25 steps, nothing injected). On this shared 2-core machine one rank can
    really be slower for a dozen steps (another process on its core): one check may see it,
    the verdict waits for 3 in a row, and the host's CPU says when it was that."""
    summary, _ = ddptop(tmp_path, "--steps", "30")
    assert summary["straggler"] is None, (summary["straggler_check"]["text"], summary["host_cpu"])
    check = summary["straggler_check"]
    assert check["straggler"] is None and check["text"].startswith(("no straggler (largest: rank ", "host CPU contended: ")), check
    assert check["latest"]["n_steps"] == straggler.MIN_STEPS  # 25 measured steps: one check
    assert f"the rule sees >= {check['latest']['sees_ms']:.1f} ms here" in check["text"] or check["latest"]["contended"]
