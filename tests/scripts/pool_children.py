"""A DDP loop that hands work to a multiprocessing pool now and then: each worker trains a
small model of its own for a few steps (forwards, backward, torch.optim steps of its own).

Run with:  torchrun --standalone --nproc-per-node 2 pool_children.py [--pool fork|spawn]
"""

import argparse
import multiprocessing as mp

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 4))

    def forward(self, x):
        return self.body(x)


def side_job(seed):
    """A worker's own little training: none of it is the rank's."""
    torch.manual_seed(seed)
    model = nn.Linear(8, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(5):
        loss = model(torch.randn(4, 8)).pow(2).mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    return round(float(model.weight.sum()), 4)


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--pool", choices=["fork", "spawn"], default="fork")
    parser.add_argument("--steps", type=int, default=12)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    ctx = mp.get_context(args.pool)
    with ctx.Pool(2) as pool:
        # a side job before the model exists: a forked worker starts where the rank is now
        print(f"rank {rank} before training: side jobs gave {pool.map(side_job, [rank, rank + 10])}", flush=True)
        torch.manual_seed(0)
        model = DDP(Net())
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
        for step in range(args.steps):
            model(torch.randn(16, 32)).pow(2).mean().backward()
            optimizer.step()
            optimizer.zero_grad()
            if step in (2, 8):
                print(f"rank {rank} step {step}: side jobs gave {pool.map(side_job, [rank, rank + 10])}", flush=True)
    print(f"rank {rank}: {args.steps} steps", flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
