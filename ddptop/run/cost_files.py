"""The cost blocks the ranks wrote (`--set cost_ab=S`, ddptop.rank.cost_ab): read back at the
run's end for the summary. A rank is trusted for its own file only: one whose name and content
disagree, or that is not a JSON object of blocks, is left out and said."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from ddptop.analysis.cost_ab import analyse, run_summary
from ddptop.model.cost import RunCost
from ddptop.run.untrusted import read_text

MAX_BYTES = 64 << 20  # 2,000 one-step blocks are ~0.4 MB a rank
NAME = re.compile(r"rank(\d+)\.json")


def read_cost_blocks(run_dir: Path, world_size: int) -> tuple[list[dict[str, Any]], list[str]]:
    """Each rank's blocks, and what was left out and why."""
    results: list[dict[str, Any]] = []
    problems: list[str] = []
    for path in sorted((run_dir / "cost_ab").glob("rank*.json")):
        name = NAME.fullmatch(path.name)
        if name is None:
            continue
        rank = int(name.group(1))
        try:
            text = read_text(path, MAX_BYTES)  # a regular file only: never a FIFO or a link
            if text is None:
                raise ValueError(f"not a regular file of at most {MAX_BYTES >> 20} MiB")
            data = json.loads(text)
            if not isinstance(data, dict) or data.get("rank") != rank or not isinstance(data.get("blocks"), list):
                raise ValueError("not this rank's blocks")
            if not 0 <= rank < max(world_size, 1):
                raise ValueError(f"rank {rank} is outside the world of {world_size}")
            if not all(isinstance(b, dict) for b in data["blocks"]):
                raise ValueError("a block is not an object")
        except (OSError, ValueError, RecursionError) as exc:  # json's errors are ValueErrors
            problems.append(f"cost_ab/{path.name} left out: {exc}")
            continue
        results.append(data)
    return results, problems


def cost_of(results: list[dict[str, Any]], busy_pct: float) -> tuple[RunCost | None, str | None]:
    """The run's cost from the ranks' blocks, or why there is none: a block not as a rank
    writes it (a field missing or of another type) is said, never raised into the run's end."""
    try:
        return run_summary(analyse(results), busy_pct), None
    except (AttributeError, KeyError, TypeError, ValueError, ZeroDivisionError) as exc:
        return None, f"ddptop's cost not measured: a rank's cost blocks are malformed ({type(exc).__name__}: {exc})"
