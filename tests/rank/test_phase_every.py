"""`--set phase_every=K`: the rank-side layer engaged one step in K (ddptop.rank.phase_every), its
schedule, the settings it refuses, and a real 2-rank run on gloo sending every Kth step."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from ddptop.model.config import ConfigError, RunConfig, validate
from ddptop.rank.phase_every import PhaseEvery

SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"


def test_every_kth_step_is_engaged_and_every_step_while_a_capture_is_asked_for_or_runs() -> None:
    four = PhaseEvery({"phase_every": 4})
    assert four.on and not PhaseEvery({}).on and not PhaseEvery({"phase_every": 1}).on
    assert [s for s in range(12) if four.engaged_after(s, None, [])] == [3, 7, 11]
    idle = SimpleNamespace(scheduled=[], active=None, warming=None)
    assert not four.engaged_after(0, idle, [])
    assert four.engaged_after(0, idle, ["a capture command waits"])
    for busy in (SimpleNamespace(scheduled=["w"], active=None, warming=None),
                 SimpleNamespace(scheduled=[], active="w", warming=None),
                 SimpleNamespace(scheduled=[], active=None, warming="w")):
        assert four.engaged_after(0, busy, [])


@pytest.mark.parametrize(("changes", "said"), [({"phase_every": 0}, "phase_every must be 1 or more"),
                                               ({"phase_every": 4, "cost_ab": 0.001}, "not with cost_ab")])
def test_settings_that_cannot_work_are_refused(changes: dict, said: str) -> None:
    with pytest.raises(ConfigError, match=said):
        validate(RunConfig(**changes))


@pytest.mark.e2e
def test_a_real_run_sends_every_kth_step_with_its_phases(tmp_path: Path) -> None:
    cmd = [sys.executable, "-m", "ddptop", "--headless", "--json", "--nproc", "2", "--runs-dir", str(tmp_path),
           "--set", "phase_every=4", "--", sys.executable, str(SCRIPTS / "plain_ddp.py"), "--steps", "40"]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=180)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    summary = json.loads(res.stdout.strip().splitlines()[-1])
    assert summary["status"] == "completed"
    records = [json.loads(line) for line in next(tmp_path.glob("*/steps.jsonl")).read_text().splitlines()]
    for rank in (0, 1):
        steps = [r["step"] for r in records if r["rank"] == rank]
        assert steps == list(range(0, 40, 4)), steps  # the same steps on every rank
        assert all(r["forward_ms"] > 0 and r["step_ms"] > 0 for r in records if r["rank"] == rank)
    assert [r["last_step"] for r in summary["ranks"]] == [36, 36] and summary["steps_per_s"] > 0
