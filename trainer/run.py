"""The timed training loop one rank runs."""

from __future__ import annotations

import argparse
import contextlib
import faulthandler
import json
import os
import signal
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.elastic.multiprocessing.errors import record

from ddptop import protocol
from ddptop.config import RunConfig
from ddptop.probe import Probe
from trainer import data, ddp_setup, models
from trainer.capture import CaptureRunner
from trainer.comm import CommTimer
from trainer.timing import StepClock


def load_config(argv: list[str] | None) -> RunConfig:
    parser = argparse.ArgumentParser(prog="python -m trainer")
    parser.add_argument("--config", help="config.json (default: $DDPTOP_CONFIG)")
    args = parser.parse_args(argv)
    path = args.config or os.environ.get(protocol.ENV_CONFIG)
    if not path:
        return RunConfig(preset="custom")
    raw = json.loads(Path(path).read_text())
    raw.pop("_launch", None)
    return RunConfig.from_dict(raw)


@record
def main(argv: list[str] | None = None) -> int:
    config = load_config(argv)
    rank = int(os.environ.get("RANK", "0"))
    _dump_stacks_on_sigusr1(rank)
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    cuda = torch.cuda.is_available() and config.backend != "gloo"
    if cuda:
        torch.cuda.set_device(local_rank)
    device = torch.device("cuda", local_rank) if cuda else torch.device("cpu")
    spec = models.resolve_model(config.model, cuda)
    backend = ddp_setup.backend_for(config) if config.ddp else "none"
    probe = Probe.connect(
        device=torch.cuda.get_device_name(device) + f" (cuda:{local_rank})" if cuda else "cpu",
        backend=backend,
        model=spec.name,
    )
    ddp_setup.init_distributed(config)
    world = dist.get_world_size() if config.ddp else 1
    torch.manual_seed(config.seed)
    model = models.build_model(spec).to(device)
    comm_timer = CommTimer(cuda)
    model, hook_state = ddp_setup.wrap_ddp(model, config, device, comm_timer if config.comm_timing else None)
    criterion = nn.CrossEntropyLoss()
    optimizer = torch.optim.SGD(model.parameters(), lr=config.lr)
    scaler = torch.amp.GradScaler("cuda") if cuda and config.autocast == "fp16" else None
    micro_batches = config.steps * config.grad_accum
    dataset = data.SyntheticImages(
        length=micro_batches * config.batch_size * world, image_size=spec.image_size,
        num_classes=spec.num_classes, seed=config.seed,
    )
    if config.data == "device":
        batches = data.device_batches(config.batch_size, spec.image_size, spec.num_classes, device, config.seed + rank)
    else:
        batches = data.batches(dataset, config.batch_size, config.workers, config.ddp, cuda, config.seed)
    print(
        f"[trainer] rank {rank}/{world} {device} backend={backend} model={spec.name} "
        f"params={sum(p.numel() for p in model.parameters()) / 1e6:.1f}M preset={config.preset}: "
        f"{config.describe()}",
        flush=True,
    )
    clock = StepClock(device)
    captures = CaptureRunner(probe, rank, cuda)
    model.train()
    reason = "completed"
    after_window = False
    for step in range(config.steps):
        captures.poll(step)
        captures.begin_step(step)
        # completion stamps cost on GPU: every Nth step, and every step a profiler records
        comm_timer.time_completion = (not cuda or step % config.comm_timing_every == 0
                                      or captures.active is not None)
        clock.begin_step(step)
        loss = None
        for micro in range(config.grad_accum):
            images, labels = next(batches)
            images = images.to(device, non_blocking=True)
            labels = labels.to(device, non_blocking=True)
            if rank == config.delay_rank and config.delay_ms > 0:
                time.sleep(config.delay_ms / 1000.0)
            clock.mark("data", "forward")
            if step == config.fail_step and rank == config.fail_rank:
                raise RuntimeError(f"ddptop: injected failure on rank {rank} at step {step}")
            last = micro == config.grad_accum - 1
            sync = model.no_sync() if config.ddp and not last else contextlib.nullcontext()
            with sync:
                with ddp_setup.autocast(config, device):
                    loss = criterion(model(images), labels) / config.grad_accum
                clock.mark("forward", "backward")
                (scaler.scale(loss) if scaler else loss).backward()
            clock.mark("backward", "data" if not last else "optimizer")
        if scaler:
            scaler.step(optimizer)
            scaler.update()
        else:
            optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        clock.mark("optimizer")
        # a window's steps, and the one after it (which may wait for a peer still writing
        # its trace: nsys held cudaProfilerStop for minutes on H200), are not typical steps
        profiled = captures.active is not None or after_window
        clock.end_step(
            step,
            {"samples": config.batch_size * config.grad_accum, "loss": loss.detach(),
             "compressing": ddp_setup.compressing(config, hook_state), **({"profiled": 1} if profiled else {})},
            comm_timer.take(),
        )
        after_window = captures.end_step(step)
        if after_window:
            clock.restart()
        _report(probe, clock.ready())
        if probe.should_stop(step):
            reason = "stopped"
            break
    _report(probe, clock.ready(flush=True))
    print(f"[trainer] rank {rank} {reason} after step {step}", flush=True)
    probe.close(reason, ddp_setup.ddp_timing(model) if config.ddp else None)
    if config.ddp:
        # tear down together: a rank whose peer has already closed its gloo pairs can abort
        # (SIGABRT) inside destroy_process_group, failing a run that completed
        dist.barrier()
        dist.destroy_process_group()
    if rank == config.fail_rank and config.fail_step == config.steps:
        os.abort()  # fault injection: a crash in teardown, after the last step and the goodbye
    return 0


def _dump_stacks_on_sigusr1(rank: int) -> None:
    """ddptop sends SIGUSR1 when the run stalls: write every thread's stack."""
    config_path = os.environ.get(protocol.ENV_CONFIG)
    if not config_path:
        return
    stacks = Path(config_path).parent / "stacks"
    if stacks.is_dir():
        out = open(stacks / f"rank{rank}.txt", "w")  # kept open for faulthandler
        faulthandler.register(signal.SIGUSR1, file=out, all_threads=True, chain=False)


def _report(probe: Probe, records: list[dict[str, float]]) -> None:
    for rec in records:
        probe.record(int(rec.pop("step")), **rec)


if __name__ == "__main__":
    sys.exit(main())
