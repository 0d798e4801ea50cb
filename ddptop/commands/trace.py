"""Reading torch.profiler traces from disk (`.json`, `.json.gz`, a directory of them) and the
`ddptop trace` command that prints ddptop.analysis.trace_analysis's summary of each. Every bad input
is one line (TraceError) and exit code 2; nothing is written."""

from __future__ import annotations

import gzip
import json
import os
import re
import sys
import zlib
from pathlib import Path
from typing import Any

from ddptop.analysis.trace_analysis import OPEN_WITH, analyze
from ddptop.model.report import NA, fmt, table
from ddptop.model.usage import USAGE_EXIT, OneLineParser, UsageError

SUFFIXES = (".json", ".json.gz")


class TraceError(ValueError):
    """A file that is missing, unreadable or not a torch.profiler trace; one line."""


def read_trace(path: str | Path) -> dict[str, Any]:
    """A Chrome trace as JSON (gzipped or not); a bare event list comes back as traceEvents."""
    path = Path(path)
    try:
        if path.name.endswith(".gz"):
            with gzip.open(path, "rb") as f:
                data = json.load(f)
        else:
            with open(path, "rb") as f:
                data = json.load(f)
    except FileNotFoundError:
        raise TraceError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise TraceError(f"{path}: is a directory") from None
    except (EOFError, gzip.BadGzipFile, zlib.error) as exc:
        raise TraceError(f"{path}: truncated or corrupt gzip ({exc})") from None
    except OSError as exc:
        raise TraceError(f"{path}: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise TraceError(f"{path}: not a text trace (binary data where JSON was expected)") from None
    except json.JSONDecodeError as exc:
        raise TraceError(f"{path}: not JSON ({exc.msg} at line {exc.lineno} column {exc.colno})") from None
    except RecursionError:
        raise TraceError(f"{path}: not a trace (JSON nested too deep)") from None
    if isinstance(data, list):
        data = {"traceEvents": data}
    if not isinstance(data, dict) or not isinstance(data.get("traceEvents"), list):
        raise TraceError(f"{path}: not a torch.profiler trace (no traceEvents)")
    return data


def _natural(path: Path) -> list[Any]:
    return [int(p) if p.isdigit() else p for p in re.split(r"(\d+)", path.name)]


def trace_paths(targets: list[str]) -> list[Path]:
    """Files named, and the `*.json` / `*.json.gz` files of directories named (not recursive)."""
    out: list[Path] = []
    for target in targets:
        path = Path(target)
        if path.is_dir():
            found = sorted((p for p in path.iterdir() if p.is_file() and p.name.endswith(SUFFIXES)), key=_natural)
            if not found:
                raise TraceError(f"{path}: no torch.profiler traces (*.json, *.json.gz) in this directory")
            out.extend(found)
        elif path.exists():
            out.append(path)
        else:
            raise TraceError(f"{path}: no such file or directory")
    return out


def summarize_files(targets: list[str], top: int = 10) -> list[dict[str, Any]]:
    """Each trace's summary with its `file`. Files found in a directory that are JSON but not
    traces (a capture's summary.json) are left out; anything else wrong is a TraceError."""
    named = {Path(t) for t in targets}
    out = []
    for path in trace_paths(targets):
        try:
            trace = read_trace(path)
        except TraceError as exc:
            if path not in named and "no traceEvents" in str(exc):
                continue
            raise
        try:
            summary = analyze(trace, top=top)
        except ValueError as exc:
            raise TraceError(f"{path}: {exc}") from None
        out.append({"file": str(path), **summary})
    if not out:
        raise TraceError(f"no torch.profiler traces in {' '.join(targets)}")
    return out


# ---------------------------------------------------------------------------- text


def _ms_pct(s: dict[str, Any], key: str) -> str:
    ms, pct = s.get(f"{key}_ms"), s.get(f"{key}_pct")
    if ms is None:
        return NA
    return f"{ms:.1f} ({fmt(pct, '.0f')}%)"


def _short(name: str, width: int = 72) -> str:
    return name if len(name) <= width else name[: width - 1] + "…"


def _steps(s: dict[str, Any]) -> str:
    steps = s.get("steps") or []
    if not steps:
        return "-"
    return f"{steps[0]}-{steps[-1]}" if len(steps) > 1 else str(steps[0])


def render(summaries: list[dict[str, Any]], top: int = 5) -> str:
    """The table (one row per trace), then each trace's streams and top kernels."""
    rows = []
    for s in summaries:
        rows.append([
            "-" if s.get("rank") is None else str(s["rank"]), Path(s["file"]).name, s["source"], fmt(s.get("window_ms"), ".1f"),
            fmt(s.get("busy_ms"), ".1f"), _ms_pct(s, "idle"), _ms_pct(s, "compute"), _ms_pct(s, "comm"),
            _ms_pct(s, "memory"), fmt(s.get("overlap_ms"), ".1f"), fmt(s.get("comm_memory_overlap_ms"), ".1f"),
            _steps(s),
        ])
    out = [table(["rank", "file", "src", "window ms", "busy ms", "idle ms (%)", "compute ms (%)", "comm ms (%)",
                  "memory ms (%)", "comm∩comp", "comm∩mem", "steps"], rows)]
    for s in summaries:
        out.append("")
        by = ", ".join(f"{n} by {k}" for k, n in sorted((s.get("comm_by") or {}).items()))
        head = f"{s['file']}  ({s['source']}"
        if s.get("step_ms"):
            head += ", step ms " + " ".join(f"{v:.1f}" for v in s["step_ms"])
        if s.get("comm_call_ms") is not None:
            head += f"; comm from call to kernel end {s['comm_call_ms']:.1f} ms"
        out.append(head + (f"; comm: {by}" if by else "") + ")")
        if s.get("note"):
            out.append(f"  {s['note']}")
        streams = s.get("streams") or []
        if streams:
            out.append(_indent(table(["device", "stream", "kernels", "busy ms", "idle ms", "host wait", "kernel wait",
                                      "other"],
                                     [[st["device"], st["stream"], st["kernels"], fmt(st["busy_ms"], ".1f"),
                                       fmt(st["idle_ms"], ".1f"), fmt(st["host_wait_ms"], ".1f"),
                                       fmt(st["kernel_wait_ms"], ".1f"), fmt(st["other_wait_ms"], ".1f")]
                                      for st in streams])))
        kernels = (s.get("top") or [])[:top]
        if kernels:
            out.append(_indent(table(["kind", "count", "total ms", "mean ms", "std", "min", "max", "name"],
                                     [[k["kind"], k["count"], fmt(k["ms"], ".2f"), fmt(k["mean_ms"], ".3f"),
                                       fmt(k["std_ms"], ".3f"), fmt(k["min_ms"], ".3f"), fmt(k["max_ms"], ".3f"),
                                       _short(k["name"])] for k in kernels])))
    out.append("")
    sources = {s["source"] for s in summaries}
    if "gpu" in sources:
        out.append("gpu: window = first kernel start to last end, idle = window - busy; per stream, HTA's split: "
                   "host wait (launched after the previous kernel ended), kernel wait (gap < 30 us), other")
    if "cpu" in sources:
        out.append("cpu (no GPU activity in the trace): window = first to last op, busy = an op or a collective "
                   "(gloo:*, c10d::*) running")
    return "\n".join(out)


def _indent(text: str) -> str:
    return "\n".join("  " + line for line in text.splitlines())


def main_trace(argv: list[str]) -> int:
    """`ddptop trace DIR|FILE... [--json] [--top N]`."""
    ap = OneLineParser(prog="ddptop trace",
                       description="Summarize torch.profiler traces (.json, .json.gz; a directory = its traces): "
                       "GPU window, busy/idle (host vs kernel wait per stream), compute/comm/memory and "
                       "their overlap, top kernels, steps.")
    ap.add_argument("paths", nargs="+", metavar="DIR|FILE")
    ap.add_argument("--json", action="store_true", help="print the summaries as JSON")
    ap.add_argument("--top", type=int, default=5, help="kernels (or CPU ops) listed per trace (default 5)")
    try:
        args = ap.parse_args(argv)
        if not 1 <= args.top <= 1000:
            raise UsageError(f"--top must be 1-1000, got {args.top}")
        summaries = summarize_files(args.paths, top=args.top)
    except (UsageError, TraceError) as exc:
        print(f"ddptop trace: error: {exc}", file=sys.stderr)
        return USAGE_EXIT
    text = json.dumps({"traces": summaries, "open_with": OPEN_WITH}, indent=1) if args.json \
        else render(summaries, top=args.top)
    try:
        print(text, flush=True)
    except BrokenPipeError:  # `ddptop trace DIR | head`
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 0
