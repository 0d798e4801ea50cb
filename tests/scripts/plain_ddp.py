"""Plain DistributedDataParallel training, in the style of PyTorch's DDP tutorial.

Run with:  torchrun --standalone --nproc-per-node 2 plain_ddp.py --steps 30
"""

import argparse
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
        self.net1 = nn.Linear(256, 512)
        self.relu = nn.ReLU()
        self.net2 = nn.Linear(512, 512)
        self.net3 = nn.Linear(512, 10)

    def forward(self, x):
        return self.net3(self.relu(self.net2(self.relu(self.net1(x)))))


class RandomDataset(Dataset):
    """A fixed synthetic classification set (the same on every rank)."""

    def __init__(self, size=4096, features=256, classes=10, seed=0):
        g = torch.Generator().manual_seed(seed)
        self.x = torch.randn(size, features, generator=g)
        self.y = torch.randint(0, classes, (size,), generator=g)

    def __len__(self):
        return len(self.x)

    def __getitem__(self, idx):
        return self.x[idx], self.y[idx]


class SlowCollate:
    """Collates a batch, sleeping `delay_s` first: a slow input pipeline on one rank."""

    def __init__(self, delay_s):
        self.delay_s = delay_s

    def __call__(self, batch):
        if self.delay_s > 0:
            time.sleep(self.delay_s)
        return default_collate(batch)


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=30, help="optimizer steps to run")
    parser.add_argument("--batch-size", type=int, default=32, help="per-rank batch size")
    parser.add_argument("--lr", type=float, default=0.01)
    parser.add_argument("--slow-rank", type=int, default=-1,
                        help="this rank's data loader is slow (-1: none)")
    parser.add_argument("--slow-ms", type=float, default=0.0,
                        help="extra milliseconds per batch in the slow rank's data loader")
    args = parser.parse_args()

    dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
    rank = dist.get_rank()
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if torch.cuda.is_available():
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
    else:
        device = torch.device("cpu")

    torch.manual_seed(0)
    model = ToyModel().to(device)
    ddp_model = DDP(model, device_ids=[local_rank] if device.type == "cuda" else None)

    dataset = RandomDataset()
    sampler = DistributedSampler(dataset, shuffle=True)
    delay_s = args.slow_ms / 1000.0 if rank == args.slow_rank else 0.0
    loader = DataLoader(dataset, batch_size=args.batch_size, sampler=sampler, num_workers=0,
                        collate_fn=SlowCollate(delay_s), drop_last=True)

    loss_fn = nn.CrossEntropyLoss()
    optimizer = optim.SGD(ddp_model.parameters(), lr=args.lr)

    steps = 0
    epoch = 0
    while steps < args.steps:
        sampler.set_epoch(epoch)
        for inputs, labels in loader:
            inputs, labels = inputs.to(device), labels.to(device)
            optimizer.zero_grad()
            outputs = ddp_model(inputs)
            loss = loss_fn(outputs, labels)
            loss.backward()
            optimizer.step()
            steps += 1
            if steps >= args.steps:
                break
        epoch += 1

    if rank == 0:
        print(f"final loss: {loss.item():.4f}", flush=True)
    print(f"optimizer steps: {steps}", flush=True)
    # leave together: gloo can abort in destroy_process_group when a peer is already gone
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
