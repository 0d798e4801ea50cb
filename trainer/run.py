"""The article's training loop, as a plain DDP script: ddptop's rank-side instrument
(ddptop.rank) measures it exactly as it measures a user's own script. What it adds of its
own: the run's settings applied where it builds DDP, fault injection, and its loss and
samples through the optional probe API."""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.elastic.multiprocessing.errors import record

from ddptop.model.config import RunConfig
from ddptop.probe import Probe
from ddptop.wire import protocol
from trainer import data, ddp_setup, models


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
    model = ddp_setup.wrap_ddp(model, config, device)
    criterion = nn.CrossEntropyLoss()
    optimizer = torch.optim.SGD(model.parameters(), lr=config.lr)
    scaler = torch.amp.GradScaler("cuda") if cuda and config.autocast == "fp16" else None
    # the dataset's length (batches go round it, epoch after epoch): a run until stopped has
    # the default run's
    micro_batches = (200 if config.until_stopped else config.steps) * config.grad_accum
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
    model.train()
    reason = "completed"
    step = -1
    own_clock = OwnClock(cuda, config.warmup)
    for step in itertools.count() if config.until_stopped else range(config.steps):
        own_clock.at(step)
        loss = None
        for micro in range(config.grad_accum):
            images, labels = next(batches)
            images = images.to(device, non_blocking=True)
            labels = labels.to(device, non_blocking=True)
            if rank == config.delay_rank and config.delay_ms > 0:
                time.sleep(config.delay_ms / 1000.0)
            if step == config.fail_step and rank == config.fail_rank:
                raise RuntimeError(f"ddptop: injected failure on rank {rank} at step {step}")
            last = micro == config.grad_accum - 1
            sync = model.no_sync() if config.ddp and not last else contextlib.nullcontext()
            with sync:
                with ddp_setup.autocast(config, device):
                    loss = criterion(model(images), labels) / config.grad_accum
                (scaler.scale(loss) if scaler else loss).backward()
        if scaler:
            scaler.step(optimizer)
            scaler.update()
        else:
            optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        # the loss stays a tensor: the instrument reads it once the step's events have run
        if probe.tick(samples=config.batch_size * config.grad_accum, loss=loss.detach()):
            reason = "stopped"
            break
    print(f"[trainer] rank {rank} {reason} after step {step}; {own_clock.result(step)}", flush=True)
    probe.close(reason)  # every step reported and goodbye said before teardown
    if config.ddp:
        # tear down together: a rank whose peer has already closed its gloo pairs can abort
        # (SIGABRT) inside destroy_process_group, failing a run that completed
        dist.barrier()
        dist.destroy_process_group()
    if rank == config.fail_rank and config.fail_step == config.steps:
        os.abort()  # fault injection: a crash in teardown, after the last step and the goodbye
    return 0


class OwnClock:
    """The trainer's own throughput, as a careful script measures itself (synchronize at the
    end of warmup and at the end, nothing in between): what bench/investigations/overhead_pairs.py compares
    between a plain torchrun run and the same run under ddptop."""

    def __init__(self, cuda: bool, warmup: int) -> None:
        self.cuda, self.warmup, self.t0 = cuda, warmup, None

    def _now(self) -> float:
        if self.cuda:
            torch.cuda.synchronize()
        return time.perf_counter()

    def at(self, step: int) -> None:
        if step == self.warmup:
            self.t0 = self._now()

    def result(self, last: int) -> str:
        if self.t0 is None or last < self.warmup:
            return "own clock: no steps after warmup"
        n = last - self.warmup + 1
        return f"own clock: {n / (self._now() - self.t0):.3f} steps/s over {n} steps after warmup"


if __name__ == "__main__":
    sys.exit(main())
