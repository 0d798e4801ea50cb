"""Holistic Trace Analysis' straggler analysis on one capture (issue 28: does HTA name the
rank ddptop's cross-rank view names?). Needs `pip install HolisticTraceAnalysis` (0.5.0).

    python bench/investigations/hta_straggler.py CAPTURE_DIR_OR_TRACES...

HTA reads a folder of per-rank traces; the files given (or the folder's rank*.trace.json*)
are linked into a temporary one. Prints HTA's potential straggler (one candidate) and its
count over the capture's profiler steps.

HTA 0.5.0 takes communication kernels to be those named `ncclKernel*`; NCCL 2.19 and later
name them `ncclDevKernel*`, so on today's traces HTA finds none (an empty argmax). The copies
handed to HTA have `ncclDevKernel` renamed `ncclKernel`; nothing else changes.

Question: does HTA 0.5.0's straggler analysis name the rank ddptop names (issue 28)?
Answer (2026-11-26, 2x H200): yes on 3 captures (ranks 0, 1, 0, as ddptop), with NCCL's kernels
renamed for it; it fails on the PowerSGD capture.
Quoted in: docs/GPU.md, "Comm timing and who waits, against the traces (issues 28, 27)".
"""

from __future__ import annotations

import glob
import gzip
import json
import os
import sys
import tempfile


def main() -> None:
    from hta.trace_analysis import TraceAnalysis

    paths = sys.argv[1:]
    if len(paths) == 1 and os.path.isdir(paths[0]):
        paths = sorted(glob.glob(os.path.join(paths[0], "rank*.trace.json*")))
    with tempfile.TemporaryDirectory() as tmp:
        for p in paths:
            with (gzip.open if p.endswith(".gz") else open)(p, "rt") as f:
                trace = json.load(f)
            for e in trace.get("traceEvents", []):
                if e.get("name", "").startswith("ncclDevKernel"):
                    e["name"] = "ncclKernel" + e["name"][len("ncclDevKernel"):]
            with open(os.path.join(tmp, os.path.basename(p).removesuffix(".gz")), "w") as f:
                json.dump(trace, f)
        analyzer = TraceAnalysis(trace_dir=tmp)
        steps = analyzer.get_profiler_steps()
        stragglers = analyzer.get_potential_stragglers(num_candidates=1)
        print(json.dumps({"traces": [os.path.basename(p) for p in paths], "profiler_steps": [int(x) for x in steps],
                          "hta_stragglers": [int(r) for r in stragglers]}))


if __name__ == "__main__":
    main()
