"""A DDP loop that ends with os._exit(0), as scripts do to skip slow interpreter teardown
(no atexit handlers, no destroy_process_group).

Run with:  torchrun --standalone --nproc-per-node 2 hard_exit.py [--steps N]
"""

import argparse
import os
import sys

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=200)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DDP(nn.Linear(32, 8))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for _ in range(args.steps):
        model(torch.randn(16, 32)).pow(2).mean().backward()
        optimizer.step()
        optimizer.zero_grad()
    dist.barrier()
    print(f"rank {rank}: {args.steps} steps, leaving with os._exit(0)", flush=True)
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
