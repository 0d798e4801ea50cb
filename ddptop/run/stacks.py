"""Collecting every rank's Python stacks (and NCCL's flight recorder) when a run stalls."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
from pathlib import Path

PYSPY_TIMEOUT_S = 15.0
ANSWER_WAIT_S = 1.0  # for faulthandler and the flight recorder to write their files


async def collect_stacks(stacks_dir: Path, pids: dict[int, int], process_status: dict[int, str],
                         signalable: set[int] | None = None) -> dict[int, str]:
    """rank -> file with its stacks: py-spy when installed, else the trainer's
    faulthandler on SIGUSR1; a rank that cannot answer (stopped, gone, in native
    code with signals blocked) is named instead of a file. Also asks NCCL's flight
    recorder to dump through its pipe (TORCH_NCCL_DEBUG_INFO_PIPE_FILE)."""
    stacks: dict[int, str] = {}
    pyspy = shutil.which("py-spy")
    for rank, pid in pids.items():
        if pyspy and await _pyspy_dump(pyspy, pid, stacks_dir / f"rank{rank}.pyspy.txt"):
            stacks[rank] = str(stacks_dir / f"rank{rank}.pyspy.txt")
            continue
        if signalable is not None and rank not in signalable:
            # SIGUSR1's default action ends a process: only ranks that said they handle it
            stacks[rank] = "(no stacks: the process did not register a handler, and py-spy is not installed)"
            continue
        try:
            os.kill(pid, signal.SIGUSR1)  # the rank-side layer: faulthandler.register(SIGUSR1)
        except OSError:
            continue
        stacks[rank] = str(stacks_dir / f"rank{rank}.txt")
    for pipe in stacks_dir.glob("nccl_pipe_rank_*"):
        try:
            fd = os.open(pipe, os.O_WRONLY | os.O_NONBLOCK)
            os.write(fd, b"1\n")
            os.close(fd)
        except OSError:
            pass
    await asyncio.sleep(ANSWER_WAIT_S)
    for rank, path in list(stacks.items()):
        if not Path(path).exists() or not Path(path).stat().st_size:
            stacks[rank] = f"(no answer: process {process_status.get(rank, '?')})"
    return stacks


async def _pyspy_dump(pyspy: str, pid: int, target: Path) -> bool:
    proc = await asyncio.create_subprocess_exec(
        pyspy, "dump", "--pid", str(pid), stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
    try:
        out, _ = await asyncio.wait_for(proc.communicate(), PYSPY_TIMEOUT_S)
    except asyncio.TimeoutError:
        proc.kill()
        return False
    target.write_bytes(out)
    return proc.returncode == 0
