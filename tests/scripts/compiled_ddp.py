"""torch.compile(DDP(model)): the compiler's graph breaks and compiled frames, printed by each
rank at the end (torch._dynamo.utils.counters), to compare with plain torchrun.

Run with:  torchrun --standalone --nproc-per-node 2 compiled_ddp.py [--steps N] [--backend B]
"""

import argparse

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--backend", default="aot_eager", help="torch.compile's backend")
    args = parser.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = torch.compile(DDP(nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 4))), backend=args.backend)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for _ in range(args.steps):
        model(torch.randn(16, 32)).pow(2).mean().backward()
        optimizer.step()
        optimizer.zero_grad()
    from torch._dynamo.utils import counters

    breaks = sum(counters["graph_break"].values())
    frames = dict(counters["frames"])
    print(f"rank {rank}: graph breaks {breaks}, frames {frames}, recompiles {sum(counters['recompiles'].values())}",
          flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
