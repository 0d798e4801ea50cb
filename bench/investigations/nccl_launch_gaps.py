"""Why NCCL's own timing of a short collective reads longer than its kernel (issue 27).

NCCL's timing (TORCH_NCCL_ENABLE_TIMING, ddptop's `comm_ms` on a GPU) runs from a start event
ProcessGroupNCCL records on the NCCL stream before it launches the collective to an end event
after it. The kernel starts later than that start event by the time between the host's
record and its launch, when nothing else holds the stream: on a rank whose collectives wait for
nothing (the rank the others wait for) and whose kernels are short, that gap is a visible share.
This reads a torch.profiler trace of one rank and prints, for its all-reduce kernels: how many,
their kernel time, the median gap from NCCL's start-event record (the host call, on the
launching thread, before the launch) to the kernel's start, and NCCL's span rebuilt from the
trace (each kernel's end minus the latest of: the start event's record, the NCCL stream's
previous work, the compute work launched before it). Compare the last with ddptop's
`timer_comm_ms` for the same window (the capture's summary).

    python bench/investigations/nccl_launch_gaps.py captures/1/rank*.trace.json.gz

Question: why does NCCL's timing of a short collective read longer than its kernel?
Answer (2026-11-26, 2x H200 traces): the launch: each kernel starts 13-19 us (p50) after NCCL
recorded its start event, 15-46 us of timer excess a collective. tests/bench/test_nccl_launch_gaps.py
runs it on a committed trace.
Quoted in: docs/GPU.md, "Why a short collective's timer reads longer than its kernel".
"""

from __future__ import annotations

import bisect
import gzip
import json
import statistics
import sys
from pathlib import Path
from typing import Any


def load(path: str) -> list[dict[str, Any]]:
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as f:
        return json.load(f)["traceEvents"]


def gaps(events: list[dict[str, Any]]) -> dict[str, float]:
    """All-reduce kernels, their time, the start gaps and NCCL's span rebuilt (ms, µs)."""
    kernels = sorted((e for e in events if e.get("cat") == "kernel" and "nccl" in e["name"].lower()
                      and "AllReduce" in e["name"]), key=lambda e: e["ts"])
    calls = {e["args"].get("correlation"): e for e in events if e.get("cat") in ("cuda_runtime", "cuda_driver")}
    records = sorted((e for e in events if e.get("cat") == "cuda_runtime" and e["name"].startswith("cudaEventRecord")),
                     key=lambda e: e["ts"])
    at = [e["ts"] for e in records]
    device = sorted((e for e in events if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")), key=lambda e: e["ts"])
    stream = kernels[0]["args"]["stream"] if kernels else None
    # the compute side: each op's launch call and the latest end of the ops launched so far
    compute = sorted((calls[g["args"]["correlation"]]["ts"], g["ts"] + g["dur"]) for g in device
                     if g["args"].get("stream") != stream and g["args"].get("correlation") in calls)
    launched = [c[0] for c in compute]
    done, latest = [], 0.0
    for _, end in compute:
        latest = max(latest, end)
        done.append(latest)
    kernel_us = span_us = 0.0
    start_gaps = []
    for k in kernels:
        launch = calls.get(k["args"]["correlation"])
        i = bisect.bisect_left(at, launch["ts"]) - 1 if launch else -1
        while i >= 0 and records[i]["tid"] != launch["tid"]:
            i -= 1
        if i < 0:
            continue
        recorded = records[i]["ts"] + records[i]["dur"]
        before = max((g["ts"] + g["dur"] for g in device if g["args"].get("stream") == stream
                      and g is not k and g["ts"] + g["dur"] <= k["ts"] + 1e-3), default=0.0)
        j = bisect.bisect_left(launched, records[i]["ts"]) - 1
        start = min(max(recorded, before, done[j] if j >= 0 else 0.0), k["ts"])
        if start == recorded:  # nothing held the stream: the gap is the launch's alone
            start_gaps.append(k["ts"] - recorded)
        kernel_us += k["dur"]
        span_us += k["ts"] + k["dur"] - start
    return {"kernels": len(kernels), "kernel_ms": kernel_us / 1000, "span_ms": span_us / 1000,
            "idle_starts": len(start_gaps), "gap_us_p50": statistics.median(start_gaps) if start_gaps else float("nan")}


def main(argv: list[str] | None = None) -> int:
    paths = sys.argv[1:] if argv is None else argv
    if not paths:
        print("usage: nccl_launch_gaps.py TRACE.json[.gz] ...", file=sys.stderr)
        return 2
    for path in paths:
        g = gaps(load(path))
        print(f"{Path(path).name}: {g['kernels']} all-reduce kernels, {g['kernel_ms']:.3f} ms; NCCL's span rebuilt "
              f"{g['span_ms']:.3f} ms; start gap on an idle stream p50 {g['gap_us_p50']:.1f} us ({g['idle_starts']} kernels)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
