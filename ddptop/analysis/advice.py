"""The advisor's output and vocabulary: the Advice record, the comm-share thresholds, the
transport classes counted as slow or fast, how each path is named, and which presets are lossy.
Pure; no I/O, no torch, no textual, no asyncio."""

from __future__ import annotations

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
NOISE = 0.03  # sweep differences below this are run-to-run noise


@dataclass(frozen=True)
class Advice:
    """One recommendation: a preset (or None: keep what you have), the RunConfig fields it
    changes relative to the current run, and the evidence behind it."""

    preset: str | None
    changes: dict[str, Any] = field(default_factory=dict)
    reason: str = ""
    severity: str = "info"  # info | warn
    evidence: list[str] = field(default_factory=list)
    lossy: bool = False

    def to_dict(self) -> dict[str, Any]:
        return {
            "preset": self.preset,
            "changes": dict(self.changes),
            "reason": self.reason,
            "severity": self.severity,
            "evidence": list(self.evidence),
            "lossy": self.lossy,
        }


def is_lossy(preset: str) -> bool:
    """Whether `preset` compresses gradients (a comm hook): accuracy may suffer."""
    return PRESETS[preset].settings.get("comm_hook", "none") != "none"
