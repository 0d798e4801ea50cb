"""A DDP loop whose `except KeyboardInterrupt:` writes its checkpoint slowly (to a .partial
file, renamed once whole), as a large model's save on a slow disk does.

Run with:  torchrun --standalone --nproc-per-node 2 slow_save.py --ckpt-dir DIR [--save-s S]
           [--validate-s S] [--no-optim]

--validate-s S: after 20 steps, a validation pass of S seconds (forwards, no optimizer step),
  where a Ctrl-C is expected to land.
--no-optim: hand-written updates, no torch.optim.
"""

import argparse
import os
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

CHUNKS = 20


def save_slowly(path, state, seconds):
    """torch.save to `path`.partial in CHUNKS writes spread over `seconds`, then renamed."""
    import io

    buf = io.BytesIO()
    torch.save(state, buf)
    data = buf.getvalue()
    step = -(-len(data) // CHUNKS)
    with open(path + ".partial", "wb") as f:
        for i in range(0, len(data), step):
            f.write(data[i:i + step])
            f.flush()
            time.sleep(seconds / CHUNKS)
    os.replace(path + ".partial", path)


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--ckpt-dir", required=True)
    parser.add_argument("--save-s", type=float, default=12.0)
    parser.add_argument("--validate-s", type=float, default=0.0)
    parser.add_argument("--no-optim", action="store_true")
    args = parser.parse_args()

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DDP(nn.Sequential(nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 4)))
    optimizer = None if args.no_optim else torch.optim.SGD(model.parameters(), lr=0.01)
    done = 0
    try:
        while True:
            model(torch.randn(8, 64)).pow(2).mean().backward()
            if optimizer is not None:
                optimizer.step()
                optimizer.zero_grad()
            else:
                with torch.no_grad():
                    for p in model.parameters():
                        p -= 0.01 * p.grad
                        p.grad = None
            done += 1
            if done == 20:
                print(f"rank {rank}: training", flush=True)
                if args.validate_s:
                    print(f"rank {rank}: validating", flush=True)
                    ends = time.monotonic() + args.validate_s
                    with torch.no_grad():
                        while time.monotonic() < ends:
                            model(torch.randn(8, 64))
                            time.sleep(0.01)
            time.sleep(0.02)
    except KeyboardInterrupt:
        print(f"rank {rank}: saving after {done} steps", flush=True)
        path = os.path.join(args.ckpt_dir, f"rank{rank}.pt")
        save_slowly(path, {"steps": done, "model": model.module.state_dict()}, args.save_s)
        print(f"rank {rank}: saved", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
