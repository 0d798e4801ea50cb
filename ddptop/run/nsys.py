"""nsys, the part that runs things: finding nsys and its QdstrmImporter, the command each rank
runs under, turning raw .qdstrm streams into .nsys-rep reports, `nsys stats`, and putting the
result into the captures. What the text means is ddptop.analysis.nsys_stats (pure). No torch."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import re
import shutil
import signal
import subprocess
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from ddptop.analysis import nsys_stats
from ddptop.analysis.capture import capture_summary
from ddptop.analysis.trace_analysis import analyze
from ddptop.model.plain_data import JSON, NsysReport
from ddptop.run.untrusted import read_json_object
from ddptop.wire.protocol import NSYS_WINDOW_RANGE as WINDOW_RANGE

LIBS_ENV = "DDPTOP_NSYS_LIBS"  # folders (':'-separated) with libraries the importer needs, e.g. libdw.so.1
IMPORT_TIMEOUT_S = 900.0
STATS_TIMEOUT_S = 300.0
HELP_TIMEOUT_S = 30.0
MAX_REPORTS = 16
MAX_CSV_BYTES = 4 << 20
MAX_OUTPUT = 64 << 10
WINDOW_FILE = "rank{rank}.nsys-window"  # the rank's own timing of cudaProfilerStart/Stop

# Where nsys lives when it is not on PATH: a full Nsight Systems first, newest version first;
# Nsight Compute's bundled copy last (it records, but ships its importer in another folder).
NSYS_GLOBS = (
    "opt/nvidia/nsight-systems/*/bin/nsys",
    "opt/nvidia/nsight-systems/*/target-linux-x64/nsys",
    "opt/nvidia/nsight-systems*/bin/nsys",
    "opt/nvidia/nsight-systems*/target-linux-x64/nsys",
    "usr/local/cuda*/bin/nsys",
    "usr/local/cuda*/nsight-systems-*/bin/nsys",
    "usr/lib/nsight-systems/bin/nsys",
    "opt/nvidia/nsight-compute/*/host/target-linux-x64/nsys",
)
IMPORTER_DIRS = ("host-linux-x64", "linux-desktop-glibc_*-x64", "Host-x86_64", "host-linux-*")
OUTPUT = re.compile(r"^nsys_rank(?P<rank>\d+)(?:[._](?P<n>\d+))?\.(?P<ext>nsys-rep|qdstrm)$")


# ---------------------------------------------------------------------------- finding things


def _version_key(path: Path) -> tuple:
    return tuple(int(n) for n in re.findall(r"\d+", str(path)))


def _executable(path: Path | str) -> bool:
    return os.path.isfile(path) and os.access(path, os.X_OK)


def find_nsys(explicit: str | None = None, path: str | None = None, root: str = "/") -> str | None:
    """The nsys to use: `explicit` (--nsys-path), else nsys on PATH, else the newest one in the
    usual install folders (Nsight Systems, CUDA, then Nsight Compute's bundled host/target-linux-x64)."""
    if explicit:
        return explicit if _executable(explicit) else None
    found = shutil.which("nsys", path=path)
    if found:
        return found
    for pattern in NSYS_GLOBS:
        hits = sorted((p for p in Path(root).glob(pattern) if _executable(p)), key=_version_key, reverse=True)
        if hits:
            return str(hits[0])
    return None


def find_importer(nsys: str, path: str | None = None) -> str | None:
    """QdstrmImporter for this nsys: next to it (Nsight Systems: <root>/host-linux-x64; Nsight
    Compute: <ver>/host/linux-desktop-glibc_*-x64), else on PATH."""
    here = Path(os.path.realpath(nsys)).parent
    for base in (here, here.parent, here.parent.parent):
        for folder in IMPORTER_DIRS:
            hits = sorted(base.glob(f"{folder}/QdstrmImporter"), key=_version_key, reverse=True)
            for hit in hits:
                if _executable(hit):
                    return str(hit)
    if _executable(here / "QdstrmImporter"):
        return str(here / "QdstrmImporter")
    return shutil.which("QdstrmImporter", path=path)


def lib_dirs(env: Mapping[str, str]) -> list[str]:
    return [d for d in env.get(LIBS_ENV, "").split(os.pathsep) if d and os.path.isdir(d)]


def importer_env(importer: str, env: Mapping[str, str]) -> dict[str, str]:
    """The importer's environment: the carried library folders and its own folder first."""
    out = dict(env)
    dirs = [*lib_dirs(env), str(Path(importer).parent)]
    if env.get("LD_LIBRARY_PATH"):
        dirs.append(env["LD_LIBRARY_PATH"])
    out["LD_LIBRARY_PATH"] = os.pathsep.join(dirs)
    return out


# ---------------------------------------------------------------------------- the rank command


@functools.lru_cache(maxsize=8)
def _profile_help(nsys: str) -> frozenset[str]:
    try:
        out = subprocess.run([nsys, "profile", "--help"], capture_output=True, text=True, errors="replace",
                             timeout=HELP_TIMEOUT_S, check=False)
    except (OSError, subprocess.SubprocessError):
        return frozenset()
    return frozenset(nsys_stats.profile_options(out.stdout + out.stderr))


def profile_command(nsys: str, out: Path, env: Mapping[str, str] | None = None) -> list[str]:
    """`nsys profile ...` for one rank: records only between cudaProfilerStart/Stop (ddptop's
    capture windows), with the cheap flags of nsys_stats (or DDPTOP_NSYS_FLAGS)."""
    env = os.environ if env is None else env
    flags = nsys_stats.profile_flags(set(_profile_help(nsys)), env.get(nsys_stats.FLAGS_ENV))
    return [nsys, "profile", "--capture-range=cudaProfilerApi", *flags, "--force-overwrite=true", "-o", str(out)]


# ---------------------------------------------------------------------------- running tools


async def _run(argv: list[str], timeout: float, env: Mapping[str, str] | None = None) -> tuple[int | None, str]:
    """Exit code (None: it could not start or ran out of time) and the tail of its output."""
    try:
        proc = await asyncio.create_subprocess_exec(
            *argv, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
            stdin=asyncio.subprocess.DEVNULL, env=dict(env) if env is not None else None, start_new_session=True)
    except OSError as exc:
        return None, f"cannot run {argv[0]}: {exc.strerror or exc}"
    tail = bytearray()

    async def read() -> None:
        assert proc.stdout is not None
        while chunk := await proc.stdout.read(65536):
            tail.extend(chunk)
            del tail[:-MAX_OUTPUT]

    try:
        await asyncio.wait_for(asyncio.gather(read(), proc.wait()), timeout)
    except asyncio.TimeoutError:
        _kill(proc.pid)
        await proc.wait()
        return None, tail.decode(errors="replace") + f"\ntimed out after {timeout:.0f} s"
    except BaseException:  # ddptop stopping (cancelled): the tool is in its own session, end it too
        _kill(proc.pid)
        raise
    return proc.returncode, tail.decode(errors="replace")


def _kill(pid: int) -> None:
    with contextlib.suppress(OSError):
        os.killpg(pid, signal.SIGKILL)


def nsys_outputs(captures_dir: Path) -> list[tuple[int, int, Path]]:
    """(rank, window number, path) of what nsys wrote: reports (.nsys-rep) or raw streams (.qdstrm)."""
    out = []
    for p in captures_dir.glob("nsys_rank*"):
        m = OUTPUT.match(p.name)
        if m:
            out.append((int(m["rank"]), int(m["n"] or 0), p))
    return sorted(out)


async def import_qdstrm(importer: str, raw: Path, env: Mapping[str, str]) -> tuple[Path | None, str | None]:
    """raw .qdstrm -> .nsys-rep beside it; the raw stream is removed once the report exists (as
    nsys does itself). Returns the report, or None and one line on why not."""
    rep = raw.with_suffix(".nsys-rep")
    rc, out = await _run([importer, "-i", str(raw)], IMPORT_TIMEOUT_S, importer_env(importer, env))
    if rep.is_file() and rep.stat().st_size > 0:
        with contextlib.suppress(OSError):
            raw.unlink()
        return rep, None
    return None, nsys_stats.failure_line("QdstrmImporter", out, rc, LIBS_ENV)


@functools.lru_cache(maxsize=8)
def _reports_for(help_text: str) -> tuple[str, ...]:
    return tuple(nsys_stats.choose_reports(nsys_stats.available_reports(help_text)))


async def run_stats(nsys: str, rep: Path, reports: Iterable[str], window: bool = False) -> dict[str, Any]:
    """`nsys stats` of one report as CSV files beside it, summarised (nsys_stats.summarize_stats).
    `window`: nsys can filter by NVTX range: the figures keep to the window's own steps (the
    rank's WINDOW_RANGE), its warmup step out; where that gives nothing (a report without the
    range), the whole capture range, said in `window_filter`."""
    base = str(rep.with_suffix(""))
    reports = list(reports)
    argv = [nsys, "stats", *(a for r in reports for a in ("--report", r)), "--format", "csv",
            "--output", base, "--force-export=true", str(rep)]
    if window:
        filtered = await run_stats_argv(argv[:-1] + ["--filter-nvtx", WINDOW_RANGE, str(rep)], base, reports,
                                        WINDOW_RANGE)
        if filtered.get("csv"):
            filtered["window_filter"] = f"the window's steps only (NVTX range {WINDOW_RANGE})"
            return filtered
    result = await run_stats_argv(argv, base, reports)
    result["window_filter"] = ("the whole capture range, its warmup step included (nsys stats could not keep to "
                               f"the NVTX range {WINDOW_RANGE})" if window else "the whole capture range")
    return result


async def run_stats_argv(argv: list[str], base: str, reports: list[str], nvtx: str | None = None) -> dict[str, Any]:
    """Run `nsys stats` and read its CSV tables; `nvtx`: the range it was filtered by, whose
    tables nsys names with that range."""
    rc, out = await _run(argv, STATS_TIMEOUT_S)
    with contextlib.suppress(OSError):
        Path(base + ".stats.txt").write_text(out)
    tables, read = {}, []
    for report in reports:
        path = Path(nsys_stats.stats_csv_name(base, report, nvtx))
        if path.is_file():
            with path.open(encoding="utf-8", errors="replace") as f:
                tables[report] = f.read(MAX_CSV_BYTES)
            read.append(str(path))
    result = nsys_stats.summarize_stats(tables)
    result["csv"] = read
    if not tables:
        result["problem"] = nsys_stats.failure_line("nsys stats", out, rc, LIBS_ENV)
    return result


async def nsys_report(nsys: str, captures_dir: Path, env: Mapping[str, str] | None = None) -> NsysReport:
    """After an nsys run: import raw streams, `nsys stats` every report, and say plainly what
    could not be done. `stats` maps report file -> one line (the captures view shows it);
    `reports` holds each report's summary by rank and window."""
    env = os.environ if env is None else env
    info: NsysReport = {"nsys": nsys, "importer": None, "files": [], "stats": {}, "reports": [], "errors": []}
    outputs = nsys_outputs(captures_dir)
    have = {p.with_suffix("") for _, _, p in outputs if p.suffix == ".nsys-rep"}
    raws = [(r, n, p) for r, n, p in outputs if p.suffix == ".qdstrm" and p.with_suffix("") not in have]
    reps = [(r, n, p) for r, n, p in outputs if p.suffix == ".nsys-rep"]
    if raws:
        importer = find_importer(nsys)
        info["importer"] = importer
        if importer is None:
            info["errors"].append(f"nsys left {len(raws)} raw .qdstrm file(s) and no QdstrmImporter was found "
                                  f"next to {nsys}")
        else:
            for rank, n, raw in raws:
                rep, err = await import_qdstrm(importer, raw, env)
                if rep is not None:
                    reps.append((rank, n, rep))
                    continue
                info["errors"].append(err or "")
                if err and "cannot start" in err:
                    break  # the same for every file
    reps.sort()
    if reps:
        rc, help_text = await _run([nsys, "stats", "--help-reports"], HELP_TIMEOUT_S)
        reports = _reports_for(help_text if rc == 0 else "")
        rc, stats_help = await _run([nsys, "stats", "--help"], HELP_TIMEOUT_S)
        window = rc == 0 and "--filter-nvtx" in stats_help
        for rank, n, rep in reps[:MAX_REPORTS]:
            stats = await run_stats(nsys, rep, reports, window)
            info["reports"].append({"rank": rank, "window": n, "file": str(rep), **stats})
            info["stats"][rep.name] = nsys_stats.rank_line(stats)
        if len(reps) > MAX_REPORTS:
            info["errors"].append(f"nsys stats ran on the first {MAX_REPORTS} of {len(reps)} reports")
    info["files"] = [f"{p} ({_size(p)})" for _, _, p in nsys_outputs(captures_dir)]
    if not reps:
        why = info["errors"][0] if info["errors"] else "nsys wrote nothing for the capture windows"
        info["note"] = f"no .nsys-rep report: {why}; torch.profiler captures still work (--profiler torch)"
    elif info["errors"]:
        info["note"] = "; ".join(dict.fromkeys(info["errors"]))
    return info


def _size(path: Path) -> str:
    try:
        n = path.stat().st_size
    except OSError:
        return "gone"
    return f"{n / 1e6:.1f} MB" if n >= 1e5 else f"{n} bytes"


# ---------------------------------------------------------------------------- into the captures


def window_times(out_dir: str, rank: int) -> dict[str, float] | None:
    """The rank's timing of cudaProfilerStart/Stop for a window (written by ddptop.rank.capture)."""
    data = read_json_object(Path(out_dir) / WINDOW_FILE.format(rank=rank))
    if data is None:
        return None
    return {k: float(v) for k, v in data.items() if k in ("start_s", "stop_s") and isinstance(v, (int, float))}


def attach_nsys(captures: Iterable[Any], info: NsysReport) -> None:
    """Put each nsys window's per-rank statistics and cost into its capture's summary: the k-th
    nsys capture gets each rank's k-th report (nsys numbers the reports of `repeat` ranges)."""
    by_rank: dict[int, list[dict[str, JSON]]] = {}
    for entry in info["reports"]:
        rank = entry["rank"]
        if isinstance(rank, int):  # nsys_report wrote it
            by_rank.setdefault(rank, []).append(entry)
    nsys_caps = sorted((c for c in captures if c.profiler == "nsys"), key=lambda c: c.start)
    for k, cap in enumerate(nsys_caps):
        summary = dict(cap.summary or {})
        ranks: dict[str, Any] = {}
        for rank in sorted(set(cap.ranks) | set(by_rank)):
            entries = by_rank.get(rank, [])
            if k < len(entries):
                stats: dict[str, Any] = {key: v for key, v in entries[k].items() if key not in ("rank", "window")}
            else:
                stats = {"problem": info.get("note") or "nsys wrote no report for this window"}
            times = window_times(cap.out_dir, rank)
            if times:
                stats["held_s"] = nsys_stats.window_cost(times)
                stats["times"] = times
            stats["note"] = nsys_stats.rank_line(stats)
            ranks[str(rank)] = stats
            if stats.get("file"):
                cap.files.setdefault(rank, [])
                if stats["file"] not in cap.files[rank]:
                    cap.files[rank].append(stats["file"])
        comm = [s["comm_ms"] for s in ranks.values() if s.get("comm_ms") is not None]
        held = [s["held_s"] for s in ranks.values() if s.get("held_s") is not None]
        summary.update(ranks=ranks, source="nsys stats",
                       comm_ms_mean=round(sum(comm) / len(comm), 3) if comm else None,
                       nsys_held_s_max=max(held) if held else None)
        cap.summary = summary


# ---------------------------------------------------------------------------- a window's traces


def summarize_capture(files: dict[int, list[str]]) -> dict[str, Any]:
    """Per-rank summaries of a capture's torch.profiler trace files, read here and summarised
    by ddptop.analysis (nsys windows get theirs from attach_nsys); unreadable files are named."""
    from ddptop.run.trace_files import TraceError, read_trace

    ranks: dict[str, Any] = {}
    for rank, paths in sorted(files.items()):
        traces = [p for p in paths if p.endswith((".json", ".json.gz"))]
        if not traces:
            ranks[str(rank)] = {"files": paths, "note": "no trace to summarise (nsys writes its own report)"}
            continue
        try:
            ranks[str(rank)] = {"file": traces[0], **analyze(read_trace(traces[0]))}
        except (TraceError, ValueError) as exc:
            ranks[str(rank)] = {"error": f"cannot read {exc}" if isinstance(exc, TraceError)
                                else f"cannot read {traces[0]}: {exc}"}
    return capture_summary(ranks)
