"""Applying a RunConfig to a model: DDP flags, comm hooks, autocast."""

from __future__ import annotations

import contextlib
from typing import Any

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

from ddptop.config import RunConfig


def wrap_ddp(model: nn.Module, config: RunConfig, device: torch.device) -> nn.Module:
    if not config.ddp:
        return model
    ddp = DDP(
        model,
        device_ids=[device.index] if device.type == "cuda" else None,
        static_graph=config.static_graph,
        gradient_as_bucket_view=config.gradient_as_bucket_view,
        bucket_cap_mb=config.bucket_cap_mb,
    )
    register_hook(ddp, config)
    return ddp


def register_hook(ddp: DDP, config: RunConfig) -> Any:
    """Register the configured comm hook; returns its state (PowerSGDState or None)."""
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook

    if config.comm_hook == "fp16":
        ddp.register_comm_hook(None, default_hooks.fp16_compress_hook)
    elif config.comm_hook == "bf16":
        ddp.register_comm_hook(None, default_hooks.bf16_compress_hook)
    elif config.comm_hook == "powersgd":
        state = powerSGD_hook.PowerSGDState(
            process_group=None,
            matrix_approximation_rank=config.powersgd_rank,
            start_powerSGD_iter=config.powersgd_start_iter,
        )
        ddp.register_comm_hook(state, powerSGD_hook.powerSGD_hook)
        return state
    return None


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
