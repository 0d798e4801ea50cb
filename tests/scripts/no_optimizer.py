"""DDP with a hand-written SGD update and no torch.optim optimizer.

Run with:  torchrun --standalone --nproc-per-node 2 no_optimizer.py [--steps N] [--update data]
--update data writes through `p.data.add_`, the older idiom (it leaves p._version as it was).
"""

import argparse

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=80)
    parser.add_argument("--update", choices=["inplace", "data"], default="inplace")
    args = parser.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DDP(nn.Sequential(nn.Linear(32, 32), nn.Tanh(), nn.Linear(32, 1)))
    for _ in range(args.steps):
        model(torch.randn(16, 32)).pow(2).mean().backward()
        with torch.no_grad():
            for p in model.parameters():
                if args.update == "data":
                    p.data.add_(p.grad, alpha=-0.01)
                else:
                    p -= 0.01 * p.grad
                p.grad = None
    print(f"rank {rank}: {args.steps} hand-written updates", flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
