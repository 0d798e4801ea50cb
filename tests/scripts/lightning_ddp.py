"""A small Lightning training script using the DDP strategy.

Run with:  torchrun --standalone --nproc-per-node 2 lightning_ddp.py --steps 20
(Lightning sees the torchelastic environment and uses the processes torchrun started.)
"""

import argparse
import os
import time

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.dataloader import default_collate

try:
    import lightning.pytorch as L
except ImportError:
    import pytorch_lightning as L


class LitMLP(L.LightningModule):
    def __init__(self, d_in=128, d_hidden=256, classes=10, lr=0.05):
        super().__init__()
        self.save_hyperparameters()
        self.net = nn.Sequential(
            nn.Linear(d_in, d_hidden),
            nn.ReLU(),
            nn.Linear(d_hidden, d_hidden),
            nn.ReLU(),
            nn.Linear(d_hidden, classes),
        )

    def forward(self, x):
        return self.net(x)

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = F.cross_entropy(self(x), y)
        self.log("train_loss", loss, prog_bar=False)
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.hparams.lr, momentum=0.9)


class SlowCollate:
    """Collates a batch, sleeping `delay_s` first: a slow input pipeline on one rank."""

    def __init__(self, delay_s):
        self.delay_s = delay_s

    def __call__(self, batch):
        if self.delay_s > 0:
            time.sleep(self.delay_s)
        return default_collate(batch)


def make_loader(batch_size, n=4096, d_in=128, classes=10, delay_s=0.0):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, d_in, generator=g)
    y = torch.randint(0, classes, (n,), generator=g)
    # Lightning re-creates the loader with a DistributedSampler and keeps the collate_fn
    return DataLoader(TensorDataset(x, y), batch_size=batch_size, shuffle=True, num_workers=0,
                      collate_fn=SlowCollate(delay_s))


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=20, help="max_steps for the Trainer")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--slow-rank", type=int, default=-1,
                        help="this rank's data loader is slow (-1: none)")
    parser.add_argument("--slow-ms", type=float, default=0.0,
                        help="extra milliseconds per batch in the slow rank's data loader")
    args = parser.parse_args()
    # torchrun's RANK: the Trainer's global_rank is not known before fit()
    slow = int(os.environ.get("RANK", "0")) == args.slow_rank

    L.seed_everything(42, verbose=False)
    model = LitMLP()
    trainer = L.Trainer(
        strategy="ddp",
        accelerator="gpu" if torch.cuda.is_available() else "cpu",
        devices=int(os.environ.get("LOCAL_WORLD_SIZE", "2")),
        max_steps=args.steps,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(model, train_dataloaders=make_loader(args.batch_size, delay_s=args.slow_ms / 1000.0 if slow else 0.0))

    print(f"optimizer steps: {trainer.global_step}", flush=True)


if __name__ == "__main__":
    main()
