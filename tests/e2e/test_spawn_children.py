"""Training inside torch.multiprocessing.spawn children of a torchrun rank: not measured, and
said so by name (issue 43), rather than a silent `completed` with 0 steps."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"


@pytest.mark.e2e
def test_spawn_children_are_named_in_a_note(tmp_path: Path) -> None:
    cmd = [sys.executable, "-m", "ddptop", "--nproc", "2", "--headless", "--json", "--interval", "0.5", "--runs-dir", str(tmp_path),
           "--", sys.executable, str(SCRIPTS / "spawn_children.py"), "--steps", "5"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=180)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    summary = json.loads(out.stdout.strip().splitlines()[-1])
    notes = [n for n in summary["notes"] if "torch.multiprocessing.spawn child process(es)" in n]
    # one note (the same words from every rank are said once)
    assert notes and all("train runs in 1" in n for n in notes), summary["notes"]
    # the status line says why no step comes while it waits (it sat at `starting` with no word)
    assert any("waiting for the first step  note: " in line and "spawn child" in line
               for line in out.stdout.splitlines() if line.startswith("[")), out.stdout[-2000:]
    # nothing measured: no advice about NCCL (it read "NCCL transports are not known ..." on gloo)
    assert summary["advice"]["reason"].startswith("no step was measured"), summary["advice"]
    assert "NCCL" not in out.stdout.split("\nrecords:")[0].split(f"run {summary['run_id']}:")[-1], out.stdout[-1500:]
