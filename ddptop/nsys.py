"""After an nsys run: what nsys wrote for the capture windows, and `nsys stats` of each report."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from ddptop.capture import nsys_outputs

STATS_TIMEOUT_S = 180.0
MAX_REPORTS = 8


async def nsys_report(nsys: str, captures_dir: Path) -> dict[str, Any]:
    """Files nsys left (with sizes) and, per .nsys-rep, `nsys stats` (NVTX ranges and GPU
    kernels) saved beside it; says plainly when nsys produced no report."""
    outputs = nsys_outputs(captures_dir)
    info: dict[str, Any] = {"files": [f"{p} ({p.stat().st_size} bytes)" for p in outputs], "stats": {}}
    reports = [p for p in outputs if p.suffix == ".nsys-rep"]
    if not reports:
        info["note"] = ("nsys produced no .nsys-rep report" + (" (only raw .qdstrm files: its importer "
                        "failed on this machine)" if outputs else "") + "; torch.profiler captures still work")
    for rep in reports[:MAX_REPORTS]:
        proc = await asyncio.create_subprocess_exec(
            nsys, "stats", "--report", "nvtx_sum,cuda_gpu_kern_sum", "--format", "csv",
            "--force-export=true", str(rep), stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
        try:
            out, _ = await asyncio.wait_for(proc.communicate(), STATS_TIMEOUT_S)
        except asyncio.TimeoutError:
            proc.kill()
            out = b"nsys stats timed out"
        target = rep.with_suffix(".stats.txt")
        target.write_bytes(out)
        info["stats"][rep.name] = str(target)
    return info
