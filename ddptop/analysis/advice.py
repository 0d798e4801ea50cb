"""The advisor's vocabulary: the comm-share thresholds, the
transport classes counted as slow or fast, how each path is named, and which presets are lossy; the
Advice record (ddptop.model.advice's, re-exported here). Pure; no I/O, no torch, no textual, no asyncio."""

from __future__ import annotations

from ddptop.model.advice import Advice
from ddptop.model.config import PRESETS

__all__ = ["CONFIDENCE", "FAST", "HIGH", "LADDER", "LOSSY_CAVEAT", "MODERATE", "NOISE", "PATH_TEXT", "PCIE_HW",
           "SLOW", "VERY_HIGH", "Advice", "is_lossy", "predicted_prefix"]

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


def predicted_prefix(confidence: str) -> str:
    """The words a predicted reason starts with."""
    return f"Expected, not measured yet ({confidence} confidence)" if confidence else "Expected, not measured yet"


def is_lossy(preset: str) -> bool:
    """Whether `preset` compresses gradients (a comm hook): accuracy may suffer."""
    return PRESETS[preset].settings.get("comm_hook", "none") != "none"
