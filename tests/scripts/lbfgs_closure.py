"""LBFGS with a closure: each optimizer step calls the closure (a forward and a backward)
several times on the same batch of --batch samples.

Run with:  torchrun --standalone --nproc-per-node 2 lbfgs_closure.py [--steps N] [--batch B]
"""

import argparse

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=15)
    parser.add_argument("--batch", type=int, default=24)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    torch.manual_seed(dist.get_rank())
    model = DDP(nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1)))
    optimizer = torch.optim.LBFGS(model.parameters(), lr=0.1, max_iter=4)
    calls = 0
    for _ in range(args.steps):
        x, y = torch.randn(args.batch, 8), torch.randn(args.batch, 1)

        def closure(x=x, y=y):
            nonlocal calls
            calls += 1
            optimizer.zero_grad()
            loss = (model(x) - y).pow(2).mean()
            loss.backward()
            return loss

        optimizer.step(closure)
    print(f"rank {dist.get_rank()}: {args.steps} steps of {args.batch} samples, {calls} closure calls", flush=True)
    dist.barrier()  # leave together: gloo can abort in teardown when a peer is already gone
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
