"""Reading torch.profiler traces from disk: `.json`, `.json.gz`, a directory of them, each
summarised by ddptop.analysis.rank_trace (one at a time: only the summary and the collectives
are kept), and the ranks' cross-rank view. Every bad input is one line (TraceError).

A trace is streamed (ijson: one event at a time, only what the analyses read is kept), so a
200 MB trace is summarised in a few hundred MB, not five times its size. What the strict
streamed parser refuses (NaN or 1e400 where Python's json reads nan and inf, integers past 64
bits, a byte-order mark, anything malformed) is read whole with Python's json as before: the
same summary, or the same one-line error. The one known difference: a lone UTF-16 surrogate
escape in a name (`\\ud800`) streams as '?'."""

from __future__ import annotations

import gzip
import io
import json
import re
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import ijson

from ddptop.analysis.capture import capture_summary
from ddptop.analysis.rank_trace import RankTrace, capture_cross_rank, rank_trace, rank_trace_of
from ddptop.analysis.trace_diff import diff
from ddptop.run.untrusted import open_regular

SUFFIXES = (".json", ".json.gz")


class TraceError(ValueError):
    """A file that is missing, unreadable or not a torch.profiler trace; one line."""


def read_trace(path: str | Path) -> dict[str, Any]:
    """A Chrome trace as JSON (gzipped or not); a bare event list comes back as traceEvents."""
    path = Path(path)
    try:
        with _open(path) as f:
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
        if exc.doc.strip() == "":
            raise TraceError(f"{path}: empty (no trace was written)") from None
        raise TraceError(f"{path}: not JSON ({exc.msg} at line {exc.lineno} column {exc.colno})") from None
    except RecursionError:
        raise TraceError(f"{path}: not a trace (JSON nested too deep)") from None
    except TraceError:
        raise
    except ValueError as exc:  # an integer of thousands of digits, past Python's limit
        raise TraceError(f"{path}: not a trace ({str(exc).split(':')[0]})") from None
    if isinstance(data, list):
        data = {"traceEvents": data}
    if not isinstance(data, dict) or not isinstance(data.get("traceEvents"), list):
        raise TraceError(f"{path}: not a torch.profiler trace (no traceEvents)")
    return data


def _open(path: Path) -> gzip.GzipFile | io.BufferedReader:
    """The trace file, if it is a regular file (a FIFO would block the open for good)."""
    if Path(path).is_dir():
        raise IsADirectoryError(path)
    fd = open_regular(path, follow=True)  # a link the user named is theirs to follow
    if fd is None:
        if not Path(path).exists():
            raise FileNotFoundError(path)
        raise TraceError(f"{path}: not a regular file")
    if not path.name.endswith(".gz"):
        return open(fd, "rb")  # noqa: SIM115 - returned open, closed by the caller's with
    raw = open(fd, "rb", buffering=0)  # noqa: SIM115 - gzip buffers
    gz = gzip.GzipFile(fileobj=raw, mode="rb")
    gz.myfileobj = raw  # closed with it, as gzip.open(path) does with the file it opens
    return gz


def _events_prefix(path: Path) -> str | None:
    """Where a trace's events are ('item' for a bare list, 'traceEvents.item'), read from the
    tokens before them; None for anything else (read whole: its error says what it is)."""
    with _open(path) as f:
        for prefix, event, _ in ijson.parse(f, use_float=True):
            if prefix == "":
                if event == "start_array":
                    return "item"
                if event != "start_map" and event != "map_key":
                    return None  # a scalar, or the object ended without traceEvents
            elif prefix == "traceEvents":
                return "traceEvents.item" if event == "start_array" else None
    return None


def _meta(path: Path) -> dict[str, Any] | None:
    """distributedInfo (torch writes it before the events: found without reading them)."""
    with _open(path) as f:
        meta = next(ijson.items(f, "distributedInfo", use_float=True), None)
    return meta if isinstance(meta, dict) else None


def _stream(path: Path, prefix: str) -> Iterator[Any]:
    with _open(path) as f:
        yield from ijson.items(f, prefix, use_float=True)


