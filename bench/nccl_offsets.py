"""Who waits for whom, read straight from the traces' NCCL kernel start times: a check on
ddptop's cross-rank view written apart from it (no ddptop import, a different method).

    python bench/nccl_offsets.py rank0.trace.json.gz rank1.trace.json.gz [--ddptop summary.json]

Each rank's NCCL kernels (GPU; or gloo's CPU ops on a CPU trace) in start order, the i-th of
every rank taken as one collective. The ranks' clocks are put on rank 0's by the median
difference of the collectives' ends (NCCL ends a collective on every rank within a few us).
Per collective, a rank waits from its own start until the last rank's start; the rest of its
kernel is transfer. ddptop instead takes each kernel's duration minus the shortest one (no
clock at all): the two agree when the ends line up. --ddptop takes a headless summary (the
last line of `ddptop --headless --json`) or a capture summary and prints both side by side.
"""

from __future__ import annotations

import argparse
import gzip
import json
import re
import statistics
import sys


def load(path):
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as f:
        return json.load(f)


def rank_of(path, trace):
    info = trace.get("distributedInfo") or {}
    if "rank" in info:
        return int(info["rank"])
    m = re.search(r"rank[_-]?(\d+)", path)
    if not m:
        sys.exit(f"nccl_offsets: cannot tell the rank of {path}")
    return int(m.group(1))


def collectives(trace):
    """(start, end) in us of the rank's NCCL kernels, else of its gloo ops, in start order."""
    events = [e for e in trace.get("traceEvents", []) if e.get("ph") == "X" and "dur" in e]
    kernels = [e for e in events if e.get("cat") == "kernel" and "nccl" in e.get("name", "").lower()]
    if not kernels:
        kernels = [e for e in events if e.get("name", "").startswith("gloo:")]
    return sorted((float(e["ts"]), float(e["ts"]) + float(e["dur"])) for e in kernels)


def offsets(per_rank):
    ranks = sorted(per_rank)
    n = min(len(v) for v in per_rank.values())
    ref = per_rank[ranks[0]]
    shift = {r: statistics.median(per_rank[r][i][1] - ref[i][1] for i in range(n)) for r in ranks}
    out = {r: {"comm_ms": 0.0, "wait_ms": 0.0, "transfer_ms": 0.0, "last_in": 0} for r in ranks}
    end_spread = []
    for i in range(n):
        start = {r: per_rank[r][i][0] - shift[r] for r in ranks}
        end = {r: per_rank[r][i][1] - shift[r] for r in ranks}
        last = max(start.values())
        end_spread.append(max(end.values()) - min(end.values()))
        out[max(ranks, key=lambda r: start[r])]["last_in"] += 1
        for r in ranks:
            dur = end[r] - start[r]
            out[r]["comm_ms"] += dur / 1000
            out[r]["wait_ms"] += (last - start[r]) / 1000
            out[r]["transfer_ms"] += (dur - (last - start[r])) / 1000
    for row in out.values():
        for k in ("comm_ms", "wait_ms", "transfer_ms"):
            row[k] = round(row[k], 3)
    counts = {r: len(v) for r, v in per_rank.items()}
    return {"collectives": n, "counts": counts, "end_spread_us_median": round(statistics.median(end_spread), 2),
            "ranks": out}


def ddptop_view(path):
    """ddptop's cross-rank view from a headless summary or a capture summary."""
    data = json.loads(open(path).read().strip().splitlines()[-1])
    if "captures" in data:
        data = (data["captures"] or [{}])[0].get("summary") or {}
    return (data.get("cross_rank") or {}).get("ranks") or {}


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("traces", nargs="+")
    p.add_argument("--ddptop", help="ddptop's summary of the same capture, to compare")
    a = p.parse_args()
    per_rank = {}
    for path in a.traces:
        trace = load(path)
        per_rank[rank_of(path, trace)] = collectives(trace)
    if len(per_rank) < 2 or min(len(v) for v in per_rank.values()) == 0:
        sys.exit("nccl_offsets: need two or more ranks' traces with collectives")
    res = offsets(per_rank)
    print(json.dumps(res))
    theirs = ddptop_view(a.ddptop) if a.ddptop else {}
    for r, row in sorted(res["ranks"].items()):
        line = (f"rank {r}: comm {row['comm_ms']:.3f} ms = wait {row['wait_ms']:.3f} + transfer "
                f"{row['transfer_ms']:.3f}; last to start {row['last_in']} of {res['collectives']}")
        d = theirs.get(str(r))
        if d:
            ratio = row["wait_ms"] / d["wait_ms"] if d.get("wait_ms") else None
            line += (f" | ddptop: wait {d['wait_ms']} transfer {d['transfer_ms']} late_in {d.get('late_in')}"
                     f" | wait offsets/ddptop {ratio:.3f}" if ratio else f" | ddptop: wait {d.get('wait_ms')}")
        print(line)


if __name__ == "__main__":
    main()
