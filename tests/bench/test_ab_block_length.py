"""bench/investigations/ab_block_length.py: on a drifting series, blocks of one step give the narrowest A/A interval."""

from __future__ import annotations

import importlib.util
import json
import random
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def load():
    spec = importlib.util.spec_from_file_location("ab_block_length", ROOT / "bench" / "investigations" / "ab_block_length.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def drifting(n: int, seed: int = 1) -> list[float]:
    """A step time that wanders slowly (as on the lent GPU machines) plus white noise."""
    rng = random.Random(seed)
    level, out = 0.0, []
    for _ in range(n):
        level = 0.98 * level + rng.gauss(0, 1.0)
        out.append(30.0 + level + rng.gauss(0, 0.5))
    return out


def test_one_step_blocks_cancel_the_drift():
    mod = load()
    x = drifting(4000)
    widths = {}
    for length in (1, 12):
        e = mod.median_ci(mod.aa_ratios(x, length))
        assert e.lo <= 1.0 <= e.hi  # an A/A: the interval holds 1
        widths[length] = e.hi - e.lo
    assert widths[1] * 3 < widths[12]
    assert mod.autocorrelation(x, 1) > 0.8


def test_reads_overhead_ab_json(tmp_path, capsys):
    mod = load()
    x = drifting(400)
    raw = [{"rank": r, "blocks": [{"arm": "on" if i % 2 else "off", "step_ms": [x[i]]} for i in range(400)]} for r in (0, 1)]
    path = tmp_path / "ab.json"
    path.write_text(json.dumps([{"workload": "toy", "raw": raw}]))
    assert mod.step_series({"raw": raw}) == x
    assert mod.main([str(path), "--lengths", "1,4"]) == 0
    out = capsys.readouterr().out
    assert "toy, 400 steps" in out and "L= 1:   200 pairs" in out and "L= 4:    50 pairs" in out
    assert mod.main([str(path), "--lengths", "one"]) == 2
