"""How long should cost_ab's blocks be? Re-cut one run's steps into blocks of L steps (issue 27).

Takes the JSON `bench/overhead_ab.py --json-out` wrote (each rank's blocks with every step's
time), joins every arm's steps back into one series in the order they ran (the mean over
ranks: they run in lockstep), cuts it into pairs of L-step blocks, gives each pair a random
order (an A/A: both "arms" are the same run, so any departure from 1.000 is the method's) and
prints, per L, the median paired ratio with its bootstrap 95% interval and its width, and the
series' own autocorrelation. The arms' real differences (≤ ~0.3%) stay in the series; they are
small against the widths compared here.

    python bench/investigations/ab_block_length.py docs/measurements/2026-11-26-s3-call1/ab_1.json [more.json.gz ...] [--lengths 1,2,4,12]

Question: how long should cost_ab's blocks be (issue 27)?
Answer (2026-11-26, 2x H100 and 2x H200): one step. The A/A interval is 0.2-0.6% wide at L = 1
and 1.5-3.5% at L = 12 (a step's time correlates 0.75-0.9 with the next); cost_ab's default
block is one step since.
Quoted in: docs/BENCHMARKS.md, "arms a step apart, with the A/A and the busy check in every run".
"""

from __future__ import annotations

import argparse
import gzip
import json
import random
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from ddptop.analysis.cost_ab import median_ci  # noqa: E402


def step_series(workload: dict) -> list[float]:
    """Every step's ms in the order the steps ran, mean over ranks."""
    ranks = [[ms for block in raw["blocks"] for ms in block.get("step_ms", [])] for raw in workload.get("raw", [])]
    n = min((len(r) for r in ranks), default=0)
    return [statistics.fmean(r[i] for r in ranks) for i in range(n)]


def autocorrelation(x: list[float], lag: int) -> float:
    mu = statistics.fmean(x)
    var = sum((v - mu) ** 2 for v in x)
    return sum((x[i] - mu) * (x[i + lag] - mu) for i in range(len(x) - lag)) / var if var else 0.0


def aa_ratios(x: list[float], length: int, seed: int = 3) -> list[float]:
    """One ratio per pair of adjacent L-step blocks, the pair's order drawn at random."""
    rng = random.Random(seed)
    out = []
    for g in range(len(x) // (2 * length)):
        a = x[2 * length * g: 2 * length * g + length]
        b = x[2 * length * g + length: 2 * length * (g + 1)]
        if rng.random() < 0.5:
            a, b = b, a
        out.append(statistics.fmean(a) / statistics.fmean(b))
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("json", nargs="+")
    p.add_argument("--lengths", default="1,2,3,4,6,12")
    args = p.parse_args(argv)
    try:
        lengths = [int(v) for v in args.lengths.split(",")]
    except ValueError:
        print(f"ab_block_length: --lengths wants integers, got {args.lengths!r}", file=sys.stderr)
        return 2
    for path in args.json:
        raw = Path(path).read_bytes()
        for workload in json.loads(gzip.decompress(raw) if path.endswith(".gz") else raw):
            x = step_series(workload)
            if len(x) < 4 * max(lengths):
                continue
            lags = " ".join(f"{k}:{autocorrelation(x, k):.2f}" for k in (1, 2, 4, 12))
            print(f"== {path}: {workload['workload']}, {len(x)} steps, {statistics.fmean(x):.2f} ms mean, "
                  f"sd {statistics.pstdev(x):.2f}; autocorrelation by lag {lags}")
            for length in lengths:
                e = median_ci(aa_ratios(x, length))
                print(f"   L={length:2d}: {e.n:5d} pairs, A/A ratio {e.median:.4f} [{e.lo:.4f}, {e.hi:.4f}], width {e.hi - e.lo:.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
