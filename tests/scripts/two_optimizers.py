"""DDP with two optimizers over disjoint parameter groups (an encoder and a head).

One forward/backward per iteration, then both optimizers step; the encoder's learning rate
follows a StepLR schedule.

Run with:  torchrun --standalone --nproc-per-node 2 two_optimizers.py --steps 30
"""

import argparse
import os
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP


class Encoder(nn.Module):
    def __init__(self, d_in=128, d_hidden=384, d_out=128):
        super().__init__()
        self.fc1 = nn.Linear(d_in, d_hidden)
        self.fc2 = nn.Linear(d_hidden, d_out)
        self.norm = nn.LayerNorm(d_out)

    def forward(self, x):
        return self.norm(self.fc2(F.gelu(self.fc1(x))))


class Classifier(nn.Module):
    def __init__(self, d=128, classes=16):
        super().__init__()
        self.encoder = Encoder(d_in=d, d_out=d)
        self.head = nn.Sequential(nn.Linear(d, d), nn.ReLU(), nn.Linear(d, classes))

    def forward(self, x):
        return self.head(self.encoder(x))


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=30, help="training iterations")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--lr-encoder", type=float, default=0.05)
    parser.add_argument("--lr-head", type=float, default=1e-3)
    parser.add_argument("--step-size", type=int, default=10, help="StepLR period (iterations)")
    parser.add_argument("--slow-rank", type=int, default=-1,
                        help="this rank's input pipeline is slow (-1: none)")
    parser.add_argument("--slow-ms", type=float, default=0.0,
                        help="extra milliseconds per batch in the slow rank's input pipeline")
    args = parser.parse_args()

    dist.init_process_group(backend="nccl" if torch.cuda.is_available() else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    if torch.cuda.is_available():
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
    else:
        device = torch.device("cpu")

    torch.manual_seed(0)
    net = Classifier().to(device)
    model = DDP(net, device_ids=[local_rank] if device.type == "cuda" else None)

    # two optimizers over disjoint parameter groups of the one DDP module
    opt_enc = torch.optim.SGD(model.module.encoder.parameters(), lr=args.lr_encoder, momentum=0.9)
    opt_head = torch.optim.Adam(model.module.head.parameters(), lr=args.lr_head)
    sched = torch.optim.lr_scheduler.StepLR(opt_enc, step_size=args.step_size, gamma=0.5)

    gen = torch.Generator(device="cpu").manual_seed(100 + rank)
    proto = torch.randn(16, 128, generator=torch.Generator().manual_seed(7))
    delay_s = args.slow_ms / 1000.0 if rank == args.slow_rank else 0.0

    def next_batch():
        """The input pipeline: a synthetic batch (slow on the --slow-rank)."""
        if delay_s > 0:
            time.sleep(delay_s)
        y = torch.randint(0, 16, (args.batch_size,), generator=gen)
        x = proto[y] + 0.5 * torch.randn(args.batch_size, 128, generator=gen)
        return x.to(device), y.to(device)

    opt_steps = 0
    for it in range(args.steps):
        x, y = next_batch()

        opt_enc.zero_grad(set_to_none=True)
        opt_head.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt_enc.step()
        opt_head.step()
        sched.step()
        opt_steps += 2

        if rank == 0 and (it + 1) % 10 == 0:
            print(f"iter {it + 1}: loss {loss.item():.4f} lr_enc {sched.get_last_lr()[0]:.4g}",
                  flush=True)

    print(f"iterations: {args.steps}", flush=True)
    print(f"optimizer steps: {opt_steps} ({world} ranks, 2 optimizers)", flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
