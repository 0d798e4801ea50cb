"""Data-parallel training without DistributedDataParallel: gradients averaged by hand with
torch.distributed.all_reduce (as some older or hand-rolled scripts do), or the model
wrapped in FSDP (--fsdp; runs on the CPU with gloo).

Run with:  torchrun --standalone --nproc-per-node 2 allreduce_no_ddp.py --steps 30
"""

import argparse

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=30, help="optimizer steps to run")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--fsdp", action="store_true", help="wrap the model in FSDP instead")
    args = parser.parse_args()

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 8))
    if args.fsdp:
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

        model = FSDP(model, device_id=torch.device("cpu"))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    gen = torch.Generator().manual_seed(100 + rank)

    for _ in range(args.steps):
        x = torch.randn(args.batch_size, 64, generator=gen)
        y = torch.randint(0, 8, (args.batch_size,), generator=gen)
        optimizer.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        if not args.fsdp:  # average the gradients across ranks by hand
            for p in model.parameters():
                dist.all_reduce(p.grad)
                p.grad /= world
        optimizer.step()

    print(f"optimizer steps: {args.steps}", flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
