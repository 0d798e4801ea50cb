"""Attaching the instrument: wait for the script's `import torch`, then hook in.

Called from the ranks' sitecustomize before any user code. Never imports torch itself: a
one-shot import hook notices torch's import and attaches once torch has finished loading.
A process attaches only if torchrun made it a rank (RANK set) and it is not the child of an
attached rank (DataLoader workers, the script's own subprocesses): those inherit
DDPTOP_RANK_PID from it. A child forked from a rank (mp.Pool's fork workers, DataLoader
workers) inherits the attached instrument itself: it is switched off in the child at once.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import os
import sys
from pathlib import Path
from typing import Any

from ddptop.wire import protocol


def should_attach(environ: dict[str, str] | os._Environ[str], pid: int) -> bool:
    if not environ.get(protocol.ENV_ADDR) or environ.get(protocol.ENV_BOOT, "1") == "0":
        return False
    if "RANK" not in environ:
        return False  # torchrun's own agent, or a process started outside torchrun
    owner = environ.get(protocol.ENV_RANK_PID)
    return owner is None or owner == str(pid)


def watch() -> None:
    if not should_attach(os.environ, os.getpid()):
        return
    if "torch" in sys.modules:
        attach(sys.modules["torch"])
        return
    sys.meta_path.insert(0, _TorchWatcher())


class _TorchWatcher(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:  # noqa: ARG002
        if fullname != "torch":
            return None
        sys.meta_path.remove(self)  # one shot; the real finders do the finding
        spec = importlib.util.find_spec("torch")
        loader = getattr(spec, "loader", None)
        if spec is None or loader is None or not hasattr(loader, "exec_module"):
            return spec
        original = loader.exec_module

        def exec_module(module: Any) -> None:
            original(module)
            loader.exec_module = original
            attach(module)

        loader.exec_module = exec_module
        return spec


def attach(torch: Any) -> None:
    """Connect to the hub and install the instrument's hooks; any failure leaves the
    script running unmeasured, with one line on stderr."""
    try:
        from ddptop.rank.client import Probe, attached, set_attached

        if attached() is not None:
            return
        from ddptop.rank.instrument import Instrument

        os.environ[protocol.ENV_RANK_PID] = str(os.getpid())
        flight_recorder_env(os.environ, str(torch.__version__))
        rank = int(os.environ.get("RANK", "0"))
        probe = Probe.open(owned=True)
        if not probe.enabled:
            return
        stacks = stacks_on_sigusr1(rank)
        instrument = Instrument(torch, probe, rank, _settings())
        instrument.install()
        if stacks:  # ddptop may send SIGUSR1 for stacks: this process will not die of it
            instrument.send_facts({"stacks": "faulthandler on SIGUSR1"})
        set_attached(instrument)
        os.register_at_fork(after_in_child=instrument.forked)
    except Exception as exc:  # noqa: BLE001
        print(f"ddptop: not measuring this rank: {type(exc).__name__}: {exc}", file=sys.stderr)


# ddptop's variable -> (torch >= 2.8's name, the older name torch 2.8+ warns about)
FR_NAMES = {protocol.ENV_FR_BUFFER_SIZE: ("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE"),
            protocol.ENV_FR_DUMP_FILE: ("TORCH_FR_DUMP_TEMP_FILE", "TORCH_NCCL_DEBUG_INFO_TEMP_FILE")}


def flight_recorder_env(environ: Any, torch_version: str) -> None:
    """The flight recorder's settings under the names this torch reads (before the script
    makes its process group), so no rank prints a deprecation warning ddptop caused. A
    name the user set, old or new, is left as it is."""
    try:
        major, minor = (int(x) for x in torch_version.split("+")[0].split(".")[:2])
    except ValueError:
        major, minor = 2, 8
    renamed = (major, minor) >= (2, 8)
    for ours, (new, old) in FR_NAMES.items():
        value = environ.pop(ours, None)
        if value is None or new in environ or old in environ:
            continue
        environ[new if renamed else old] = value


def _settings() -> dict[str, Any]:
    """The instrument's knobs from the run's config.json (comm_timing, comm_timing_every)."""
    import json

    path = os.environ.get(protocol.ENV_CONFIG)
    if not path:
        return {}
    try:
        with open(path) as f:
            data = json.load(f)
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def stacks_on_sigusr1(rank: int) -> bool:
    """ddptop sends SIGUSR1 when the run stalls: every thread's stack goes to the run's stacks/."""
    import faulthandler
    import signal

    from ddptop.wire import protocol

    config_path = os.environ.get(protocol.ENV_CONFIG)
    if not config_path:
        return False
    stacks = Path(config_path).parent / "stacks"
    if stacks.is_dir():
        out = open(stacks / f"rank{rank}.txt", "w")  # noqa: SIM115 - kept open for faulthandler
        faulthandler.register(signal.SIGUSR1, file=out, all_threads=True, chain=False)
        return True
    return False
