"""Teacher/student distillation under DDP with both models trained at different rates: each
batch the frozen-for-now teacher gives soft targets (no grad), the student steps; every
--teacher-every batches the teacher itself steps on the same batch. --batch samples a step.

Run with:  torchrun --standalone --nproc-per-node 2 teacher_student.py [--steps N] [--batch B]
"""

import argparse

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--teacher-every", type=int, default=4)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(args.steps * args.batch * 2, 32), torch.randint(0, 10, (args.steps * args.batch * 2,)))
    loader = DataLoader(data, batch_size=args.batch, sampler=DistributedSampler(data), drop_last=True)
    teacher = DDP(nn.Sequential(nn.Linear(32, 128), nn.ReLU(), nn.Linear(128, 10)))
    student = DDP(nn.Sequential(nn.Linear(32, 16), nn.ReLU(), nn.Linear(16, 10)))
    opt_t = torch.optim.SGD(teacher.parameters(), lr=0.01)
    opt_s = torch.optim.Adam(student.parameters(), lr=1e-3)
    for i, (x, y) in enumerate(loader):
        if i % args.teacher_every == 0:
            opt_t.zero_grad()
            F.cross_entropy(teacher(x), y).backward()
            opt_t.step()
        with torch.no_grad():
            soft = F.softmax(teacher(x) / 2.0, dim=-1)
        opt_s.zero_grad()
        logits = student(x)
        loss = F.kl_div(F.log_softmax(logits / 2.0, dim=-1), soft, reduction="batchmean") + F.cross_entropy(logits, y)
        loss.backward()
        opt_s.step()
    print(f"rank {dist.get_rank()}: {len(loader)} student steps of {args.batch} samples", flush=True)
    dist.barrier()  # leave together: gloo can abort in teardown when a peer is already gone
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
