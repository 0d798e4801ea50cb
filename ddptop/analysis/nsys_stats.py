"""nsys, the pure part: the `nsys profile` flags ddptop uses, which `nsys stats` reports to ask
for, what `nsys stats --format csv` tables say (kernels, NVTX ranges, memory operations), and
one-line reasons when the importer or stats fail. Text in, data out: no I/O, no torch."""

from __future__ import annotations

import csv
import io
import re
from typing import Any

# Cheap by default: CUDA API + kernels and NVTX only. No OS runtime trace, no CPU sampling, no
# context switches: those made a 2-step ViT-L window a 2.4 GB stream that held cudaProfilerStop
# for minutes. `repeat`: one report per capture window, the process keeps running.
DEFAULT_FLAGS = ("--trace=cuda,nvtx", "--sample=none", "--cpuctxsw=none", "--capture-range-end=repeat")
# Added only when this nsys knows them (`nsys profile --help`): trace this process tree only.
OPTIONAL_FLAGS = (("--cuda-trace-scope", "--cuda-trace-scope=process-tree"),)
FLAGS_ENV = "DDPTOP_NSYS_FLAGS"  # replaces DEFAULT_FLAGS (space separated), e.g. to measure others

# Reports asked of `nsys stats`, in this order, when the version lists them.
WANTED_REPORTS = ("cuda_gpu_kern_sum", "nvtx_sum", "cuda_gpu_mem_time_sum")
# NCCL / overlap reports are named differently across versions: any listed name with these in it.
EXTRA_REPORT = re.compile(r"nccl|overlap", re.I)
MAX_EXTRA_REPORTS = 2

# Communication kernels by name: NCCL's own (`ncclDevKernel_AllReduce_...`) and, with one rank,
# its `oneRankReduce` kernel (no "nccl" in the name). nsys tables carry no profiler args.
COMM_KERNEL = re.compile(r"nccl|onerank", re.I)
STEP_RANGE = re.compile(r"(?:^|:)(?:ddptop_step_|ProfilerStep#)(\d+)$")
TOP = 10
NAME_CHARS = 160

_UNITS = {"ns": 1e-6, "us": 1e-3, "µs": 1e-3, "ms": 1.0, "s": 1e3}
_COLUMN = re.compile(r"^\s*(?P<name>[^()]*?)\s*(?:\((?P<unit>[^)]*)\))?\s*$")
_ALIASES = {
    "time": "pct", "time%": "pct",
    "total time": "total", "total": "total",
    "instances": "count", "num calls": "count", "calls": "count", "count": "count", "num": "count",
    "avg": "avg", "average": "avg", "med": "med", "median": "med",
    "min": "min", "minimum": "min", "max": "max", "maximum": "max",
    "stddev": "std", "std dev": "std",
    "name": "name", "range": "name", "operation": "name",
    "style": "style",
}  # fmt: skip


# ---------------------------------------------------------------------------- profile flags


def profile_options(help_text: str) -> set[str]:
    """Long options `nsys profile --help` lists."""
    return set(re.findall(r"(?<![\w-])(--[a-z][a-z0-9-]+)", help_text))


def profile_flags(known: set[str] | None = None, override: str | None = None) -> list[str]:
    """Flags for `nsys profile` besides the capture range and output: ddptop's cheap defaults
    (or `override`, space separated), plus optional ones this nsys knows."""
    flags = override.split() if override and override.strip() else list(DEFAULT_FLAGS)
    given = {f.split("=", 1)[0] for f in flags}
    for option, flag in OPTIONAL_FLAGS:
        if known and option in known and option not in given:
            flags.append(flag)
    return flags


# ---------------------------------------------------------------------------- which reports


def available_reports(help_text: str) -> list[str]:
    """Report names from `nsys stats --help-reports` (`name[:args] -- Title` lines, or bare names)."""
    names: list[str] = []
    for line in help_text.splitlines():
        for m in re.finditer(r"(?:^|\s)([a-z][a-z0-9]*(?:_[a-z0-9]+)+)(?=[\s\[:]|$)", line):
            if m[1] not in names:
                names.append(m[1])
    return names


def choose_reports(available: list[str]) -> list[str]:
    """The reports to ask for: the wanted ones this version has (all of them when the list could
    not be read) and up to two NCCL/overlap reports."""
    if not available:
        return list(WANTED_REPORTS[:2])
    chosen = [r for r in WANTED_REPORTS if r in available]
    chosen += [r for r in available if EXTRA_REPORT.search(r) and r not in chosen][:MAX_EXTRA_REPORTS]
    return chosen


