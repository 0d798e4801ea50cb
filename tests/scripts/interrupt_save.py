"""A DDP loop that saves a checkpoint when interrupted (Ctrl-C), as many real scripts do.

Run with:  torchrun --standalone --nproc-per-node 2 interrupt_save.py --ckpt-dir DIR [--mode except|handler]

--mode except: `except KeyboardInterrupt:` around the loop saves, then the script ends cleanly.
--mode handler: its own SIGINT handler sets a flag; the ranks agree on it each step (an
all-reduce), save and end together.
"""

import argparse
import os
import signal
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--ckpt-dir", required=True)
    parser.add_argument("--mode", choices=["except", "handler"], default="except")
    parser.add_argument("--steps", type=int, default=100000)
    parser.add_argument("--sleep-ms", type=float, default=20.0, help="pause per step (interruptible)")
    args = parser.parse_args()

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DDP(nn.Linear(16, 4))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    asked = torch.zeros(1)
    if args.mode == "handler":
        def on_sigint(signum, frame):  # noqa: ARG001
            asked.fill_(1.0)

        signal.signal(signal.SIGINT, on_sigint)

    done = 0

    def save(why):
        path = os.path.join(args.ckpt_dir, f"rank{rank}.pt")
        torch.save({"steps": done, "model": model.module.state_dict()}, path + ".tmp")
        os.replace(path + ".tmp", path)
        print(f"rank {rank}: saved a checkpoint ({why})", flush=True)

    try:
        while done < args.steps:
            if args.mode == "handler":
                stop = asked.clone()
                dist.all_reduce(stop, op=dist.ReduceOp.MAX)
                if stop.item():
                    save("SIGINT handler")
                    break
            x = torch.randn(8, 16)
            model(x).pow(2).mean().backward()
            optimizer.step()
            optimizer.zero_grad()
            done += 1
            if done == 10:
                print(f"rank {rank}: training", flush=True)
            time.sleep(args.sleep_ms / 1000.0)
    except KeyboardInterrupt:
        save("KeyboardInterrupt")
    print(f"rank {rank}: ends after {done} steps", flush=True)
    print(f"rank {rank}: a line of its own on stderr", file=sys.stderr, flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
