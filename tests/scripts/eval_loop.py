"""DDP training with a validation pass under torch.no_grad() every few steps, through the
same DDP model (model.eval(); with torch.no_grad(): model(x)).

Run with:  torchrun --standalone --nproc-per-node 2 eval_loop.py [--steps N] [--every K]
"""

import argparse
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 4))

    def forward(self, x):
        if not self.training:
            time.sleep(0.005)  # a validation forward that costs something
        return self.body(x)


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--every", type=int, default=10, help="validate after every K steps")
    parser.add_argument("--val-batches", type=int, default=8)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DDP(Net())
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for step in range(args.steps):
        model(torch.randn(16, 32)).pow(2).mean().backward()
        optimizer.step()
        optimizer.zero_grad()
        if (step + 1) % args.every == 0:
            model.eval()
            with torch.no_grad():
                for _ in range(args.val_batches):
                    model(torch.randn(16, 32)).pow(2).mean()
            model.train()
            print(f"rank {rank}: validated after {step + 1} steps ({args.val_batches} batches)", flush=True)
    print(f"rank {rank}: {args.steps} steps", flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
