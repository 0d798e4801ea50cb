"""Trace summaries in a child process (`python -m ddptop.run.trace_job`), so the process that
draws the live UI (or serves its viewers) never stalls while a large capture is summarised:
json and the analyses hold the GIL, a thread would not help. The child streams each trace
(ddptop.run.trace_files), under an address-space limit, and answers one JSON line on stdout:
{"result": ..., "peak_mb": its peak RSS} or {"error": one line}. Every failure (a bad trace,
out of memory, killed, too slow) comes back to the caller as one line (TraceError).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import resource
import signal
import sys
from pathlib import Path
from typing import Any

from ddptop.model.text import printable, printable_tree
from ddptop.run.trace_files import (
    TraceError,
    diff_captures,
    summarize_capture_traces,
    summarize_traces,
)

MEMORY_MB = int(os.environ.get("DDPTOP_TRACE_MEMORY_MB", "3072"))  # address space, not RSS: allow slack
# Below that cap, memory in proportion to the input: a whole read takes ~5x a trace's size
# (gzip ~10x more), so a 600 KB file of 300k nested `[` stops at ~260 MB, not at the cap.
BASE_MB, PER_MB, GZIP_RATIO = 256, 10, 10
TIMEOUT_S = 600.0
OUT_OF_MEMORY = 3


def _do(request: dict[str, Any]) -> Any:
    op, top = request["op"], int(request.get("top", 10))
    if op == "capture":
        return summarize_capture_traces({int(r): list(p) for r, p in request["files"].items()}, top)
    if op == "traces":
        return list(summarize_traces(list(request["paths"]), top))
    if op == "diff":
        return diff_captures(request["before"], request["after"], int(request.get("kernels", 5)))
    raise ValueError(f"unknown trace job {op!r}")


def _inputs(request: dict[str, Any]) -> list[str]:
    op = request.get("op")
    if op == "capture":
        return [p for paths in request.get("files", {}).values() for p in paths]
    if op == "diff":
        return [request.get("before", ""), request.get("after", "")]
    return list(request.get("paths", []))


def memory_for(request: dict[str, Any]) -> int:
    """The address space (MB) the job may use: BASE_MB + PER_MB per MB of its traces (a
    directory: its files), at most MEMORY_MB."""
    size = 0.0
    for target in _inputs(request):
        path = Path(target)
        with contextlib.suppress(OSError):
            for file in (p for p in path.iterdir() if p.is_file()) if path.is_dir() else [path]:
                size += file.stat().st_size * (GZIP_RATIO if file.name.endswith(".gz") else 1)
    return int(min(MEMORY_MB, BASE_MB + PER_MB * size / (1 << 20)))


def _peak_mb() -> float:
    """This process's own peak RSS: VmHWM (Linux), not ru_maxrss, which keeps the parent's RSS
    at the fork across the exec (a 300 MB parent read as a 572 MB summary of a 200 MB trace)."""
    with contextlib.suppress(OSError, ValueError, IndexError):
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return round(int(line.split()[1]) / 1024.0, 1)  # kB
    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0, 1)  # Linux: KiB


def main() -> int:
    request = json.loads(sys.stdin.read())
    limit_mb = int(request.get("memory_mb") or memory_for(request))
    hard = resource.getrlimit(resource.RLIMIT_AS)[1]
    resource.setrlimit(resource.RLIMIT_AS, (limit_mb << 20, hard))
    with contextlib.suppress(OSError):
        os.nice(5)  # behind the UI and the run's own monitoring
    answer: dict[str, Any] = {"error": f"ran out of memory (limit {limit_mb} MB: {BASE_MB} + {PER_MB}x the "
                                       f"traces' size, at most DDPTOP_TRACE_MEMORY_MB)"}
    code = OUT_OF_MEMORY
    try:
        answer, code = {"result": _do(request)}, 0
    except MemoryError:
        pass  # answered below, once the frames that held the trace are gone
    except (TraceError, ValueError, OSError) as exc:
        answer, code = {"error": str(exc).splitlines()[0] if str(exc) else type(exc).__name__}, 2
    resource.setrlimit(resource.RLIMIT_AS, (hard, hard))
    answer["peak_mb"] = _peak_mb()
    sys.stdout.write(json.dumps(answer) + "\n")
    sys.stdout.flush()
    return code


def _env() -> dict[str, str]:
    """The parent's environment, with this ddptop importable whichever way it was started."""
    root = str(Path(__file__).resolve().parents[2])
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH", "")) if p)
    return env


async def run_job(request: dict[str, Any], timeout_s: float = TIMEOUT_S) -> tuple[Any, float | None]:
    """The job's result and the child's peak RSS (MB); TraceError (one line) on any failure."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "ddptop.run.trace_job", stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=_env(), start_new_session=True)
    try:
        out, err = await asyncio.wait_for(proc.communicate(json.dumps(request).encode()), timeout_s)
    except asyncio.TimeoutError:
        proc.kill()
        await proc.wait()
        raise TraceError(f"trace summary took longer than {timeout_s:.0f} s (stopped)") from None
    except asyncio.CancelledError:
        if proc.returncode is None:
            proc.kill()
        raise
    return _answer(proc.returncode, out, err)


def _answer(code: int | None, out: bytes, err: bytes) -> tuple[Any, float | None]:
    try:
        answer = json.loads(out.decode().strip().splitlines()[-1])
    except (ValueError, IndexError):
        answer = None
    if isinstance(answer, dict) and "result" in answer:  # names from traces: text for every view
        return printable_tree(answer["result"]), answer.get("peak_mb")
    if isinstance(answer, dict) and answer.get("error"):
        raise TraceError(printable(str(answer["error"])))
    if code is not None and code < 0:
        name = signal.Signals(-code).name if -code in signal.valid_signals() else str(-code)
        why = " (out of memory?)" if -code == signal.SIGKILL else ""
        raise TraceError(f"trace summary process killed by {name}{why}")
    last = (err.decode(errors="replace").strip().splitlines() or [f"exit code {code}"])[-1]
    raise TraceError(f"trace summary process failed: {last[:200]}")


async def summarize_capture(files: dict[int, list[str]], top: int = 10) -> dict[str, Any]:
    """ddptop.run.trace_files.summarize_capture_traces, in a child process."""
    result, _ = await run_job({"op": "capture", "files": {str(r): p for r, p in files.items()}, "top": top})
    if not isinstance(result, dict):
        raise TraceError("trace summary process answered no summary")
    return result


async def diff_in_child(before: str, after: str, kernels: int = 5) -> dict[str, Any]:
    """ddptop.run.trace_files.diff_captures (what `ddptop trace A B --diff` prints), in a child process."""
    result, _ = await run_job({"op": "diff", "before": before, "after": after, "kernels": kernels})
    if not isinstance(result, dict):
        raise TraceError("trace diff process answered no comparison")
    return result


if __name__ == "__main__":
    sys.exit(main())
