"""A WGAN loop (Arjovsky et al.'s reference code) under DDP: n_critic=5 critic steps, each on
a real batch of --batch from the DataLoader and a fake batch made without grad, then one
generator step. --batch real samples per critic step.

Run with:  torchrun --standalone --nproc-per-node 2 wgan.py [--iters N] [--batch B]
"""

import argparse

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

NZ, N_CRITIC, CLAMP = 8, 5, 0.01


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--iters", type=int, default=12, help="generator iterations")
    parser.add_argument("--batch", type=int, default=16)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(args.iters * N_CRITIC * args.batch * 2, 32))
    dataloader = DataLoader(data, batch_size=args.batch, sampler=DistributedSampler(data), drop_last=True)
    netG = DDP(nn.Sequential(nn.Linear(NZ, 64), nn.ReLU(), nn.Linear(64, 32)))
    netD = DDP(nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 1)))
    optimizerD = torch.optim.RMSprop(netD.parameters(), lr=5e-5)
    optimizerG = torch.optim.RMSprop(netG.parameters(), lr=5e-5)
    data_iter = iter(dataloader)
    critic_steps = 0
    for _ in range(args.iters):
        for p in netD.parameters():
            p.requires_grad = True
        for _ in range(N_CRITIC):
            for p in netD.parameters():
                p.data.clamp_(-CLAMP, CLAMP)
            (real,) = next(data_iter)
            netD.zero_grad()
            errD_real = netD(real).mean()
            with torch.no_grad():
                fake = netG(torch.randn(args.batch, NZ))
            errD_fake = netD(fake).mean()
            (errD_fake - errD_real).backward()
            optimizerD.step()
            critic_steps += 1
        for p in netD.parameters():
            p.requires_grad = False
        netG.zero_grad()
        errG = -netD(netG(torch.randn(args.batch, NZ))).mean()
        errG.backward()
        optimizerG.step()
    print(f"rank {dist.get_rank()}: {args.iters} generator iterations, {critic_steps} critic steps of "
          f"{args.batch} real samples", flush=True)
    dist.barrier()  # leave together: gloo can abort in teardown when a peer is already gone
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
