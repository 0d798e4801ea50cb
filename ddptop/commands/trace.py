"""`ddptop trace DIR|FILE... [--json]`, `ddptop trace A B --diff`: ddptop.analysis.trace_analysis's summary of each
torch.profiler trace (ddptop.run.trace_files reads them). Every bad input is one line and exit
code 2; nothing is written."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path
from typing import Any

from ddptop.analysis.capture import discount_late
from ddptop.analysis.cross_rank import describe
from ddptop.analysis.hook_work import describe_hook
from ddptop.analysis.trace_analysis import OPEN_WITH
from ddptop.analysis.trace_diff import describe_diff
from ddptop.model.capture import perturbation_line
from ddptop.model.report import NA, fmt, table
from ddptop.model.text import printable
from ddptop.model.usage import USAGE_EXIT, OneLineParser, UsageError
from ddptop.run.trace_files import (
    SUFFIXES,
    TraceError,
    read_trace,
    summarize_files,
    trace_paths,
)
from ddptop.run.trace_job import diff_in_child, run_job
from ddptop.run.untrusted import read_json_object

__all__ = ["SUFFIXES", "TraceError", "main_trace", "read_trace", "render", "summarize_files", "trace_paths"]


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


def render(summaries: list[dict[str, Any]], top: int = 5, cross: dict[str, Any] | None = None,
           said: list[str] | None = None) -> str:
    """The table (one row per trace), what the capture's summary says the profiler did to its
    steps (`said`), who waits for whom (`cross`: several ranks' traces), then each trace's
    streams and top kernels."""
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
    out.extend(said or [])
    if cross is not None:
        out.extend(["", *describe(cross)])
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
        if s.get("dropped_note"):
            out.append(f"  {s['dropped_note']}")
        if s.get("bound"):
            out.append(f"  {s['bound']['verdict']}")
        if describe_hook(s):
            out.append(f"  {describe_hook(s)}")
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


def trace_parser() -> OneLineParser:
    ap = OneLineParser(prog="ddptop trace",
                       description="Summarize torch.profiler traces (.json, .json.gz; a directory = its traces): "
                       "GPU window, busy/idle (host vs kernel wait per stream), compute/comm/memory and "
                       "their overlap, top kernels, steps.")
    ap.add_argument("paths", nargs="+", metavar="DIR|FILE")
    ap.add_argument("--json", action="store_true", help="print the summaries as JSON")
    ap.add_argument("--top", type=int, default=5, help="kernels (or CPU ops) listed per trace (default 5)")
    ap.add_argument("--diff", action="store_true", help="compare two captures A B (each a DIR or FILE): per rank, "
                    "each kernel class and the kernels that got faster or slower")
    return ap


def main_trace(argv: list[str]) -> int:
    """`ddptop trace DIR|FILE... [--json] [--top N]`."""
    try:
        args = trace_parser().parse_args(argv)
        if not 1 <= args.top <= 1000:
            raise UsageError(f"--top must be 1-1000, got {args.top}")
        if args.diff:
            if len(args.paths) != 2:
                raise UsageError(f"--diff compares two captures A B, got {len(args.paths)} paths")
            d = asyncio.run(diff_in_child(args.paths[0], args.paths[1], kernels=args.top))
            return _print(json.dumps(d, indent=1) if args.json else "\n".join(describe_diff(d)))
        summaries, cross = _summaries(args.paths, args.top)
    except (UsageError, TraceError) as exc:
        print(f"ddptop trace: error: {printable(str(exc))}", file=sys.stderr)  # it names a file
        return USAGE_EXIT
    said_of = {p: _capture_said(Path(p)) for p in args.paths}  # each summary.json read once
    profiled = {p: said[0] for p, said in said_of.items() if said[0] is not None}
    if len(args.paths) == 1 and args.paths[0] in profiled:  # one capture: who-waits as its summary says it
        perturbed, steps, unprofiled = said_of[args.paths[0]]
        if steps:
            discount_late(cross, perturbed, steps, unprofiled)
    if args.json:
        text = json.dumps({"traces": summaries, "cross_rank": cross, "open_with": OPEN_WITH,
                           "perturbation": profiled}, indent=1)
    else:
        text = render(summaries, top=args.top, cross=cross,
                      said=[f"{p}: {perturbation_line(said)} (the capture's summary.json)" for p, said in profiled.items()])
    return _print(text)


def _summaries(paths: list[str], top: int) -> tuple[list[dict[str, Any]], dict[str, Any] | None]:
    """summarize_traces, read in the memory-limited child (ddptop.run.trace_job): a trace built
    to explode (300k nested `[`) ends there in one line, not here in a traceback."""
    result, _ = asyncio.run(run_job({"op": "traces", "paths": paths, "top": top}))
    if not (isinstance(result, list) and len(result) == 2 and isinstance(result[0], list)):
        raise TraceError("trace summary process answered no summaries")
    return result[0], result[1]


def _capture_said(path: Path) -> tuple[dict[str, Any] | None, int, str | None]:
    """What ddptop's capture summary (summary.json beside a capture's traces) says: what the
    profiler did to the steps it recorded (None where there is none or it is not as ddptop
    writes it), and what the capture's own who-waits was discounted with: its recorded steps and
    the run's straggler on its unprofiled steps (None: none). A summary written before those
    were kept: the steps from its "A-B" range, no straggler."""
    data = (read_json_object(path / "summary.json") if path.is_dir() else None) or {}
    said = data.get("summary")
    said = said if isinstance(said, dict) else {}
    perturbed = said.get("perturbation")
    numbers = isinstance(perturbed, dict) and all(
        isinstance(perturbed.get(k), (int, float)) and not isinstance(perturbed.get(k), bool)
        for k in ("profiled_ms", "unprofiled_ms")) and isinstance(perturbed.get("pct"), (int, float, type(None)))
    steps, unprofiled = said.get("window_steps"), said.get("unprofiled_straggler")
    if not (isinstance(steps, int) and not isinstance(steps, bool)):
        first, _, last = str(data.get("steps", "")).partition("-")
        steps = int(last) - int(first) + 1 if first.isdigit() and last.isdigit() else 0
    return (perturbed if numbers else None, max(steps, 0),
            printable(unprofiled) if isinstance(unprofiled, str) else None)


def _print(text: str) -> int:
    try:  # file, stream and kernel names are a trace's bytes: shown as text, never obeyed
        print(printable(text, newlines=True), flush=True)
    except BrokenPipeError:  # `ddptop trace DIR | head`
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 0
