"""A sequence model fed time-major batches: a DataLoader with batch_size B whose collate_fn
builds a dict with x of shape [T, B, F] (a GRU without batch_first). B samples a step.

Run with:  torchrun --standalone --nproc-per-node 2 time_major.py [--steps N] [--batch B] [--time T]
"""

import argparse

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset


class Seq(nn.Module):
    def __init__(self):
        super().__init__()
        self.rnn = nn.GRU(4, 8)
        self.head = nn.Linear(8, 1)

    def forward(self, x):
        out, _ = self.rnn(x)
        return self.head(out[-1])


def collate(items):
    xs = torch.stack([x for x, _ in items], dim=1)  # [T, B, F]
    return {"x": xs, "y": torch.stack([y for _, y in items])}


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--time", type=int, default=24)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    torch.manual_seed(dist.get_rank())
    data = TensorDataset(torch.randn(args.steps * args.batch, args.time, 4), torch.randn(args.steps * args.batch, 1))
    loader = DataLoader(data, batch_size=args.batch, collate_fn=collate, drop_last=True)
    model = DDP(Seq())
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    steps = 0
    for batch in loader:
        optimizer.zero_grad()
        (model(batch["x"]) - batch["y"]).pow(2).mean().backward()
        optimizer.step()
        steps += 1
    print(f"rank {dist.get_rank()}: {steps} steps of {args.batch} samples ([T={args.time}, B={args.batch}])",
          flush=True)
    dist.barrier()  # leave together: gloo can abort in teardown when a peer is already gone
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
