"""The advisor's output and vocabulary: the Advice record, the comm-share thresholds, the
transport classes counted as slow or fast, how each path is named, and which presets are lossy.
Pure; no I/O, no torch, no textual, no asyncio."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ddptop.model.config import PRESETS

# Thresholds on comm share (all-reduce time / step time). The article's PCIe box sat at 84%;
# the 4x H200 SHM path at ~45% gained most from bf16 + 100 MB buckets, and PowerSGD only
# pulls ahead when communication dwarfs compute.
MODERATE = 0.10  # below: DDP costs little, nothing worth tuning
HIGH = 0.25  # above, on a slow path: compress
VERY_HIGH = 0.75  # above, on a slow path: compress hard (PowerSGD)

# Transport classes that move gradients through host memory, PCIe or the network.
SLOW = {"shm", "net", "pcie-p2p"}
FAST = {"nvlink", "nvls"}  # collnet is in-network (across nodes): treated like net
PCIE_HW = {"pcie-switch", "pcie-host", "cross-numa"}

PATH_TEXT = {
    "nvls": "NVLink SHARP (NVLS)",
    "nvlink": "NVLink (P2P)",
    "p2p": "P2P (NVLink or PCIe: topology unknown)",
    "pcie-p2p": "P2P over PCIe",
    "collnet": "CollNet",
    "shm": "SHM (through host memory)",
    "net": "the network (NET)",
    "unknown": "an unrecognised transport",
}

# Stronger remedies last: the advisor never steps down from what a run already uses on a
# slow path, since the measured share already includes the compression's effect.
LADDER = ("overlap", "bf16-overlap", "powersgd")
LOSSY_CAVEAT = "compression hooks are lossy: check that accuracy holds"
NOISE = 0.03  # the least gain a sweep or tune counts as real, whatever its runs' intervals say


# How sure a prediction is (Advice.confidence), and what each level means.
CONFIDENCE = {
    "high": "communication dominates or is negligible: the direction is hard to get wrong",
    "medium": "it usually helps at this share, by an amount that depends on the model",
    "low": "it can go either way: measure it",
}


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


def predicted_prefix(confidence: str) -> str:
    """The words a predicted reason starts with."""
    return f"Expected, not measured yet ({confidence} confidence)" if confidence else "Expected, not measured yet"


def is_lossy(preset: str) -> bool:
    """Whether `preset` compresses gradients (a comm hook): accuracy may suffer."""
    return PRESETS[preset].settings.get("comm_hook", "none") != "none"
