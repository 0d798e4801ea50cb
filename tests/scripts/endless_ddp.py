"""A DDP training loop with no step limit of its own: it trains until it is stopped.

Run with:  torchrun --standalone --nproc-per-node 2 endless_ddp.py [--own-hook] [--find-unused] [--changing-graph]
                                                                  [--tokens N]

--own-hook registers the script's own gradient-averaging comm hook; --find-unused builds DDP
with find_unused_parameters=True; --changing-graph skips one layer on odd iterations; --tokens N
reports N tokens per sample through ddptop's optional probe (the only flag that mentions ddptop).
"""

import argparse
import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.inp = nn.Linear(64, 128)
        self.mid = nn.Linear(128, 128)
        self.out = nn.Linear(128, 10)

    def forward(self, x, skip_mid=False):
        h = torch.relu(self.inp(x))
        if not skip_mid:
            h = torch.relu(self.mid(h))
        return self.out(h)


def averaged_allreduce(process_group, bucket):
    """The script's own hook: a plain all-reduce, averaged on this side."""
    group = process_group if process_group is not None else dist.group.WORLD
    tensor = bucket.buffer().div_(dist.get_world_size(group))
    fut = dist.all_reduce(tensor, group=group, async_op=True).get_future()
    return fut.then(lambda f: f.value()[0])


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--own-hook", action="store_true", help="register our own comm hook")
    parser.add_argument("--find-unused", action="store_true", help="find_unused_parameters=True")
    parser.add_argument("--changing-graph", action="store_true", help="skip a layer on odd iterations")
    parser.add_argument("--tokens", type=int, default=0, help="report this many tokens per sample to ddptop")
    args = parser.parse_args()
    probe = None
    if args.tokens:
        from ddptop.probe import Probe

        probe = Probe.connect()

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DDP(Net(), find_unused_parameters=args.find_unused or args.changing_graph)
    if args.own_hook:
        model.register_comm_hook(None, averaged_allreduce)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    loss_fn = nn.CrossEntropyLoss()
    gen = torch.Generator().manual_seed(rank)
    it = 0
    while True:
        x = torch.randn(args.batch_size, 64, generator=gen)
        y = torch.randint(0, 10, (args.batch_size,), generator=gen)
        optimizer.zero_grad()
        loss = loss_fn(model(x, skip_mid=args.changing_graph and it % 2 == 1), y)
        loss.backward()
        optimizer.step()
        it += 1
        if probe is not None and probe.tick(tokens=args.tokens * args.batch_size):
            break  # ddptop asks the run to stop
        if it % 50 == 0 and rank == 0:
            print(f"iteration {it}: loss {loss.item():.4f}", flush=True)
        if os.environ.get("ENDLESS_MAX_ITERS") and it >= int(os.environ["ENDLESS_MAX_ITERS"]):
            break  # a safety net when run by hand
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
