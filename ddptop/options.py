"""Small option records the CLI hands to a Session (pure data)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class CaptureOptions:
    windows: list[tuple[int, int]] = field(default_factory=list)  # (start step, count), from --capture
    profiler: str = "torch"  # torch | nsys
    nsys: str | None = None  # nsys binary when profiler == "nsys"
