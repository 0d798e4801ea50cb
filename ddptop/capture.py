"""Capture windows, monitor side: the Capture record, parsing `--capture STEP:COUNT`,
finding nsys, and summarising the per-rank Chrome traces a window produced
(top ops/kernels, communication time, compute/communication overlap, step
times inside the window). Pure except `find_nsys` and `read_trace`."""

from __future__ import annotations

import json
import os
import re
import shutil
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

COMM = re.compile(r"nccl|all_?reduce|all_?gather|reduce_?scatter|gloo|c10d::", re.I)  # CPU ops (gloo)
# GPU kernels: NCCL's own names; with one rank NCCL's all-reduce kernel is `...onerank...Reduce...`
# (no "nccl" in it), but the profiler tags every collective kernel with its 'Collective name'
COMM_KERNEL = re.compile(r"nccl", re.I)
STEP = re.compile(r"^ddptop_step_(\d+)$")
NSYS_FALLBACKS = ("/opt/nvidia/nsight-compute/2025.3.1/host/target-linux-x64/nsys",
                  "/opt/nvidia/nsight-systems/bin/nsys", "/usr/local/cuda/bin/nsys")


@dataclass
class Capture:
    capture_id: int
    start: int
    count: int
    profiler: str  # torch | nsys
    out_dir: str
    status: str = "scheduled"  # scheduled, recording, processing, done, failed
    ranks: dict[int, str] = field(default_factory=dict)  # rank -> recording/written/failed
    files: dict[int, list[str]] = field(default_factory=dict)
    error: str = ""
    summary: dict[str, Any] | None = None

    @property
    def steps(self) -> str:
        return f"{self.start}-{self.start + self.count - 1}"

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.capture_id, "steps": self.steps, "profiler": self.profiler, "status": self.status,
                "dir": self.out_dir, "files": self.files, "error": self.error, "summary": self.summary}


def parse_capture_spec(spec: str, steps: int) -> tuple[int, int]:
    """`STEP:COUNT` -> (start, count); ValueError with a one-line reason."""
    start, sep, count = spec.partition(":")
    if not sep or not start.isdigit() or not count.isdigit():
        raise ValueError(f"--capture expects STEP:COUNT (e.g. 10:3), got {spec!r}")
    first, n = int(start), int(count)
    if n < 1:
        raise ValueError(f"--capture {spec}: COUNT must be at least 1")
    if first + n > steps:
        raise ValueError(f"--capture {spec}: steps {first}-{first + n - 1} are past the run's {steps} steps")
    return first, n


def find_nsys(explicit: str | None = None) -> str | None:
    if explicit:
        return explicit if os.access(explicit, os.X_OK) else None
    found = shutil.which("nsys")
    if found:
        return found
    return next((p for p in NSYS_FALLBACKS if os.access(p, os.X_OK)), None)


def union_length(spans: list[tuple[float, float]]) -> float:
    return sum(e - s for s, e in merge(spans))


def merge(spans: list[tuple[float, float]]) -> list[tuple[float, float]]:
    out: list[tuple[float, float]] = []
    for s, e in sorted(spans):
        if out and s <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], e))
        else:
            out.append((s, e))
    return out


def intersection_length(a: list[tuple[float, float]], b: list[tuple[float, float]]) -> float:
    a, b = merge(a), merge(b)
    i = j = 0
    total = 0.0
    while i < len(a) and j < len(b):
        lo, hi = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        total += max(0.0, hi - lo)
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return total


def summarize_trace(trace: dict[str, Any], top: int = 10) -> dict[str, Any]:
    """One rank's torch.profiler Chrome trace -> what the window shows (times in ms)."""
    events = [e for e in trace.get("traceEvents", []) if e.get("ph") == "X" and "dur" in e]
    steps = {}
    for e in events:
        m = STEP.match(str(e.get("name", "")))
        if m and e.get("cat") == "user_annotation":
            steps[int(m.group(1))] = e["dur"] / 1000.0
    kernels = [e for e in events if e.get("cat") == "kernel"]
    ops = kernels or [e for e in events if e.get("cat") == "cpu_op"]
    span = lambda e: (float(e["ts"]), float(e["ts"]) + float(e["dur"]))  # noqa: E731
    comm = [span(e) for e in ops if is_comm(e)]
    compute = [span(e) for e in kernels if not is_comm(e)]
    by_name: dict[str, float] = defaultdict(float)
    for e in ops:
        by_name[str(e.get("name", "?"))] += e["dur"] / 1000.0
    ranked = sorted(by_name.items(), key=lambda kv: -kv[1])[:top]
    return {
        "source": "gpu kernels" if kernels else "cpu ops",
        "steps": sorted(steps),
        "step_ms": [round(steps[s], 3) for s in sorted(steps)],
        "comm_ms": round(union_length(comm) / 1000.0, 3),
        "compute_ms": round(union_length(compute) / 1000.0, 3) if kernels else None,
        "overlap_ms": round(intersection_length(comm, compute) / 1000.0, 3) if kernels else None,
        "top": [{"name": n[:120], "ms": round(ms, 3)} for n, ms in ranked],
    }


