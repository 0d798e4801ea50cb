"""Applying a RunConfig to a model: DDP flags, comm hooks, autocast."""

from __future__ import annotations

import contextlib
from typing import Any

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

from ddptop.config import RunConfig
from trainer.comm import CommTimer


def wrap_ddp(
    model: nn.Module, config: RunConfig, device: torch.device, timer: CommTimer | None = None
) -> tuple[nn.Module, Any]:
    """The model wrapped as the config says, and the comm hook's state (PowerSGD's, or None)."""
    if not config.ddp:
        return model, None
    ddp = DDP(
        model,
        device_ids=[device.index] if device.type == "cuda" else None,
        static_graph=config.static_graph,
        gradient_as_bucket_view=config.gradient_as_bucket_view,
        bucket_cap_mb=config.bucket_cap_mb,
    )
    state, hook = comm_hook(config)
    if timer is None and config.comm_hook == "none":
        return ddp, None  # DDP's built-in C++ all-reduce: nothing to time, nothing added
    if timer is not None:
        # plain all-reduce: our own timed hook (one callback, averaging inside NCCL)
        hook = timer.allreduce_hook if config.comm_hook == "none" else timer.wrap(hook)
    ddp.register_comm_hook(state, hook)
    return ddp, state


def comm_hook(config: RunConfig) -> tuple[Any, Any]:
    """(state, hook) for the configured comm hook; plain all-reduce for "none" so
    that it can be timed the same way."""
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook

    if config.comm_hook == "fp16":
        return None, default_hooks.fp16_compress_hook
    if config.comm_hook == "bf16":
        return None, default_hooks.bf16_compress_hook
    if config.comm_hook == "powersgd":
        state = powerSGD_hook.PowerSGDState(
            process_group=None,
            matrix_approximation_rank=config.powersgd_rank,
            start_powerSGD_iter=config.powersgd_start_iter,
        )
        return state, powerSGD_hook.powerSGD_hook
    return None, default_hooks.allreduce_hook


def ddp_timing(model: nn.Module) -> dict[str, float]:
    """DDP's own timing from its logger, in ms: it times a sample of iterations (the first
    ten, then one in a hundred), so it cross-checks ddptop's per-step figures, no more."""
    try:
        data = model._get_ddp_logging_data()  # type: ignore[operator]
    except Exception:  # noqa: BLE001 - a private API; its absence only loses the cross-check
        return {}
    keys = {"avg_backward_comm_time": "backward_comm_ms", "avg_backward_compute_comm_overlap_time": "overlap_ms",
            "avg_backward_compute_time": "backward_compute_ms", "avg_forward_compute_time": "forward_compute_ms"}
    out = {name: data[key] / 1e6 for key, name in keys.items() if isinstance(data.get(key), int | float)}
    if out and isinstance(data.get("iteration"), int):
        out["iteration"] = float(data["iteration"])
    return out


def compressing(config: RunConfig, hook_state: Any) -> float:
    """1.0 when this step's gradients travel compressed (PowerSGD only after its warm-up)."""
    if config.comm_hook in ("fp16", "bf16"):
        return 1.0
    if config.comm_hook == "powersgd" and hook_state is not None:
        return float(hook_state.iter >= hook_state.start_powerSGD_iter)
    return 0.0


def autocast(config: RunConfig, device: torch.device) -> contextlib.AbstractContextManager[Any]:
    if config.autocast == "none":
        return contextlib.nullcontext()
    dtype = torch.bfloat16 if config.autocast == "bf16" else torch.float16
    return torch.autocast(device_type=device.type, dtype=dtype)


def backend_for(config: RunConfig) -> str:
    if config.backend != "auto":
        return config.backend
    return "nccl" if torch.cuda.is_available() else "gloo"


def nccl_version() -> str:
    try:
        v = torch.cuda.nccl.version()
        return ".".join(map(str, v)) if isinstance(v, tuple) else str(v)
    except Exception:  # noqa: BLE001 - CPU builds have no NCCL
        return ""


def init_distributed(config: RunConfig) -> str:
    backend = backend_for(config)
    if config.ddp and not dist.is_initialized():
        dist.init_process_group(backend)
    return backend
