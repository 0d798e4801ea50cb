"""Reading torch.profiler traces from disk: `.json`, `.json.gz`, a directory of them, each
summarised by ddptop.analysis.trace_analysis. Every bad input is one line (TraceError)."""

from __future__ import annotations

import gzip
import json
import re
import zlib
from pathlib import Path
from typing import Any

from ddptop.analysis.trace_analysis import analyze

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
