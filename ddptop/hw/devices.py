"""How many GPUs this process may use (NVML and CUDA_VISIBLE_DEVICES), and the rank count
that follows by default. Used by the run CLI, sweep and tune; imports NVML lazily through
ddptop.hw.gpu, so it loads on a machine without it."""

from __future__ import annotations

import os


def visible_gpus() -> int | None:
    """GPUs this process may use, from NVML and CUDA_VISIBLE_DEVICES (None: no NVML)."""
    try:
        from ddptop.hw.gpu import GpuSource
    except ImportError:
        return None
    source = GpuSource()
    if not source.available:
        return None
    count = source.device_count()
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        count = min(count, len([d for d in visible.split(",") if d.strip()]))
    return count


def default_nproc() -> int:
    count = visible_gpus()
    return count if count else 2
