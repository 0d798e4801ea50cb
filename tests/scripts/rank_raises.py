"""A DDP loop in which one rank raises: its own error at step 5 (`--where step`), or its
Dataset's, through the DataLoader (`--where loader`; `--workers N` loads in worker processes).
Its peer then fails in its next all-reduce. For comparing each rank's stderr with plain
torchrun's.

Run with:  torchrun --standalone --nproc-per-node 2 rank_raises.py [--where step|loader] [--workers N]
"""

import argparse
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset

FAILS_AT = 5


class Numbers(Dataset):
    def __init__(self, fail_at):
        self.fail_at = fail_at

    def __len__(self):
        return 1000

    def __getitem__(self, i):
        if i == self.fail_at:
            raise ValueError(f"sample {i} is corrupt")
        return torch.full((16,), float(i))


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--where", choices=["step", "loader"], default="step")
    parser.add_argument("--workers", type=int, default=0)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DDP(nn.Linear(16, 4))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    fail_at = FAILS_AT * 8 if args.where == "loader" and rank == 1 else -1
    loader = DataLoader(Numbers(fail_at), batch_size=8, num_workers=args.workers)
    for step, x in enumerate(loader):
        if args.where == "step" and rank == 1 and step == FAILS_AT:
            time.sleep(2)  # its peer is waiting in the all-reduce by then
            raise RuntimeError(f"rank {rank} fails at step {step}")
        model(x).pow(2).mean().backward()
        optimizer.step()
        optimizer.zero_grad()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
