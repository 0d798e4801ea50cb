"""Composable replicate(): DDP without the DistributedDataParallel class
(torch.distributed._composable.replicate), a plain loop over it.

Run with:  torchrun --standalone --nproc-per-node 2 replicate_composable.py [--steps N] [--batch B]
"""

import argparse

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed._composable import replicate


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(64, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 8))

    def forward(self, x):
        return self.body(x)


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--batch", type=int, default=32)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = replicate(Net())
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for _ in range(args.steps):
        x = torch.randn(args.batch, 64)
        optimizer.zero_grad()
        model(x).pow(2).mean().backward()
        optimizer.step()
    print(f"rank {dist.get_rank()}: {args.steps} steps of {args.batch} samples", flush=True)
    dist.barrier()  # leave together: gloo can abort in teardown when a peer is already gone
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