def stats_csv_name(base: str, report: str, nvtx: str | None = None) -> str:
    """The file `nsys stats --format csv --output BASE` writes for one report; with
    `--filter-nvtx RANGE`, nsys 2025.3 adds `_nvtx=RANGE` to the name (seen on the GPU machine,
    docs/measurements/2026-11-27-s9-call1)."""
    return f"{base}_{report.split(':', 1)[0]}{f'_nvtx={nvtx}' if nvtx else ''}.csv"


# ---------------------------------------------------------------------------- tables


def _column(header: str) -> tuple[str, float | None]:
    """'Total Time (ns)' -> ('total', ms per unit); 'Time (%)' -> ('pct', None)."""
    m = _COLUMN.match(header.replace("\ufeff", ""))
    name = (m["name"] if m else header).strip().lower()
    unit = (m["unit"] or "").strip().lower() if m else ""
    if unit == "%" and name == "time":
        return "pct", None
    if name.startswith("time(") and name.endswith("%)"):  # old 'Time(%)'
        return "pct", None
    key = _ALIASES.get(name, name.replace(" ", "_"))
    return key, _UNITS.get(unit, 1e-6 if key in ("total", "avg", "med", "min", "max", "std") else None)


def _number(text: str | None) -> float | None:
    if text is None:
        return None
    try:
        value = float(text.replace(",", "").strip())
    except ValueError:
        return None
    return value if value == value and abs(value) != float("inf") else None


def parse_table(text: str, max_rows: int = 100_000) -> list[dict[str, Any]]:
    """Rows of one `nsys stats` CSV table, keys normalised (name, count, total, avg, med, min,
    max, std in ms; pct; other columns as given). Lines before the header (nsys notices) and
    malformed rows are skipped; never raises."""
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if line.count(",") >= 2 and ("Name" in line or
                  "Range" in line or "Operation" in line or "Time" in line)), None)
    if start is None:
        return []
    reader = csv.reader(io.StringIO("\n".join(lines[start:])))
    try:
        header = next(reader)
    except (StopIteration, csv.Error):
        return []
    columns = [_column(h) for h in header]
    rows: list[dict[str, Any]] = []
    try:
        for cells in reader:
            if len(rows) >= max_rows:
                break
            if len(cells) != len(columns):
                continue
            row: dict[str, Any] = {}
            for (key, scale), cell in zip(columns, cells, strict=True):
                if key.startswith("_"):
                    continue
                if key in ("name", "style") or (scale is None and key != "pct" and key != "count"):
                    row[key] = cell
                    continue
                value = _number(cell)
                row[key] = value * scale if value is not None and scale is not None else value
            if row.get("name") is not None:
                rows.append(row)
    except csv.Error:
        pass
    return rows


