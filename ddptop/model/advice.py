"""Advice: one recommendation of the advisor (ddptop.analysis.advisor), the record RunState
keeps, summary.json carries and every view prints. Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Advice:
    """One recommendation: a preset (or None: keep what you have), the RunConfig fields it
    changes relative to the current run, and the evidence behind it.

    `basis` says where it comes from: "measured" (runs that tried the configurations, or a
    reading such as a straggler that needs no trial) or "predicted" (the rules' expectation
    for a configuration no run has tried yet; `confidence` says how sure, and the reason
    starts with the label so every view that prints it shows it). `reading` is what the
    rules read off the run (path, comm share), `warning` a fact that holds whatever the
    remedy (an NVLink that NCCL leaves unused)."""

    preset: str | None
    changes: dict[str, Any] = field(default_factory=dict)
    reason: str = ""
    severity: str = "info"  # info | warn
    evidence: list[str] = field(default_factory=list)
    lossy: bool = False
    basis: str = "predicted"  # measured | predicted
    confidence: str = ""  # high | medium | low, for a prediction
    reading: str = ""
    warning: str = ""

    @property
    def predicted(self) -> bool:
        return self.basis != "measured"

    @property
    def label(self) -> str:
        """How a view should tag this advice: `measured`, or `expected, not measured yet
        (low confidence)`."""
        if not self.predicted:
            return "measured"
        return "expected, not measured yet" + (f" ({self.confidence} confidence)" if self.confidence else "")

    @property
    def headline(self) -> str:
        """One line for a view's title: the label and what to do."""
        what = f"use preset {self.preset}" if self.preset and self.changes else (
            f"keep preset {self.preset}" if self.preset else "keep the current settings")
        return f"{what} [{self.label}]"

    def to_dict(self) -> dict[str, Any]:
        return {
            "preset": self.preset,
            "changes": dict(self.changes),
            "reason": self.reason,
            "severity": self.severity,
            "evidence": list(self.evidence),
            "lossy": self.lossy,
            "basis": self.basis,
            "predicted": self.predicted,
            "confidence": self.confidence,
            "label": self.label,
            "headline": self.headline,
            "reading": self.reading,
            "warning": self.warning,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Advice:
        """Read back `to_dict`'s output (an older summary's advice is a prediction)."""
        return cls(
            data.get("preset"),
            dict(data.get("changes") or {}),
            str(data.get("reason") or ""),
            str(data.get("severity") or "info"),
            [str(e) for e in data.get("evidence") or []],
            bool(data.get("lossy")),
            "measured" if data.get("basis") == "measured" else "predicted",
            str(data.get("confidence") or ""),
            str(data.get("reading") or ""),
            str(data.get("warning") or ""),
        )
