"""Capture: one capture window of a run (the steps, the profiler, what each rank wrote, the
summary once processed), a record with a lifecycle that RunState keeps by id: scheduled,
recording, processing, done or failed. ddptop.run.capture_pipeline moves it along;
ddptop.analysis.capture summarises its traces. Pure: no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class Capture:
    capture_id: int
    start: int
    count: int
    profiler: str  # torch | nsys
    out_dir: str
    status: str = "scheduled"  # scheduled, recording, processing, done, failed
    ranks: dict[int, str] = field(default_factory=dict)  # rank -> recording/written/failed
    files: dict[int, list[str]] = field(default_factory=dict)
    error: str = ""
    summary: dict[str, Any] | None = None
    warmup: int | None = None  # steps the profiler ran before recording, the fewest any rank had (None: no report)

    @property
    def steps(self) -> str:
        return f"{self.start}-{self.start + self.count - 1}"

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.capture_id, "steps": self.steps, "profiler": self.profiler, "status": self.status,
                "dir": self.out_dir, "files": self.files, "error": self.error, "summary": self.summary,
                "warmup": self.warmup}


def perturbation_line(p: dict[str, Any] | None) -> str | None:
    """`profiled steps 128.0 ms vs 93.0 ms unprofiled (+38%)`."""
    if not p:
        return None
    pct = "" if p.get("pct") is None else f" ({p['pct']:+.0f}%)"
    return f"profiled steps {p['profiled_ms']:.1f} ms vs {p['unprofiled_ms']:.1f} ms unprofiled{pct}"