def _entry(row: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {"name": str(row.get("name", "?"))[:NAME_CHARS]}
    for key in ("count", "total", "avg", "med", "min", "max", "std", "pct"):
        value = row.get(key)
        if value is not None:
            out["ms" if key == "total" else f"{key}_ms" if key not in ("count", "pct") else key] = (
                int(value) if key == "count" else round(value, 6))
    return out


def kernel_summary(rows: list[dict[str, Any]], top: int = TOP) -> dict[str, Any]:
    """cuda_gpu_kern_sum -> GPU kernel time, split communication (NCCL kernels, by name) and
    compute, and the top kernels with count/avg/min/max/std."""
    total = sum(r.get("total") or 0.0 for r in rows)
    comm_rows = [r for r in rows if COMM_KERNEL.search(str(r.get("name", "")))]
    comm = sum(r.get("total") or 0.0 for r in comm_rows)
    ranked = sorted(rows, key=lambda r: -(r.get("total") or 0.0))
    return {
        "kernel_ms": round(total, 3),
        "comm_ms": round(comm, 3),
        "compute_ms": round(total - comm, 3),
        "comm_share": round(comm / total, 4) if total else None,
        "kernels": sum(int(r.get("count") or 0) for r in rows),
        "comm_kernels": [_entry(r) for r in comm_rows[:top]],
        "top": [_entry(r) for r in ranked[:top]],
    }


def nvtx_summary(rows: list[dict[str, Any]], top: int = TOP) -> dict[str, Any]:
    """nvtx_sum -> the top ranges and the step ranges (ddptop_step_N, ProfilerStep#N) in ms."""
    steps: dict[int, float] = {}
    for r in rows:
        m = STEP_RANGE.search(str(r.get("name", "")))
        if m and r.get("total") is not None:
            steps[int(m[1])] = steps.get(int(m[1]), 0.0) + r["total"]
    ranked = sorted(rows, key=lambda r: -(r.get("total") or 0.0))
    return {"ranges": [_entry(r) for r in ranked[:top]],
            "steps": sorted(steps), "step_ms": [round(steps[s], 3) for s in sorted(steps)]}


def mem_summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """cuda_gpu_mem_time_sum -> memcpy/memset time by operation."""
    total = sum(r.get("total") or 0.0 for r in rows)
    return {"memory_ms": round(total, 3), "ops": [_entry(r) for r in rows[:TOP]]}


def table_summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Any other report (NCCL, overlap): its first rows as they are."""
    return {"rows": [{k: (round(v, 4) if isinstance(v, float) else str(v)[:NAME_CHARS])
                      for k, v in r.items()} for r in rows[:TOP]]}


SUMMARIZERS = {"cuda_gpu_kern_sum": kernel_summary, "nvtx_sum": nvtx_summary,
               "cuda_gpu_mem_time_sum": mem_summary}


def summarize_stats(tables: dict[str, str]) -> dict[str, Any]:
    """report name -> CSV text  =>  one rank's nsys summary (what the capture summary holds)."""
    out: dict[str, Any] = {}
    for report, text in tables.items():
        rows = parse_table(text)
        out[report] = SUMMARIZERS.get(report, table_summary)(rows)
    kern = out.get("cuda_gpu_kern_sum")
    if kern:
        out["comm_ms"] = kern["comm_ms"]
        out["compute_ms"] = kern["compute_ms"]
    return out


# ---------------------------------------------------------------------------- failures


_MISSING_LIB = re.compile(r"error while loading shared libraries: (?P<lib>[^:\s]+)")
LIB_PACKAGES = {"libdw.so.1": "libdw1", "libelf.so.1": "libelf1"}


def failure_line(what: str, output: str, rc: int | None, libs_env: str = "DDPTOP_NSYS_LIBS") -> str:
    """One line on why a tool (the importer, nsys stats) failed, from its output."""
    m = _MISSING_LIB.search(output)
    if m:
        lib = m["lib"]
        pkg = LIB_PACKAGES.get(lib)
        hint = f" (Debian/Ubuntu package {pkg})" if pkg else ""
        return (f"{what} cannot start: {lib} is missing{hint}; put it in a folder named by {libs_env}")
    lines = [_clean(line) for line in output.splitlines() if line.strip()]
    errors = [line for line in lines if re.search(r"error|fail|cannot|not found|denied", line, re.I)]
    said = (errors or lines or [""])[-1]
    code = f"exit code {rc}" if rc is not None else "no exit code"
    return f"{what} failed ({code})" + (f": {said[:200]}" if said else "")


def _clean(text: str) -> str:
    return re.sub(r"[\x00-\x1f\x7f]", " ", text).strip()


# ---------------------------------------------------------------------------- window cost


def window_cost(times: dict[str, float]) -> float:
    """Seconds a rank was held by nsys for one window: cudaProfilerStart plus cudaProfilerStop
    (each timed on the rank after a device sync, so it is nsys's own time)."""
    return round(sum(v for k, v in times.items() if k in ("start_s", "stop_s") and v >= 0), 3)


# ---------------------------------------------------------------------------- text


def _ms(value: Any) -> str:
    return "n/a" if value is None else f"{value:.1f} ms"


def rank_line(stats: dict[str, Any]) -> str:
    """One rank's nsys window in one line (the captures view and the headless summary)."""
    parts = []
    if stats.get("held_s") is not None:
        parts.append(f"held {stats['held_s']:.1f} s by nsys")
    kern = stats.get("cuda_gpu_kern_sum")
    if kern:
        share = f" ({kern['comm_share']:.0%})" if kern.get("comm_share") is not None else ""
        parts.append(f"kernels {_ms(kern['kernel_ms'])}, NCCL {_ms(kern['comm_ms'])}{share}")
        if kern.get("top"):
            parts.append(f"top {kern['top'][0]['name'][:48]} {_ms(kern['top'][0].get('ms'))}")
    mem = stats.get("cuda_gpu_mem_time_sum")
    if mem and mem.get("memory_ms"):
        parts.append(f"memcpy/memset {_ms(mem['memory_ms'])}")
    nvtx = stats.get("nvtx_sum")
    if nvtx and nvtx.get("steps"):
        parts.append(f"steps {nvtx['steps'][0]}-{nvtx['steps'][-1]}")
    if kern and stats.get("window_filter"):
        parts.append(f"figures over {stats['window_filter']}")
    if stats.get("problem"):
        parts.append(stats["problem"])
    return "; ".join(parts) or "no nsys statistics"
