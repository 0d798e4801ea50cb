"""Builds ddptop's NCCL profiler plugin (nccl_plugin.c) into a run's private directory.

With it, NCCL (>= 2.28) stamps each all-reduce's kernel with the GPU's clock and the ranks
report the kernels' own time as comm_ms (ddptop.rank.kernel_clock); without it (no C
compiler, an older NCCL, the user's own NCCL_PROFILER_PLUGIN) they report NCCL's event span,
which includes each kernel's launch, and say so. It needs a C compiler (`cc`, or $CC) on the
machine that launches the ranks; one build takes ~0.1 s.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from ddptop.model.config import RunConfig
from ddptop.wire import protocol

SOURCE = Path(__file__).with_name("nccl_plugin.c")
NVIDIA_DEVICE = "/dev/nvidiactl"  # what every NVIDIA driver makes, in a container too


def build_for(config: RunConfig, run_dir: Path) -> tuple[Path | None, str]:
    """Built where the run has NCCL time its all-reduces (comm_timing and nccl_timing) and the
    machine has an NVIDIA GPU (NCCL's device node): a CPU run's ranks talk over gloo."""
    if not (config.comm_timing and config.nccl_timing) or not os.path.exists(NVIDIA_DEVICE):
        return None, ""
    return build(run_dir)


def build(run_dir: Path, environ: dict[str, str] | None = None) -> tuple[Path | None, str]:
    """The plugin built into `run_dir`/nccl, or None and why not (one line)."""
    env = os.environ if environ is None else environ
    if env.get(protocol.ENV_NCCL_PROFILER_PLUGIN):
        return None, "the environment names its own NCCL profiler plugin (NCCL_PROFILER_PLUGIN): kept"
    cc = env.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if not cc:
        return None, "no C compiler (cc) to build ddptop's NCCL profiler plugin"
    out_dir = run_dir / "nccl"
    out_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    out = out_dir / protocol.NCCL_PLUGIN_LIBRARY
    cmd = [cc, "-O2", "-shared", "-fPIC", "-o", str(out), str(SOURCE), "-lpthread"]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=60, check=False)
    except (OSError, subprocess.SubprocessError) as exc:
        return None, f"could not build ddptop's NCCL profiler plugin: {exc}"
    if done.returncode != 0 or not out.is_file():
        first = (done.stderr.strip().splitlines() or [f"{cc} exited {done.returncode}"])[0]
        return None, f"could not build ddptop's NCCL profiler plugin: {first[:200]}"
    return out, ""
