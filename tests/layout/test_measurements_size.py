"""docs/measurements stays small: the working tree travels to the lent GPU machine with every
call (64 MiB at most, carried wheels included), and 36 MB of profiler traces there once left no
room (docs/measurements/README.md)."""

from __future__ import annotations

import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MEASUREMENTS = ROOT / "docs" / "measurements"
MAX_FILE = 1_500_000  # bytes
MAX_TOTAL = 24_000_000
MAX_TREE = 48 * 2**20  # the whole tracked tree, leaving room for the wheels a call carries


def tracked(under: Path) -> list[Path]:
    """The files git tracks under `under` (every file there, where this is no git checkout)."""
    try:
        out = subprocess.run(["git", "ls-files", "-z", "--", str(under)], cwd=ROOT, capture_output=True, check=True)
    except (OSError, subprocess.CalledProcessError):
        return [p for p in under.rglob("*") if p.is_file()]
    return [ROOT / name for name in out.stdout.decode().split("\0") if name and (ROOT / name).is_file()]


def test_no_measurement_file_is_large_and_the_folder_stays_under_its_budget() -> None:
    files = tracked(MEASUREMENTS)
    assert files, "docs/measurements holds no file"
    large = sorted(f"{p.relative_to(ROOT)} ({p.stat().st_size:,} bytes)" for p in files if p.stat().st_size > MAX_FILE)
    assert not large, f"over {MAX_FILE:,} bytes (keep a summary, not the traces): {large}"
    total = sum(p.stat().st_size for p in files)
    assert total <= MAX_TOTAL, f"docs/measurements holds {total:,} bytes, over its {MAX_TOTAL:,}"


def test_the_tracked_tree_fits_a_gpu_call_with_room_for_wheels() -> None:
    total = sum(p.stat().st_size for p in tracked(ROOT))
    assert total <= MAX_TREE, f"the tracked tree is {total / 2**20:.1f} MiB, over {MAX_TREE / 2**20:.0f}"