def streamed_rank_trace(path: Path, top: int = 10) -> RankTrace | None:
    """One rank's trace read as a stream; None where the streamed parser cannot (see above)."""
    try:
        prefix = _events_prefix(path)
        if prefix is None:
            return None
        return rank_trace_of(_stream(path, prefix), _meta(path) if prefix != "item" else None, top)
    except MemoryError:
        raise
    except Exception:  # noqa: BLE001 - ijson's errors, a bad gzip...: the whole read says it exactly
        return None


def read_rank_trace(path: Path, top: int = 10) -> RankTrace:
    """One rank's trace summarised, streamed where it can be; TraceError (one line) when it is
    not a trace."""
    view = streamed_rank_trace(path, top)
    return view if view is not None else _rank_trace(path, read_trace(path), top)


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
    """Each trace's summary with its `file` (see `summarize_traces`)."""
    return summarize_traces(targets, top)[0]


def summarize_traces(targets: list[str], top: int = 10) -> tuple[list[dict[str, Any]], dict[str, Any] | None]:
    """Each trace's summary with its `file`, and the cross-rank view when the traces are of
    different ranks (their distributedInfo says which; else their order). Files found in a
    directory that are JSON but not traces (a capture's summary.json) are left out; anything
    else wrong is a TraceError."""
    named = {Path(t) for t in targets}
    out, views = [], []
    for path in trace_paths(targets):
        try:
            view = read_rank_trace(path, top)
        except TraceError as exc:
            if path not in named and "no traceEvents" in str(exc):
                continue
            raise
        views.append(view)
        out.append({"file": str(path), **view.summary})
    if not out:
        raise TraceError(f"no torch.profiler traces in {' '.join(targets)}")
    if all(s.get("window_ms") is None for s in out):
        why = "; ".join(f"{Path(s['file']).name}: {s.get('dropped_note') or s.get('note')}" for s in out)
        raise TraceError(f"nothing usable: {why}")
    named_ranks = [v.summary.get("rank") for v in views]
    ranks: list[int] = list(range(len(views)))
    if len(set(named_ranks)) == len(named_ranks) and all(isinstance(r, int) for r in named_ranks):
        ranks = [int(r) for r in named_ranks if isinstance(r, int)]
    return out, capture_cross_rank(dict(zip(ranks, views, strict=True)))


def _rank_trace(path: Path, trace: dict[str, Any], top: int) -> RankTrace:
    try:
        return rank_trace(trace, top=top)
    except ValueError as exc:
        raise TraceError(f"{path}: {exc}") from None


def summarize_capture_traces(files: dict[int, list[str]], top: int = 10) -> dict[str, Any]:
    """A capture window's summary: each rank's trace summarised (one read at a time), the
    cross-rank view of them; unreadable files are named, nsys windows get theirs from
    ddptop.run.nsys.attach_nsys."""
    ranks: dict[str, Any] = {}
    views: dict[int, RankTrace] = {}
    for rank, paths in sorted(files.items()):
        traces = [p for p in paths if p.endswith(SUFFIXES)]
        if not traces:
            ranks[str(rank)] = {"files": paths, "note": "no trace to summarise (nsys writes its own report)"}
            continue
        try:
            view = read_rank_trace(Path(traces[0]), top)
        except TraceError as exc:
            ranks[str(rank)] = {"error": f"cannot read {exc}"}
            continue
        views[rank] = view
        ranks[str(rank)] = {"file": traces[0], **view.summary}
    out = capture_summary(ranks)
    cross = capture_cross_rank(views)
    if cross is not None:
        out["cross_rank"] = cross
    return out


def diff_captures(before: str, after: str, kernels: int = 5) -> dict[str, Any]:
    """`ddptop trace A B --diff`: each capture's traces (a DIR or FILE) summarised with every
    kernel, compared (ddptop.analysis.trace_diff)."""
    a, b = (summarize_traces([p], top=100_000)[0] for p in (before, after))
    return diff(a, b, kernels=kernels)
