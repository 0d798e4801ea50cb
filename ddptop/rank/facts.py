"""What the instrument reads off the script's model and DDP module: the model's name, size
and device, the DDP arguments in effect (read back after DDP() returned), and DDP's own
timing from its logger."""

from __future__ import annotations

from typing import Any

NOT_DDP = {  # the wrapper classes whose communication ddptop does not time, and what they are
    "FullyShardedDataParallel": "FSDP", "FSDPModule": "FSDP (fully_shard)", "DeepSpeedEngine": "DeepSpeed",
}


def model_facts(torch: Any, module: Any) -> dict[str, Any]:
    inner = getattr(module, "_orig_mod", None)  # torch.compile's OptimizedModule
    name = type(inner if inner is not None else module).__name__ + (" (compiled)" if inner is not None else "")
    params = sum(p.numel() for p in module.parameters())
    return {"model": name, "params": params, "device": device_name(torch, module)}


def device_name(torch: Any, module: Any) -> str:
    param = next(module.parameters(), None)
    if param is None or param.device.type != "cuda":
        return "cpu" if param is None else str(param.device)
    idx = param.device.index if param.device.index is not None else torch.cuda.current_device()
    return f"{torch.cuda.get_device_name(idx)} (cuda:{idx})"


def ddp_facts(dist: Any, ddp: Any) -> dict[str, Any]:
    """The DDP module's process group and the arguments in effect, as DDP holds them."""
    facts: dict[str, Any] = {
        "ddp": True, "backend": str(dist.get_backend(ddp.process_group)), "world_size": dist.get_world_size(),
        "static_graph": bool(getattr(ddp, "static_graph", False)),
        "gradient_as_bucket_view": bool(getattr(ddp, "gradient_as_bucket_view", False)),
        "find_unused_parameters": bool(getattr(ddp, "find_unused_parameters", False)),
    }
    cap = getattr(ddp, "bucket_bytes_cap", None)
    if isinstance(cap, int):
        facts["bucket_cap_mb"] = round(cap / 2**20, 3)
    return facts


def facts_without_ddp(torch: Any, tops: list[Any]) -> tuple[dict[str, Any], str | None]:
    """Facts for a script with no DDP module (its outermost modules `tops`), and the note
    that its communication is not measured when it runs distributed."""
    facts: dict[str, Any] = {"ddp": False}
    kinds = {NOT_DDP[type(m).__name__] for m in tops if type(m).__name__ in NOT_DDP}
    if tops:
        facts.update(model_facts(torch, tops[0]))
    dist = torch.distributed
    if not (dist.is_available() and dist.is_initialized()):
        facts["backend"] = "none"
        return facts, None
    facts["backend"] = str(dist.get_backend())
    facts["world_size"] = dist.get_world_size()
    what = " and ".join(sorted(kinds)) if kinds else "no DistributedDataParallel module"
    return facts, (f"{what}: gradient communication is not measured (ddptop times DDP's all-reduce); "
                   "steps and phases are")


def ddp_timing(ddp: Any) -> dict[str, float]:
    """DDP's own timing from its logger, in ms: it times a sample of iterations (the first
    ten, then one in a hundred), so it cross-checks ddptop's per-step figures, no more."""
    try:
        data = ddp._get_ddp_logging_data()
    except Exception:  # noqa: BLE001 - a private API; its absence only loses the cross-check
        return {}
    keys = {"avg_backward_comm_time": "backward_comm_ms", "avg_backward_compute_comm_overlap_time": "overlap_ms",
            "avg_backward_compute_time": "backward_compute_ms", "avg_forward_compute_time": "forward_compute_ms"}
    out = {name: data[key] / 1e6 for key, name in keys.items() if isinstance(data.get(key), int | float)}
    if out and isinstance(data.get("iteration"), int):
        out["iteration"] = float(data["iteration"])
    return out
