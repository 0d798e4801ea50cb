"""A plain single-process training loop: no torch.distributed anywhere.

Run with:  python single_process.py --steps 30
"""

import argparse

import torch
import torch.nn as nn


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=30, help="optimizer steps to run")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--lr", type=float, default=1e-3)
    args = parser.parse_args()

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Linear(64, 256),
        nn.ReLU(),
        nn.Linear(256, 256),
        nn.ReLU(),
        nn.Linear(256, 1),
    ).to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)
    loss_fn = nn.MSELoss()

    true_w = torch.randn(64, 1, device=device)
    steps = 0
    for step in range(args.steps):
        x = torch.randn(args.batch_size, 64, device=device)
        y = x @ true_w + 0.1 * torch.randn(args.batch_size, 1, device=device)
        optimizer.zero_grad()
        loss = loss_fn(model(x), y)
        loss.backward()
        optimizer.step()
        steps += 1
        if (step + 1) % 10 == 0:
            print(f"step {step + 1}: loss {loss.item():.4f}", flush=True)

    print(f"optimizer steps: {steps}", flush=True)


if __name__ == "__main__":
    main()
