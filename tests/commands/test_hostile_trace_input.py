"""Issue 49, cases 2 and 5: `ddptop trace` and `ddptop ls` show names as text (OSC 52 and OSC 0
in a kernel or file name never reach the terminal), and a trace built to explode (300k nested
`[` inside traceEvents, a 5,000-digit integer) is one line and exit 2 in bounded memory: it is
read in the memory-limited child, whose limit follows the input's size."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

from ddptop.commands.attach import ls_table
from ddptop.commands.trace import main_trace
from ddptop.remote.live import LiveRun
from ddptop.run.trace_job import memory_for
from tests.trace_builders import GpuTrace

OSC52 = "\x1b]52;c;ZWNobyBwd25lZA==\x07"
OSC0 = "\x1b]0;owned\x07"


def test_trace_prints_file_and_kernel_names_as_text(tmp_path: Path, capsys) -> None:  # noqa: ANN001
    t = GpuTrace(0)
    t.cpu("ProfilerStep#5", 0, 1000, cat="user_annotation")
    t.kernel(f"gemm{OSC52}", 100, 300, launch=50).kernel(f"gemm{OSC52}", 500, 300, launch=450)
    path = tmp_path / f"rank0{OSC0}.json"
    path.write_text(json.dumps(t.trace()))
    assert main_trace([str(path)]) == 0
    out = capsys.readouterr().out
    assert "\x1b" not in out and "\x07" not in out
    assert "gemm^[]52;c;ZWNobyBwd25lZA==^G" in out and "rank0^[]0;owned^G.json" in out
    assert main_trace([str(path), "--json"]) == 0
    assert "\x1b" not in capsys.readouterr().out
    assert main_trace([str(tmp_path / f"missing{OSC0}.json")]) == 2
    assert "\x1b" not in capsys.readouterr().err


def test_ls_shows_registry_fields_as_text() -> None:
    entry = LiveRun(run_id="r1", pid=2, socket="", token="", run_dir=f"/tmp/x{OSC52}", runs_dir="/tmp",
                    preset=f"base{OSC0}", world_size=2, detached=True, started_at=0.0, status=f"running{OSC0}")
    text = ls_table([entry], 60.0)
    assert "\x1b" not in text and "\x07" not in text and "base^[]0;owned^G" in text


def _trace_cli(path: Path) -> tuple[int, str, float]:
    """`ddptop trace PATH` in a process of its own: exit code, stderr, and the largest RSS (MB)
    of any process it ran (the child that reads the trace included)."""
    probe = ("import resource, subprocess, sys; p = subprocess.run([sys.executable, '-m', 'ddptop', 'trace', "
             f"{str(path)!r}], capture_output=True, text=True); sys.stderr.write(p.stderr); "
             "print(p.returncode, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)")
    proc = subprocess.Popen([sys.executable, "-c", probe], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=60)
    finally:  # a hang (the old code on a FIFO): end the whole group, `ddptop trace` included
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
    code, kb = out.split()
    return int(code), err, int(kb) / 1024


def test_a_trace_of_300k_nested_brackets_is_one_line_in_bounded_memory(tmp_path: Path) -> None:
    path = tmp_path / "nested.json"
    path.write_text('{"traceEvents": [' + "[" * 300_000 + "]" * 300_000 + "]}")  # 600 KB
    assert memory_for({"op": "traces", "paths": [str(path)]}) < 300
    code, err, peak_mb = _trace_cli(path)
    assert code == 2
    assert err.count("\n") == 1 and err.startswith("ddptop trace: error: ran out of memory (limit 261 MB")
    assert peak_mb < 400  # was > 6 GB, then a MemoryError traceback


def test_a_5000_digit_integer_is_one_line_and_exit_2(tmp_path: Path) -> None:
    path = tmp_path / "digits.json"
    path.write_text('{"traceEvents": [{"ph": "X", "name": "k", "ts": ' + "9" * 5000 + ', "dur": 1}]}')
    code, err, _ = _trace_cli(path)
    assert code == 2
    assert err == f"ddptop trace: error: {path}: not a trace (Exceeds the limit (4300 digits) for integer string conversion)\n"


def test_a_trace_that_is_a_fifo_is_one_line_not_a_hang(tmp_path: Path) -> None:
    fifo = tmp_path / "rank0.json"
    os.mkfifo(fifo)
    code, err, _ = _trace_cli(fifo)
    assert (code, err) == (2, f"ddptop trace: error: {fifo}: not a regular file\n")