def is_comm(event: dict[str, Any]) -> bool:
    """A communication kernel (or, in a CPU-only trace, a collective op)."""
    name = str(event.get("name", ""))
    if event.get("cat") == "kernel":
        args = event.get("args")
        return bool(COMM_KERNEL.search(name)) or (isinstance(args, dict) and "Collective name" in args)
    return bool(COMM.search(name))


def read_trace(path: str) -> dict[str, Any]:
    if path.endswith(".gz"):
        import gzip

        with gzip.open(path, "rt") as f:
            return json.load(f)
    return json.loads(Path(path).read_text())


def summarize_capture(files: dict[int, list[str]]) -> dict[str, Any]:
    """Per-rank summaries of a capture's trace files; unreadable files are named."""
    ranks: dict[str, Any] = {}
    for rank, paths in sorted(files.items()):
        traces = [p for p in paths if p.endswith((".json", ".json.gz"))]
        if not traces:
            ranks[str(rank)] = {"files": paths, "note": "no trace to summarise (nsys writes its own report)"}
            continue
        try:
            ranks[str(rank)] = summarize_trace(read_trace(traces[0]))
        except (OSError, ValueError) as exc:
            ranks[str(rank)] = {"error": f"cannot read {traces[0]}: {exc}"}
    comm = [r["comm_ms"] for r in ranks.values() if "comm_ms" in r]
    return {"ranks": ranks, "comm_ms_mean": round(sum(comm) / len(comm), 3) if comm else None}


def compare_with_timer(summary: dict[str, Any], records: dict[int, list[dict[str, float]]],
                       steps: range) -> None:
    """Put ddptop's own comm timer for the window's steps next to what the trace saw, per rank
    (`timer_comm_ms`, and `timer_vs_trace` = timer / trace): the live comm figure checked
    against the profiler on exactly the same steps."""
    for rank, recs in records.items():
        entry = summary.get("ranks", {}).get(str(rank))
        window = [r for r in recs if int(r.get("step", -1)) in steps and "comm_ms" in r]
        if entry is None or not window:
            continue
        ours = sum(r["comm_ms"] for r in window)
        entry["timer_comm_ms"] = round(ours, 3)
        entry["timer_steps"] = len(window)
        trace = entry.get("comm_ms")
        if trace:
            entry["timer_vs_trace"] = round(ours / trace, 3)
    ratios = [r["timer_vs_trace"] for r in summary.get("ranks", {}).values() if "timer_vs_trace" in r]
    if ratios:
        summary["timer_vs_trace_mean"] = round(sum(ratios) / len(ratios), 3)


def nsys_window_at(captures: Iterable[Capture], last_step: int) -> Capture | None:
    """The nsys capture whose window starts or ends where the ranks stand (`last_step` is the
    last step they reported; a window's last step is reported only after cudaProfilerStop
    returns): a stall there is nsys starting, or writing what it recorded."""
    for cap in captures:
        if cap.profiler == "nsys" and cap.start <= last_step + 1 < cap.start + cap.count:
            return cap
    return None


def nsys_files_by_rank(paths: list[Path]) -> dict[int, list[str]]:
    """nsys outputs (named nsys_rank<RANK>...) grouped by rank."""
    out: dict[int, list[str]] = {}
    for path in paths:
        m = re.match(r"nsys_rank(\d+)", path.name)
        if m:
            out.setdefault(int(m.group(1)), []).append(str(path))
    return out


def nsys_outputs(captures_dir: Path) -> list[Path]:
    """What nsys left for the capture windows: reports (.nsys-rep) or raw streams (.qdstrm)."""
    return sorted(p for p in captures_dir.glob("nsys_rank*") if p.suffix in (".nsys-rep", ".qdstrm", ".sqlite"))
