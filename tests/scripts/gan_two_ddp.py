"""A GAN-style loop: two DDP models (generator, discriminator), two optimizers; the
discriminator runs three times a step, the generator once. A batch of --batch samples a step.

Run with:  torchrun --standalone --nproc-per-node 2 gan_two_ddp.py [--steps N] [--batch B]
"""

import argparse

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--batch", type=int, default=32)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    torch.manual_seed(dist.get_rank())
    gen = DDP(nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 16)))
    disc = DDP(nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1)))
    opt_g = torch.optim.Adam(gen.parameters(), lr=1e-3)
    opt_d = torch.optim.Adam(disc.parameters(), lr=1e-3)
    bce = nn.BCEWithLogitsLoss()
    ones, zeros = torch.ones(args.batch, 1), torch.zeros(args.batch, 1)
    for _ in range(args.steps):
        real = torch.randn(args.batch, 16)
        fake = gen(torch.randn(args.batch, 8))
        opt_d.zero_grad()
        (bce(disc(real), ones) + bce(disc(fake.detach()), zeros)).backward()
        opt_d.step()
        opt_g.zero_grad()
        bce(disc(fake), ones).backward()
        opt_g.step()
    print(f"rank {dist.get_rank()}: {args.steps} steps of {args.batch} samples", flush=True)
    dist.barrier()  # leave together: gloo can abort in teardown when a peer is already gone
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
