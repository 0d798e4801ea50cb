"""The DCGAN loop of pytorch/examples (dcgan/main.py) under DDP: D steps on a real batch and
on G's fake batch (detached), then G steps through D. A real batch of --batch a step.

Run with:  torchrun --standalone --nproc-per-node 2 dcgan.py [--steps N] [--batch B]
"""

import argparse

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

NZ = 16


def generator():
    return nn.Sequential(nn.ConvTranspose2d(NZ, 16, 4, 1, 0, bias=False), nn.BatchNorm2d(16), nn.ReLU(True),
                         nn.ConvTranspose2d(16, 1, 4, 2, 1, bias=False), nn.Tanh())  # 1x8x8


def discriminator():
    return nn.Sequential(nn.Conv2d(1, 16, 4, 2, 1, bias=False), nn.LeakyReLU(0.2, inplace=True),
                         nn.Conv2d(16, 1, 4, 1, 0, bias=False), nn.Sigmoid(), nn.Flatten(0))


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--batch", type=int, default=16)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(args.steps * args.batch * 2, 1, 8, 8))
    dataloader = DataLoader(data, batch_size=args.batch, sampler=DistributedSampler(data), drop_last=True)
    netG, netD = DDP(generator()), DDP(discriminator())
    criterion = nn.BCELoss()
    optimizerD = torch.optim.Adam(netD.parameters(), lr=2e-4, betas=(0.5, 0.999))
    optimizerG = torch.optim.Adam(netG.parameters(), lr=2e-4, betas=(0.5, 0.999))
    real_label, fake_label = 1.0, 0.0
    iters = 0
    for i, data in enumerate(dataloader, 0):  # noqa: B007 - the example's own loop
        # (1) Update D network: maximize log(D(x)) + log(1 - D(G(z)))
        netD.zero_grad()
        real_cpu = data[0]
        batch_size = real_cpu.size(0)
        label = torch.full((batch_size,), real_label, dtype=real_cpu.dtype)
        output = netD(real_cpu).view(-1)
        errD_real = criterion(output, label)
        errD_real.backward()
        noise = torch.randn(batch_size, NZ, 1, 1)
        fake = netG(noise)
        label.fill_(fake_label)
        output = netD(fake.detach()).view(-1)
        errD_fake = criterion(output, label)
        errD_fake.backward()
        optimizerD.step()
        # (2) Update G network: maximize log(D(G(z)))
        netG.zero_grad()
        label.fill_(real_label)
        output = netD(fake).view(-1)
        errG = criterion(output, label)
        errG.backward()
        optimizerG.step()
        iters += 1
    print(f"rank {dist.get_rank()}: {iters} iterations of {args.batch} real samples", flush=True)
    dist.barrier()  # leave together: gloo can abort in teardown when a peer is already gone
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
