"""DDP with gradient accumulation (no_sync on all but the last micro-batch) and AMP's GradScaler.

Run with:  torchrun --standalone --nproc-per-node 2 accum_ddp.py --steps 30 --accum 4
"""

import argparse
import contextlib
import os
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.optim as optim
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.dataloader import default_collate
from torch.utils.data.distributed import DistributedSampler


class ToyModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(256, 512),
            nn.ReLU(),
            nn.Linear(512, 512),
            nn.ReLU(),
            nn.Linear(512, 10),
        )

    def forward(self, x):
        return self.net(x)


class RandomDataset(Dataset):
    def __init__(self, size=8192, features=256, classes=10, seed=0):
        g = torch.Generator().manual_seed(seed)
        self.x = torch.randn(size, features, generator=g)
        self.y = torch.randint(0, classes, (size,), generator=g)

    def __len__(self):
        return len(self.x)

    def __getitem__(self, idx):
        return self.x[idx], self.y[idx]


def make_collate(delay_s):
    def collate(batch):
        if delay_s > 0:
            time.sleep(delay_s)  # a slow input pipeline on this rank
        return default_collate(batch)

    return collate


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=30, help="optimizer steps to run")
    parser.add_argument("--accum", type=int, default=4, help="micro-batches per optimizer step")
    parser.add_argument("--batch-size", type=int, default=32, help="per-rank micro-batch size")
    parser.add_argument("--lr", type=float, default=0.01)
    parser.add_argument("--slow-rank", type=int, default=-1,
                        help="this rank's data loader is slow (-1: none)")
    parser.add_argument("--slow-ms", type=float, default=0.0,
                        help="extra milliseconds per micro-batch in the slow rank's data loader")
    args = parser.parse_args()

    use_cuda = torch.cuda.is_available()
    dist.init_process_group("nccl" if use_cuda else "gloo")
    rank = dist.get_rank()
    local_rank = int(os.environ["LOCAL_RANK"])
    if use_cuda:
        torch.cuda.set_device(local_rank)
        device = torch.device(f"cuda:{local_rank}")
    else:
        device = torch.device("cpu")

    torch.manual_seed(1234)
    model = DDP(ToyModel().to(device), device_ids=[local_rank] if use_cuda else None)

    dataset = RandomDataset()
    sampler = DistributedSampler(dataset)
    delay_s = args.slow_ms / 1000.0 if rank == args.slow_rank else 0.0
    loader = DataLoader(dataset, batch_size=args.batch_size, sampler=sampler, num_workers=0,
                        collate_fn=make_collate(delay_s), drop_last=True)

    criterion = nn.CrossEntropyLoss()
    opt = optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    # fp16 autocast + loss scaling on GPU; on CPU the scaler runs in fp32 (it still
    # unscales, checks for infs and steps the optimizer)
    scaler = torch.amp.GradScaler("cuda" if use_cuda else "cpu")
    amp_dtype = torch.float16 if use_cuda else torch.bfloat16

    # count the optimizer steps actually taken (GradScaler skips a step on inf/nan grads)
    taken = 0

    def count_step(optimizer, args_, kwargs_):
        nonlocal taken
        taken += 1

    opt.register_step_post_hook(count_step)

    step = 0
    micro = 0
    epoch = 0
    opt.zero_grad()
    while step < args.steps:
        sampler.set_epoch(epoch)
        for x, y in loader:
            x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
            last = micro == args.accum - 1
            sync_ctx = contextlib.nullcontext() if last else model.no_sync()
            with sync_ctx:
                with torch.autocast(device.type, dtype=amp_dtype, enabled=use_cuda):
                    out = model(x)
                    loss = criterion(out, y) / args.accum
                scaler.scale(loss).backward()
            micro += 1
            if last:
                scaler.step(opt)
                scaler.update()
                opt.zero_grad()
                micro = 0
                step += 1
                if step >= args.steps:
                    break
        epoch += 1

    if rank == 0:
        print(f"final loss: {loss.item() * args.accum:.4f}  scale: {scaler.get_scale():.0f}",
              flush=True)
    print(f"optimizer steps: {taken}", flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
