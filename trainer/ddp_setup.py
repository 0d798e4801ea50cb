"""Applying a RunConfig to a model: DDP flags, comm hooks, autocast."""

from __future__ import annotations

import contextlib
from typing import Any

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

from ddptop.model.config import RunConfig


def wrap_ddp(model: nn.Module, config: RunConfig, device: torch.device) -> nn.Module:
    """The model wrapped as the config says, its comm hook registered as any script would
    (ddptop's instrument times it, or adds its own timed all-reduce when there is none)."""
    if not config.ddp:
        return model
    ddp = DDP(
        model,
        device_ids=[device.index] if device.type == "cuda" else None,
        static_graph=config.static_graph,
        gradient_as_bucket_view=config.gradient_as_bucket_view,
        bucket_cap_mb=config.bucket_cap_mb,
    )
    if config.comm_hook != "none":
        ddp.register_comm_hook(*comm_hook(config))
    return ddp


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
