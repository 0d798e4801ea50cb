"""A torchrun rank that trains inside torch.multiprocessing.spawn children (the shape of scripts
written for mp.spawn, launched with torchrun anyway): the rank itself takes no step.

Run with:  torchrun --standalone --nproc-per-node 2 spawn_children.py [--steps 20]
"""

import argparse
import os

import torch
import torch.multiprocessing as mp
import torch.nn as nn


def train(index, steps, seed):
    torch.manual_seed(seed + index)
    model = nn.Linear(16, 4)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(steps):
        loss = model(torch.randn(8, 16)).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=20)
    args = p.parse_args()
    mp.spawn(train, args=(args.steps, int(os.environ.get("RANK", "0"))), nprocs=1)
    print(f"rank {os.environ.get('RANK')} done", flush=True)


if __name__ == "__main__":
    main()
